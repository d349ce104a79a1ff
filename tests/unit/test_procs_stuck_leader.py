"""The test harness's wait (tests/procs.py): a command stuck after every process it started has exited
(mpirun in its own teardown after an MPI_Abort) is stopped with a note, while a command whose child still
runs is a hang that fails the test."""
import sys
import time

import pytest

import procs

# a leader that starts a child which exits at once and never reaps it (the child stays a zombie)
STUCK = "import subprocess, time; subprocess.Popen(['true']); print('started', flush=True); time.sleep(120)"
# a leader whose child goes on running
HUNG = "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"


def test_a_leader_stuck_after_its_children_exited_is_stopped_with_a_note(monkeypatch):
    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    start = time.time()
    result = procs.run([sys.executable, "-c", STUCK], timeout=60)
    assert time.time() - start < 20
    assert "started" in result.out and "every rank had exited" in result.out, result
    assert result.returncode != 0


def test_a_child_still_running_is_a_hang(monkeypatch):
    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    with pytest.raises(pytest.fail.Exception, match="timed out after 6 s"):
        procs.run([sys.executable, "-c", HUNG], timeout=6)

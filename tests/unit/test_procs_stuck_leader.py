"""The test harness's wait (tests/procs.py): a command stuck after every process it started has exited
(mpirun in its own teardown after an MPI_Abort) is stopped with a note, while a command whose child still
runs is a hang that fails the test. The stopped command's status is what mpirun reports for its ranks,
read from the zombies before anything is killed: the first non-zero exit code, else a signal's 128 + N."""
import sys
import time

import pytest

import procs

# a leader that starts children which exit at once and never reaps them (they stay zombies): one
# ended by SIGTERM, one with exit code 3 (mpirun's ranks after an MPI_Abort(3): killed, and the aborting one)
# (each Popen kept: a dropped one is reaped by the next Popen)
STUCK = ("import subprocess, time; a = subprocess.Popen(['sh', '-c', 'kill -TERM $$']); time.sleep(0.5); "
         "b = subprocess.Popen(['sh', '-c', 'exit 3']); print('started', flush=True); time.sleep(120)")
# every child exits 0 (a job that finished, with mpirun stuck in its teardown)
STUCK_AFTER_SUCCESS = ("import subprocess, time; kept = [subprocess.Popen(['true']) for _ in range(2)]; "
                       "time.sleep(120)")
# a leader whose child goes on running
HUNG = "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"


def test_a_leader_stuck_after_its_children_exited_is_stopped_with_a_note(monkeypatch):
    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    start = time.time()
    result = procs.run([sys.executable, "-c", STUCK], timeout=60)
    assert time.time() - start < 20
    assert "started" in result.out and "every rank had exited" in result.out, result
    assert result.returncode == 3, result


def test_the_status_of_a_stuck_leader_whose_children_all_succeeded_is_0(monkeypatch):
    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    result = procs.run([sys.executable, "-c", STUCK_AFTER_SUCCESS], timeout=60)
    assert "every rank had exited" in result.out and result.returncode == 0, result


def test_a_child_still_running_is_a_hang(monkeypatch):
    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    with pytest.raises(pytest.fail.Exception, match="timed out after 6 s"):
        procs.run([sys.executable, "-c", HUNG], timeout=6)


def test_the_fault_matrix_stops_a_stuck_mpirun_and_records_the_ranks(monkeypatch):
    """benchmarks/faults/faults.py runs its cells with its own wait (a hang there is a result, not a
    failed test): an mpirun stuck after its ranks exited is stopped there too, the cell's status is the
    ranks', and the cell records that it was stopped."""
    import os

    sys.path.insert(0, os.path.join(procs.ROOT, "benchmarks", "faults"))
    import faults
    from hvd_async.job import launcher

    monkeypatch.setattr(procs, "STUCK_AFTER_RANKS_SECONDS", 2.0)
    monkeypatch.setattr(launcher, "mpirun_command", lambda np, program, **kw: [sys.executable, "-c", STUCK])
    out, status, end, start, left, alive, stuck = faults._run_job("job.py", {}, 3, True, 60, "")
    assert end - start < 20 and "started" in out
    assert status == 3 and sorted(stuck) == [3, 143] and not left and not alive

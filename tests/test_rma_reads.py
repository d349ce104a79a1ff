"""Reads of windows that other workers accumulate into (tests/mpi/rma_read_checks.py) under mpirun at
3 and 4 ranks (1 server), shared memory on and off: on one node asgd's pull/pull_async and gossip's get
are plain ``Get``s (see hvd_async/transport/window/__init__.py for why) and must never read a partial
element; every value they read is a whole number of pushes of 1/3 (a value whose float32 sums change
every bit of the mantissa), and the meta counters are read with accumulate-family calls. With
``HVD_ASYNC_ATOMIC_READS=always`` the same reads are ``Get_accumulate``s, as they are by default across
nodes (tests/test_netns.py)."""
import re

import pytest

from procs import mpirun, python

MODES = {"shm": False, "no-shm": True}
ENV = {"SERVERS": "1", "VALUE": repr(1 / 3)}


@pytest.mark.parametrize("np,mode,reads", [(3, "shm", "auto"), (3, "no-shm", "auto"), (4, "shm", "auto"),
                                           (4, "no-shm", "auto"), (4, "shm", "always"), (3, "no-shm", "always")])
def test_reads_beside_concurrent_accumulates(np, mode, reads):
    env = dict(ENV, HVD_ASYNC_ATOMIC_READS=reads)
    result = mpirun(np, python("tests/mpi/rma_read_checks.py"), no_shm=MODES[mode], env=env, timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert "RMA READ CHECKS OK weights_pull gossip_get" in result.out, result.out[-3000:]
    atomic = "[]" if reads == "auto" else "[0, 1%s]" % "".join(f", {r}" for r in range(2, np))  # one node
    pulled = re.search(r"WEIGHTS PULL reads=\d+ mixed=\d+ workers=%d pushes=\d+ atomic=(\[[\d, ]*\])" % (np - 1),
                       result.out)
    assert pulled and pulled.group(1) == atomic, result.out[-3000:]
    if np - 1 >= 3:  # a reader, a target and at least one pusher
        assert re.search(r"GOSSIP GET reads=\d+ .*atomic=%s" % re.escape("[]" if reads == "auto" else "[0, 1, 2]"),
                         result.out), result.out[-3000:]
    else:
        assert "GOSSIP GET SKIPPED" in result.out


def test_a_bad_atomic_reads_setting_is_refused_by_name():
    result = mpirun(3, python("tests/mpi/rma_read_checks.py", "weights_pull"),
                    env=dict(ENV, HVD_ASYNC_ATOMIC_READS="sometimes"), timeout=120)
    assert result.returncode != 0
    assert "HVD_ASYNC_ATOMIC_READS='sometimes' is not one of auto, always, never" in result.out, result.out[-3000:]


def test_a_hung_check_prints_every_rank_and_ends():
    """The check scripts' watchdog (tests/mpi/harness.py): a check that cannot end (reads without
    end) prints every rank's Python stack, then ends the job with a failure, well before the test's
    own timeout would (without the watchdog this test times out)."""
    env = dict(ENV, READS=str(10 ** 9), HVD_ASYNC_CHECK_WATCHDOG="8")
    result = mpirun(4, python("tests/mpi/rma_read_checks.py"), env=env, timeout=120)
    assert result.returncode != 0, result.out[-3000:]
    assert result.out.count("most recent call first") >= 4, result.out[-3000:]  # a stack per rank at least
    assert "in serve" in result.out and "in _race" in result.out, result.out[-3000:]

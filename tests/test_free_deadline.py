"""The windows' free cannot hang past a stated time (issue 56, the known hang of a free across hosts):
``hvd_async.failures.deadline`` ends the job with one line when a free every rank has reached does
not complete (tests/mpi/free_deadline_job.py: a rank that never joins it)."""
import re
import sys
import time

from procs import mpirun


def test_a_free_that_never_completes_ends_the_job():
    start = time.time()
    result = mpirun(2, [sys.executable, "tests/mpi/free_deadline_job.py"], env={"HVD_ASYNC_FREE_TIMEOUT": "2"},
                    timeout=60)
    assert result.returncode != 0, result
    assert "FREED" not in result.out, result
    assert re.search(r"worker 0: the windows' free at close\(\) did not complete within 2 s", result.out), result
    began = float(re.search(r"rank 0 frees at t=([\d.]+)", result.out).group(1))
    assert time.time() - began < 30 and time.time() - start < 60, result


def test_a_bad_limit_is_one_line():
    import pytest

    from hvd_async import failures

    for value in ("0", "-3", "soon"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(failures.FREE_TIMEOUT_ENV, value)
            with pytest.raises(ValueError, match=f"{failures.FREE_TIMEOUT_ENV}='{value}' is not a positive"):
                failures.free_timeout()

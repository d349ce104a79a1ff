"""Multi-process tests: the tests/mpi suite and the role checks under mpirun at 1, 2 and 4 ranks,
with shared memory on and off, each with a timeout and no process left behind."""

import os
import re
import sys

import pytest

from procs import mpirun, python, run

SIZES = (1, 2, 4)
MODES = {"shm": False, "no-shm": True}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("np", SIZES)
def test_mpi_suite(np, mode):
    result = mpirun(np, python("-m", "pytest", "tests/mpi", "-q", "-p", "no:cacheprovider", "-x"),
                    no_shm=MODES[mode], env={"HVD_ASYNC_UNDER_MPIRUN": "1"})
    assert result.returncode == 0, result.out[-6000:]
    assert result.out.count(" passed") == np, result.out[-3000:]  # every rank's summary line


@pytest.mark.parametrize("np,servers,mode", [(2, 1, "shm"), (4, 1, "shm"), (4, 2, "shm"), (4, 1, "no-shm")])
def test_roles_and_serve(np, servers, mode):
    result = mpirun(np, python("tests/mpi/roles_check.py"), no_shm=MODES[mode],
                    env={"SERVERS": str(servers)})
    assert result.returncode == 0, result.out[-6000:]
    assert result.out.count("ROLES OK") == np, result.out[-3000:]


def test_init_rejects_more_servers_than_ranks():
    result = mpirun(2, python("-c", "import hvd_async as ha; ha.init(servers=2)"))
    assert result.returncode != 0
    assert "servers=2 leaves no worker: the job has 2 MPI process(es)" in result.out


THREADS = ("import sys, hvd_async as ha; ha.init(); "
           "sys.stdout.write(f'THREADS {ha.rank()} {ha.runtime.threads_per_rank()}\\n'); sys.stdout.flush()")


def _threads(out: str) -> dict:
    # (horovodrun tags each line with [job,rank]<stdout>:)
    return {int(r): int(t) for r, t in re.findall(r"^(?:\[\d+,\d+\]<stdout>:)?THREADS (\d+) (\d+)$", out, re.M)}


@pytest.mark.parametrize("np,bind", [(1, "none"), (2, "none"), (2, "core")])
def test_threads_per_rank_under_mpirun(np, bind):
    """Each rank's torch threads: its CPUs (its binding) over the ranks of the node sharing them."""
    cpus = len(os.sched_getaffinity(0))
    if bind == "core" and cpus < np:
        pytest.skip(f"--bind-to core needs {np} CPUs, this process has {cpus}")
    result = run(["mpirun", "--allow-run-as-root", "-np", str(np), "--bind-to", bind,
                  *python("-c", THREADS)], timeout=120)
    assert result.returncode == 0, result.out[-3000:]
    want = 1 if bind == "core" else max(1, cpus // np)
    assert _threads(result.out) == {r: want for r in range(np)}, result.out[-2000:]


def test_threads_per_rank_under_horovodrun():
    cpus = len(os.sched_getaffinity(0))
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    result = run([horovodrun, "--mpi", "--mpi-args=--allow-run-as-root --oversubscribe", "-np", "2",
                  *python("-c", THREADS)], timeout=180)
    assert result.returncode == 0, result.out[-3000:]
    assert _threads(result.out) == {0: max(1, cpus // 2), 1: max(1, cpus // 2)}, result.out[-2000:]

"""Multi-process tests: the tests/mpi suite and the role checks under mpirun at 1, 2 and 4 ranks,
with shared memory on and off, each with a timeout and no process left behind."""

import pytest

from procs import mpirun, python

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

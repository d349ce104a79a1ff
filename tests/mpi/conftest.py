"""Under mpirun every rank runs this suite; one rank's failure aborts the job so the others never hang."""
import pytest

import hvd_async as ha


def pytest_configure(config):
    ha.init(servers=0)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if report.failed:
        from mpi4py import MPI

        print(f"\n[rank {MPI.COMM_WORLD.rank}] {report.nodeid} failed:\n{report.longreprtext}", flush=True)
        MPI.COMM_WORLD.Abort(1)

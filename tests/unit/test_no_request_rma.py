"""The workers' one-sided reads and writes complete with ``Flush``, never through request objects
(``Rget``, ``Raccumulate``, ``Rget_accumulate``): under Open MPI 4.1's UCX one-sided component a
worker's wait for an ``Rget`` of its answer was seen never to end while both servers polled (see the
window transport's module docstring). Each parameter-server algorithm the simulator runs trains an
epoch on digits with those calls made to fail."""
import pytest

from hvd_async.sim import mpi as sim_mpi
from hvd_async.sim import simulate

REQUEST_RMA = ("Rget", "Raccumulate", "Rget_accumulate")


@pytest.mark.parametrize("algo", ["asgd", "dc-asgd", "lc-asgd", "softsync", "backup-sgd", "dbs-asgd", "easgd"])
def test_a_parameter_server_job_makes_no_request_based_rma_call(algo, monkeypatch):
    reads = []
    for name in REQUEST_RMA:
        def refuse(self, *args, _name=name, **kwargs):
            raise AssertionError(f"{algo}: a worker called {_name}")
        monkeypatch.setattr(sim_mpi.SimWin, name, refuse)
    plain_get = sim_mpi.SimWin.Get

    def get(self, *args, **kwargs):
        reads.append(args[1])
        return plain_get(self, *args, **kwargs)
    monkeypatch.setattr(sim_mpi.SimWin, "Get", get)
    record = simulate(["--dataset", "digits", "--algo", algo, "--workers", "3", "--epochs", "1"])
    assert record["steps"] > 0 and reads, f"{algo}: no step, or no read of the weights"

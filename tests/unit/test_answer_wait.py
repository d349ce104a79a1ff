"""How a worker waits for its servers' answers (hvd_async/transport/window/client.py): in MPI's own
wait on cores of its own; on an oversubscribed node by checking and sleeping between checks, so that
its wait leaves the cores to the workers still computing."""
from hvd_async.transport.window import client


class FakeMPI:
    """Records the calls; the answers arrive at the ``ready_after``-th check."""

    def __init__(self, ready_after: int):
        self.calls = []
        outer = self

        class Request:
            @staticmethod
            def Waitall(requests):
                outer.calls.append("Waitall")

            @staticmethod
            def Testall(requests):
                outer.calls.append("Testall")
                return outer.calls.count("Testall") >= ready_after

        self.Request = Request


def test_on_cores_of_its_own_a_worker_waits_in_mpi(monkeypatch):
    naps = []
    monkeypatch.setattr(client.time, "sleep", naps.append)
    mpi = FakeMPI(ready_after=1)
    client.wait_for_answers(mpi, ["request"], polite=False)
    assert mpi.calls == ["Waitall"] and naps == []


def test_on_an_oversubscribed_node_it_checks_and_sleeps_between(monkeypatch):
    naps = []
    monkeypatch.setattr(client.time, "sleep", naps.append)
    mpi = FakeMPI(ready_after=4)
    client.wait_for_answers(mpi, ["request"], polite=True)
    assert mpi.calls == ["Testall"] * 4  # never MPI's spinning wait
    assert naps == [client.ANSWER_POLL_SECONDS] * 3  # a sleep between two checks, none after the last

"""The simulator's virtual clock and network: who runs when, wake-up times, collectives, deadlocks,
failures, and the per-worker delay distributions."""
import numpy as np
import pytest
import torch

from hvd_async.sim.clock import Scheduler, SimulationError
from hvd_async.delays import DISTRIBUTIONS, DelayModel, check_shape
from hvd_async.sim.network import SimNetwork


def test_the_worker_with_the_smallest_clock_runs_ties_to_the_lowest_id():
    sched, log = Scheduler(3), []

    def body(w):
        for _ in range(3):
            sched.advance(w, [3.0, 2.0, 3.0][w])
            log.append((sched.now(w), w))

    sched.run(body)
    assert log == sorted(log)  # events happen in virtual-time order, ties by worker id
    assert [sched.now(w) for w in range(3)] == [9.0, 6.0, 9.0]


def test_a_waiting_worker_resumes_at_the_time_of_the_worker_that_released_it():
    sched, flag, seen = Scheduler(2), [], {}

    def body(w):
        if w == 0:
            sched.wait_until(0, lambda: bool(flag), "the flag")
            seen["resumed_at"] = sched.now(0)
        else:
            sched.advance(1, 5.0)
            flag.append(True)
            sched.advance(1, 7.0)  # the flag was set at 5, before this advance

    sched.run(body)
    assert seen["resumed_at"] == 5.0


def test_collectives_complete_at_the_last_contribution_plus_latency():
    sched = Scheduler(3)
    net = SimNetwork(sched, latency=0.5)
    out = {}

    def body(w):
        sched.advance(w, float(w + 1))
        out[w] = net.collective(w, ("sum", 0), torch.tensor([float(w)]), lambda v: v[0] + v[1] + v[2])
        out[f"t{w}"] = sched.now(w)

    sched.run(body)
    assert [float(out[w]) for w in range(3)] == [3.0, 3.0, 3.0]
    assert [out[f"t{w}"] for w in range(3)] == [3.5, 3.5, 3.5]  # 3 (latest) + 0.5 latency


def test_a_deadlock_is_reported_with_what_each_worker_waits_for():
    sched = Scheduler(2)
    with pytest.raises(SimulationError, match="worker 0 waits for never.*worker 1 waits for never"):
        sched.run(lambda w: sched.wait_until(w, lambda: False, "never"))


def test_a_failing_worker_fails_the_run_and_unwinds_the_others():
    sched = Scheduler(3)

    def body(w):
        if w == 1:
            sched.advance(1, 1.0)
            raise ValueError("worker 1 broke")
        sched.wait_until(w, lambda: False, "forever")

    with pytest.raises(ValueError, match="worker 1 broke"):
        sched.run(body)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_every_distribution_has_the_requested_mean_and_is_seeded(dist):
    model = DelayModel(dist, mean_ms=20.0, shape=None, seed=5, worker=2, factor=1.5)
    draws = np.array([model.draw() for _ in range(40000)])
    assert abs(draws.mean() - 0.03) < 0.03 * (0.1 if dist == "pareto" else 0.03)
    again = DelayModel(dist, mean_ms=20.0, shape=None, seed=5, worker=2, factor=1.5)
    assert [again.draw() for _ in range(5)] == list(draws[:5])
    other = DelayModel(dist, mean_ms=20.0, shape=None, seed=5, worker=3, factor=1.5)
    assert dist == "constant" or [other.draw() for _ in range(5)] != list(draws[:5])


@pytest.mark.parametrize("dist,shape,match", [
    ("uniform", 1.5, "must be in \\[0, 1\\]"), ("pareto", 1.0, "alpha must be > 1"),
    ("lognormal", 0.0, "sigma must be in"), ("constant", 2.0, "takes no shape"), ("gamma", None, "choose one of"),
])
def test_bad_shapes_say_what_is_accepted(dist, shape, match):
    with pytest.raises(ValueError, match=match):
        check_shape(dist, shape)

"""Emulated accelerators: a step is its real forward and backward plus injected device time
(``--compute-ms``, drawn per worker by ``--delay-dist``); a straggler's factor stretches the device
time only, and the training job and the simulator draw the same times from the same seed."""
import pytest

from hvd_async.job import config, train
from hvd_async.sim import job as sim_job, options as sim_options


def _job(*argv):
    return config.validate(config.parse(["--np", "3", *argv], launcher=False)).job


def _slept(monkeypatch, job, worker, steps, scale=1.0):
    """The device times worker ``worker`` of the training job sleeps over ``steps`` steps."""
    slept = []
    monkeypatch.setattr(train.time, "sleep", slept.append)
    pacer = train._Pacer(job, worker)
    for _ in range(steps):
        pacer.before_step(scale)
        sum(i * i for i in range(20000))  # the real forward and backward: CPU time, not stretched
    return slept


def test_a_stragglers_injected_sleep_is_factor_times_compute_ms_whatever_its_cpu_time(monkeypatch):
    """The old pacer also slept (factor - 1) x the last step's measured forward and backward: on shared
    cores that is the other processes' time as much as the straggler's."""
    job = _job("--compute-ms", "20", "--straggler", "1=3")
    assert _slept(monkeypatch, job, 1, 3) == pytest.approx([0.06] * 3)
    assert _slept(monkeypatch, job, 0, 2, scale=0.5) == pytest.approx([0.01] * 2)
    assert _slept(monkeypatch, _job(), 0, 2) == []  # no --compute-ms: no device time


@pytest.mark.parametrize("dist", ["uniform", "lognormal", "pareto"])
def test_the_job_sleeps_the_device_times_the_simulator_draws_for_the_same_seed(monkeypatch, dist):
    flags = ["--compute-ms", "20", "--delay-dist", dist, "--straggler", "2=3", "--seed", "7"]
    spec, sim = sim_options.check(sim_options.parse(["--workers", "3", *flags]))
    simulated = sim_job.worker_delays(spec, sim)
    job = _job(*flags)
    for worker in range(3):
        drawn = [simulated[worker].draw() for _ in range(6)]
        assert _slept(monkeypatch, job, worker, 6) == drawn
        assert len(set(drawn)) == 6  # drawn, not constant
    assert _slept(monkeypatch, _job(*flags[:-1], "8"), 0, 6) != _slept(monkeypatch, job, 0, 6)  # another run

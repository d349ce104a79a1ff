"""Emulated accelerators: a step is its real forward and backward plus injected device time
(``--compute-ms``); a straggler's factor stretches the device time only."""
import pytest

from hvd_async import train


def test_a_stragglers_injected_sleep_is_factor_times_compute_ms_whatever_its_cpu_time(monkeypatch):
    """The old pacer also slept (factor - 1) x the last step's measured forward and backward: on shared
    cores that is the other processes' time as much as the straggler's."""
    slept = []
    monkeypatch.setattr(train.time, "sleep", slept.append)
    pacer = train._Pacer(20.0, 3.0)
    for scale in (1.0, 1.0, 0.5):
        pacer.before_step(scale)
        sum(i * i for i in range(200000))  # the real forward and backward: CPU time, not stretched
    assert slept == pytest.approx([0.06, 0.06, 0.03])


"""The epoch line names each worker's samples/s, so a slow node shows on the console (issue 59)."""
from hvd_async.job.epoch_report import worker_speeds


def test_each_workers_speed_is_listed_up_to_eight_workers():
    assert worker_speeds([812.4, 790.0, 301.2, 805.0]) == " (per worker 812 790 301 805)"


def test_beyond_eight_workers_the_slowest_and_fastest_are_named():
    rates = [800.0] * 16
    rates[11], rates[3] = 250.0, 900.0
    assert worker_speeds(rates) == " (per worker: slowest 250, worker 11; fastest 900, worker 3)"


def test_one_worker_adds_nothing():
    assert worker_speeds([1000.0]) == ""

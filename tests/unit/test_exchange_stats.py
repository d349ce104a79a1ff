"""A strategy's statistics are one typed record (issue 60 item 3): the fields the job reads, the
algorithm's own figures in ``extra``; ``DistributedOptimizer.stats()`` flattens it into the dict users
read; a plugin's strategy that still returns a dict gets one line saying what to return."""
import pytest

from hvd_async.algorithms.base import CompensationSums, ExchangeStats, exchange_stats


def test_as_dict_keeps_the_set_fields_the_sums_and_the_extra_figures():
    stats = ExchangeStats(staleness_mean=1.5, staleness_max=3, staleness_hist=[1, 2], pushes=7, skipped_nonfinite=1,
                          server_ms_per_push=0.25, compensation=CompensationSums(2.0, 8.0, 12),
                          extra={"dropped": 4})
    assert stats.as_dict() == {"staleness_mean": 1.5, "staleness_max": 3, "staleness_hist": [1, 2], "pushes": 7,
                               "skipped_nonfinite": 1, "server_ms_per_push": 0.25, "server_pushes": 12,
                               "compensation_sq_sum": 2.0, "grad_sq_sum": 8.0, "dropped": 4}


def test_unset_fields_are_left_out():
    assert ExchangeStats().as_dict() == {"staleness_mean": 0.0, "staleness_max": 0, "skipped_nonfinite": 0}


def test_a_strategy_that_returns_a_dict_is_told_what_to_return():
    class OldPlugin:
        def stats(self):
            return {"staleness_mean": 0.0}

    with pytest.raises(TypeError, match=r"^OldPlugin.stats\(\) returned a dict; return an hvd_async.algorithms.base"
                                        r".ExchangeStats"):
        exchange_stats(OldPlugin())

    class NewPlugin:
        def stats(self):
            return ExchangeStats(extra={"averagings": 2})

    assert exchange_stats(NewPlugin()).extra == {"averagings": 2}

"""A server program's sums travel as unnamed float slots in its shard's meta window: the program names
them (``ServerProgram.sums``) and the workers read them by those names, added over the shards."""
import numpy as np
import pytest

from hvd_async import registry
from hvd_async.transport import window


def test_named_sums_add_the_shards_parts_by_name():
    rows = [{"sums": [1.5, 2.0]}, {"sums": [0.25, 4.0]}]
    assert window.named_sums(rows, ("compensation_sq", "grad_sq")) == {"compensation_sq": 1.75, "grad_sq": 6.0}
    assert window.named_sums(rows[:1], ("dropped_pushes",)) == {"dropped_pushes": 1.5}
    assert window.named_sums(rows, ()) == {}


def test_add_sums_fills_the_named_slots_in_order_and_no_more():
    meta = np.zeros(window.META_COUNTER + 1, dtype=np.int64)

    class Host:  # the part of ShardHost that add_sums touches
        add_sums = window.ShardHost.add_sums

    host = Host()
    host.meta = meta
    host.add_sums(3.0)
    host.add_sums(1.0, 0.5)
    assert window.stats_row(meta, "mailbox")["sums"] == [4.0, 0.5]
    assert meta[window.META_COUNTER] == 0  # the shared counter after the sums is never written
    with pytest.raises(ValueError):
        host.add_sums(*([1.0] * (window.SUMS + 1)))


def test_every_server_program_names_no_more_sums_than_the_window_holds():
    registry.algorithms()  # every algorithm's module imported, its programs with it
    programs = list(_subclasses(window.ServerProgram))
    assert {"DCProgram", "LCProgram", "BackupProgram"} <= {p.__name__ for p in programs}
    assert all(len(p.sums) <= window.SUMS for p in programs), [(p.__name__, p.sums) for p in programs]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)

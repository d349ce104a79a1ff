"""The windows' sizes are decided in one place (``WindowSpec.sizes``): the simulator's memory and the
memory table's copies follow it, in every mode (issue 60)."""
import pytest

from hvd_async.sim.memory import window_copies
from hvd_async.sim.windows import MemoryWindows
from hvd_async.transport.window import WindowSpec


def spec(mode="mailbox", slots=0, wire="fp32", outbox=True, numel=1000, servers=3, workers=4):
    return WindowSpec("x", mode, numel, servers, workers, {}, wire, slots, outbox)


@pytest.mark.parametrize("kind, made, copies", [
    ("per-worker inbox and outbox", spec(), 1 + 4 + 4),
    ("a pool of 2 inbox slots", spec(slots=2), 1 + 2 + 4),
    ("fp16 on the wire", spec(wire="fp16"), 1 + 0.5 * (4 + 4)),
    ("no outbox", spec(outbox=False), 1 + 4),
    ("accumulate mode", spec(mode="accumulate"), 1),
])
def test_sizes_are_what_the_memory_holds(kind, made, copies):
    for shard in range(made.servers):
        sizes, n = made.sizes(shard), made.shard_len(shard)
        meta, weights, inbox, outbox = MemoryWindows(made, shard).arrays()
        assert (len(meta), weights.numel()) == (sizes.meta, sizes.weights) == (made.meta_len, n), kind
        assert (0 if inbox is None else inbox.numel(), 0 if outbox is None else outbox.numel()) == \
            (sizes.inbox, sizes.outbox), kind
    assert window_copies(spec(mode=made.mode, slots=made.slots, wire=made.wire, outbox=made.outbox,
                              servers=1)) == copies, kind


def test_a_worker_holds_empty_windows():
    assert tuple(spec().sizes(None)) == (0, 0, 0, 0)

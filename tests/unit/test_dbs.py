"""dbs-asgd's pieces that need no MPI: the shared-cursor batches (every sample once per epoch, whatever
the batch sizes and the order of the workers) and the option checks."""
import random

import pytest
import torch

from hvd_async.algorithms.dbs import DBSASGDOptions
from hvd_async.sampling import SharedCursorBatches


def _counter():
    value = [0]

    def fetch_add(n):
        value[0] += n
        return value[0] - n

    return fetch_add


@pytest.mark.parametrize("n,workers,seed", [(97, 3, 0), (10, 4, 1), (1, 2, 2), (64, 1, 3)])
def test_every_sample_exactly_once_per_epoch(n, workers, seed):
    fetch_add = _counter()  # shared by the workers, as the servers' cursor is
    samplers = [SharedCursorBatches(n, seed=seed, fetch_add=fetch_add) for _ in range(workers)]
    rng = random.Random(seed)
    positions = {}  # epoch -> indices drawn at that epoch's positions
    drawn_per_epoch = {}  # epoch a batch belongs to -> its indices
    for _ in range(60):
        worker = rng.randrange(workers)  # any interleaving
        size = rng.randint(1, max(1, n // 2 + 3))
        epoch, idx = samplers[worker].draw(size)
        drawn_per_epoch.setdefault(epoch, []).extend(idx)
        start = fetch_add(0) - size
        for k, i in enumerate(idx):
            positions.setdefault((start + k) // n, []).append(i)
    complete = [e for e in positions if e < max(positions)]
    assert complete, "the test should cover at least one whole epoch"
    for e in complete:
        assert sorted(positions[e]) == list(range(n)), f"epoch {e}: not each sample once"
    perms = {tuple(samplers[0].permutation(e).tolist()) for e in complete[:3]}
    assert n == 1 or len(perms) > 1, "every epoch got the same order"


def test_same_seed_same_sequence_and_batches_straddle_epochs():
    a = SharedCursorBatches(5, seed=7, fetch_add=_counter())
    b = SharedCursorBatches(5, seed=7, fetch_add=_counter())
    assert [a.draw(3) for _ in range(4)] == [b.draw(3) for _ in range(4)]
    c = SharedCursorBatches(5, seed=7, fetch_add=_counter())
    epoch, idx = c.draw(7)  # positions 0..6: all of epoch 0, then two of epoch 1
    assert epoch == 0 and sorted(idx[:5]) == list(range(5))
    assert idx[5:] == c.permutation(1)[:2].tolist()
    epoch, idx = c.draw(3)
    assert epoch == 1 and idx == c.permutation(1)[2:5].tolist()
    assert torch.equal(c.permutation(1), SharedCursorBatches(5, seed=7, fetch_add=_counter()).permutation(1))
    with pytest.raises(ValueError, match="batch size must be >= 1, got 0"):
        c.draw(0)


@pytest.mark.parametrize("options,fragment", [
    ({}, "batch_size is required: pass the nominal batch per worker to the optimizer"),
    ({"batch_size": 0}, "batch_size (the nominal batch per worker; the global batch is workers x batch_size) must "
                        "be an integer >= 1, got 0"),
    ({"batch_size": 8, "every": 0}, "every must be an integer >= 1, got 0"),
    ({"batch_size": 8, "smoothing": 1.0}, "smoothing (weight of the past"),
    ({"batch_size": 8, "min_batch": 4, "max_batch": 2}, "max_batch must be an integer >= min_batch (4), got 2"),
])
def test_options_name_the_bad_value(options, fragment):
    with pytest.raises(ValueError) as info:
        DBSASGDOptions(**options)
    assert fragment in str(info.value)

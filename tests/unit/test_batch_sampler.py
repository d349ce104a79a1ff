"""hvd_async.DynamicBatchSampler in one process: it yields the size the strategy asks for at each
batch, shares one sequence among the workers (each sample once per epoch), ends an epoch when the
sequence moves on and starts the next with the batch that showed it, and says what to do where it
does not apply. The strategy here is a stand-in with dbs-asgd's face (``batch_size``,
``batch_cursor()``, ``options.batch_size``, ``transport.size``); tests/test_dbs_sampler.py runs the
real dbs-asgd under mpirun."""
import itertools
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, SubsetRandomSampler, TensorDataset

import hvd_async as ha


def _cursor():
    """A shared fetch-and-add, as the servers' counter: ``n -> `` the first of the next n positions."""
    positions = itertools.count()
    return lambda n: [next(positions) for _ in range(n)][0]


def _opt(cursor, batch_size=4, workers=2):
    strategy = SimpleNamespace(name="dbs-asgd", batch_size=batch_size, batch_cursor=lambda: cursor,
                               options=SimpleNamespace(batch_size=batch_size), transport=SimpleNamespace(size=workers))
    return SimpleNamespace(strategy=strategy)


def test_each_batch_has_the_size_asked_for_when_it_is_drawn():
    data = TensorDataset(torch.arange(41))
    opt = _opt(_cursor())
    loader = DataLoader(data, batch_sampler=ha.DynamicBatchSampler(data, opt))
    sizes, seen = [], []
    for step, (x,) in enumerate(loader):
        sizes.append(len(x))
        seen += x.tolist()
        opt.strategy.batch_size = [3, 7, 1][step % 3]  # dbs-asgd resizes between steps
    assert sizes == [4, 3, 7, 1, 3, 7, 1, 3, 7, 1, 3, 7], sizes  # 47 positions: the last straddles epoch 1
    assert sorted(seen[:41]) == list(range(41)), "one worker alone: every sample once in its epoch"


def test_workers_share_one_sequence_and_an_epoch_ends_when_it_moves_on():
    n, cursor = 30, _cursor()
    opts = [_opt(cursor, batch_size=b) for b in (2, 5)]  # a slow worker and a fast one
    samplers = [ha.DynamicBatchSampler(range(n), opt, seed=3) for opt in opts]
    for epoch in range(3):
        iters = [iter(s) for s in samplers]
        got, live = [[], []], [True, True]
        while any(live):
            for w in (0, 1):
                if live[w]:
                    batch = next(iters[w], None)
                    live[w] = batch is not None
                    got[w] += batch or []
        assert len(got[1]) >= 2 * len(got[0]) > 0, got  # the larger batches took more of the epoch
        drawn = got[0] + got[1]
        # this epoch's permutation (a batch straddling into the next would add at most 4 of its head)
        assert sorted(set(drawn)) == list(range(n)) and len(drawn) < n + 5, drawn
    held = [s._drawn for s in samplers]
    assert all(h is not None and h[0] == 3 for h in held), held  # each holds the batch that ended epoch 2
    assert next(iter(samplers[0])) == held[0][1]  # ... and yields it first in epoch 3


def test_a_sampler_sets_the_order_and_len_is_the_nominal_steps():
    n, train = 50, list(range(0, 50, 2))  # a training split of 25
    sampler = SubsetRandomSampler(train, generator=torch.Generator().manual_seed(1))
    batches = ha.DynamicBatchSampler(sampler, _opt(_cursor(), batch_size=3, workers=2))
    assert len(batches) == 5  # 25 samples / (2 workers x 3)
    drawn = [i for batch in batches for i in batch]
    assert set(drawn) <= set(train) and set(train) <= set(drawn) and len(drawn) < 25 + 3
    assert len(ha.DynamicBatchSampler(range(n), _opt(_cursor(), batch_size=4, workers=3))) == 5


def test_where_it_does_not_apply_it_says_what_to_do():
    asgd = SimpleNamespace(strategy=SimpleNamespace(name="asgd", batch_cursor=lambda: None))
    with pytest.raises(ValueError, match=r"^DynamicBatchSampler follows an algorithm that sizes each worker's "
                                         r"batches \(dbs-asgd\); asgd uses a fixed batch: give the DataLoader a "
                                         r"DistributedSampler and batch_size instead$"):
        ha.DynamicBatchSampler(range(10), asgd)
    with pytest.raises(TypeError, match="optimizer must be the hvd_async.DistributedOptimizer whose batch size "
                                        "the batches follow, got SGD"):
        ha.DynamicBatchSampler(range(10), torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    split = DistributedSampler(range(10), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="a DistributedSampler splits it per worker: pass the dataset"):
        ha.DynamicBatchSampler(split, _opt(_cursor()))
    with pytest.raises(TypeError, match="data must be a dataset or a sampler with a len"):
        ha.DynamicBatchSampler(iter(range(10)), _opt(_cursor()))
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        ha.DynamicBatchSampler(range(10), _opt(_cursor()), seed=-1)

"""hpsgd through Horovod: a fixed gradient table against the recurrence by hand, and window 1
without overlap against plain horovod.torch.DistributedOptimizer."""
import horovod.torch as hvd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvd_async as ha
from reference import hpsgd as reference_hpsgd, table_grad, table_start

N, LR, STEPS = 5, 0.1, 6


def _start(worker):
    return table_start(worker, N)


def _grad(worker, step):
    return table_grad(worker, step, N)


def _hand(workers, steps, k, rate, momentum, overlap):
    return reference_hpsgd(workers, steps, numel=N, lr=LR, k=k, rate=rate, momentum=momentum, overlap=overlap)


def _all_ranks_equal(tensors):
    flat = torch.cat([t.detach().flatten() for t in tensors])
    gathered = hvd.allgather(flat.unsqueeze(0))
    return all(torch.equal(gathered[0], row) for row in gathered)


@pytest.mark.parametrize("overlap", [True, False])
def test_fixed_gradients_match_hand_recurrence(overlap):
    steps, k, rate, momentum = 10, 3, 0.5, 0.9
    rank = hvd.rank()
    w = nn.Parameter(_start(rank).float())
    opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=LR, momentum=momentum), named_parameters=[("w", w)],
                                  algorithm="hpsgd", window=k, merge_rate=rate, overlap=overlap)
    want_trace, want_final = _hand(hvd.size(), steps, k, rate, momentum, overlap)
    for t, (want_rs, want_g) in enumerate(want_trace, start=1):
        w.grad = _grad(rank, t).float()
        opt.step()
        torch.testing.assert_close(w.detach().double(), want_rs[rank], rtol=0, atol=1e-5,
                                   msg=f"replica of rank {rank} after step {t}")
        torch.testing.assert_close(opt.strategy.global_model.double(), want_g, rtol=0, atol=1e-5,
                                   msg=f"global model on rank {rank} after step {t}")
    opt.load_global_model()
    torch.testing.assert_close(w.detach().double(), want_final, rtol=0, atol=1e-5)
    assert _all_ranks_equal([w])
    stats = opt.stats()
    assert stats["exchanges"] == 4 and stats["staleness_max"] == (1 if overlap else 0)
    opt.close()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))


def _batches(n):
    g = torch.Generator().manual_seed(1000 + hvd.rank())  # every worker sees different data
    return [(torch.randn(8, 10, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def _train(opt, model, batches):
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def _hpsgd(model, **options):
    return ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), algorithm="hpsgd", **options)


def test_window_one_without_overlap_equals_plain_horovod():
    batches = _batches(STEPS)
    initial = [p.detach().clone() for p in _model().parameters()]
    ref_model = _model()
    ref = hvd.DistributedOptimizer(torch.optim.SGD(ref_model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=ref_model.named_parameters())
    _train(ref, ref_model, batches)

    our_model = _model()
    ours = _hpsgd(our_model, window=1, overlap=False, merge_rate=1.0)
    _train(ours, our_model, batches)
    ours.close()
    for (name, a), b, start in zip(ref_model.named_parameters(), our_model.parameters(), initial):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs from Horovod's")
        assert not torch.equal(b, start), f"{name} never changed"
    assert _all_ranks_equal(our_model.parameters()), "replicas diverged across workers"

    # With overlap the others' changes arrive one window late: not Horovod's. Alone, the replica
    # keeps its own change in flight (keep_own_change), so nothing is stale and it is Horovod's.
    stale_model = _model()
    stale = _hpsgd(stale_model, window=1, overlap=True)
    _train(stale, stale_model, batches)
    stale.load_global_model()
    stale.close()
    same = torch.allclose(next(stale_model.parameters()), next(ref_model.parameters()), rtol=1e-5, atol=1e-6)
    assert same == (hvd.size() == 1)


@pytest.mark.skipif(hvd.size() < 2, reason="a single worker has nobody to differ from")
def test_replicas_differ_mid_window_and_agree_after_synchronize():
    model = _model()
    opt = _hpsgd(model, window=4)
    _train(opt, model, _batches(STEPS))
    assert not _all_ranks_equal(model.parameters())
    opt.load_global_model()
    assert _all_ranks_equal(model.parameters())
    opt.close()


def test_close_with_exchange_in_flight_then_reuse():
    for _ in range(2):  # the second optimizer reuses the exchange names: nothing may be left in flight
        model = _model()
        opt = _hpsgd(model, window=1, overlap=True)
        _train(opt, model, _batches(2))
        assert opt.strategy._pending is not None
        opt.close()
        assert opt.strategy._pending is None
        with pytest.raises(RuntimeError, match="closed"):
            opt.step()

"""The ssgd strategy over the in-process loopback transport (threads as workers), against hand math."""
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvd_async import DistributedOptimizer
from hvd_async.transport import LoopbackGroup, ReduceOp
from threads import run_workers

WORKERS, STEPS, LR = 3, 4, 0.1


def _model():
    torch.manual_seed(0)
    return nn.Linear(5, 3)


def _data(worker, step):
    g = torch.Generator().manual_seed(100 * worker + step)
    return torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)


def _run_workers(target, workers=WORKERS):
    run_workers(target, workers)


def test_loopback_allreduce_average_and_sum():
    group = LoopbackGroup(3)
    out = {}

    def work(rank):
        t = group.transport(rank)
        a = torch.tensor([float(rank), 1.0])
        out[("avg", rank)] = t.allreduce_(a.clone(), name="x", op=ReduceOp.AVERAGE)
        out[("sum", rank)] = t.allreduce_(a.clone(), name="x", op=ReduceOp.SUM)
        out[("bc", rank)] = t.broadcast_(a.clone(), root=2, name="b")
        out[("ag", rank)] = t.allgather_object(rank * 10)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    for r in range(3):
        assert out[("avg", r)].tolist() == [1.0, 1.0]
        assert out[("sum", r)].tolist() == [3.0, 3.0]
        assert out[("bc", r)].tolist() == [2.0, 1.0]
        assert out[("ag", r)] == [0, 10, 20]


def test_loopback_times_out_instead_of_hanging():
    t = LoopbackGroup(2, timeout=0.2).transport(0)
    with pytest.raises(TimeoutError, match=r"waited 0.2 s for worker\(s\) \[1\]"):
        t.allreduce_(torch.ones(1), name="lonely", op=ReduceOp.SUM)


def test_transport_use_after_close_raises():
    t = LoopbackGroup(1).transport(0)
    t.close()
    with pytest.raises(RuntimeError, match="closed"):
        t.allreduce_(torch.ones(1), name="x")


def test_ssgd_equals_hand_computed_average_sgd():
    group = LoopbackGroup(WORKERS)
    finals = {}
    models = [_model() for _ in range(WORKERS)]  # seeded here: the global RNG is not thread-safe

    def worker(rank):
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), algorithm="ssgd",
                                   transport=group.transport(rank))
        for step in range(STEPS):
            x, y = _data(rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        finals[rank] = [p.detach().clone() for p in model.parameters()]

    _run_workers(worker)

    # Reference: one model, w <- w - lr * mean over workers of each worker's gradient at w.
    ref = _model()
    for step in range(STEPS):
        grads = []
        for rank in range(WORKERS):
            ref.zero_grad()
            x, y = _data(rank, step)
            F.cross_entropy(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for i, p in enumerate(ref.parameters()):
                p -= LR * sum(g[i] for g in grads) / WORKERS
    for rank in range(WORKERS):
        for got, want in zip(finals[rank], ref.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad,applied", [
    (None, True),                 # every gradient finite: the step applies
    (float("nan"), False),        # one element of one worker's gradient: every worker skips alike
    (float("-inf"), False),
    (1e20, True),                 # finite, but its square overflows: the screen trips, the exact check passes
])
def test_ssgd_never_applies_a_non_finite_average(bad, applied):
    """Worker 1 plants ``bad`` into one gradient element (after backward, before the allreduce
    hook's screen reads it: through a hook of its own registered first)."""
    group = LoopbackGroup(WORKERS)
    models = [_model() for _ in range(WORKERS)]
    start = [p.detach().clone() for p in _model().parameters()]
    out = {}

    def worker(rank):
        model = models[rank]
        if rank == 1 and bad is not None:
            def plant(p):
                p.grad.view(-1)[7] = bad

            model.weight.register_post_accumulate_grad_hook(plant)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), algorithm="ssgd",
                                   transport=group.transport(rank))
        x, y = _data(rank, 0)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        out[rank] = ([p.detach().clone() for p in model.parameters()], opt.stats()["skipped_nonfinite"])

    _run_workers(worker)
    for rank in range(WORKERS):
        weights, skipped = out[rank]
        moved = any(not torch.equal(w, s) for w, s in zip(weights, start))
        assert moved == applied and skipped == (0 if applied else 1), (rank, moved, skipped)
        assert all(bool(torch.isfinite(w).all()) for w in weights)


def test_ssgd_trains_a_tensor_named_twice_once_as_horovod():
    """Tied weights passed under both names (``named_parameters(remove_duplicate=False)``): one hook and
    one allreduce for the tensor (Horovod de-duplicates), the weights those of the run naming it once."""
    def tied():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5))
        model[2].weight = model[0].weight
        return model

    finals = {}

    def run(remove_duplicate):
        group = LoopbackGroup(2)
        models = [tied() for _ in range(2)]

        def worker(rank):
            model = models[rank]
            named = list(model.named_parameters(remove_duplicate=remove_duplicate))
            opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), named_parameters=named,
                                       algorithm="ssgd", transport=group.transport(rank))
            for step in range(STEPS):
                x, y = _data(rank, step)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            if not remove_duplicate:  # Horovod's choice: the last name in sorted order
                assert sorted(opt._parameter_names.values()) == ["0.bias", "2.bias", "2.weight"]
            finals[(remove_duplicate, rank)] = [p.detach().clone() for p in model.parameters()]

        _run_workers(worker, workers=2)

    run(remove_duplicate=False)
    run(remove_duplicate=True)
    start = list(tied().parameters())
    for rank in range(2):
        got, want = finals[(False, rank)], finals[(True, 0)]
        assert not torch.equal(got[0], start[0]), "the tied weight did not train"
        for g, w in zip(got, want):
            assert torch.equal(g, w)

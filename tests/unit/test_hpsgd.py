"""The hpsgd strategy over the in-process loopback transport (threads as workers), against hand math."""
import io
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvd_async import DistributedOptimizer
from hvd_async.algorithms.base import parse_options
from hvd_async.algorithms.hpsgd import HPSGD, HPSGDAlgorithm
from hvd_async.transport import LoopbackGroup, ReduceOp
from reference import hpsgd as reference_hpsgd, table_grad, table_start
from threads import run_workers

WORKERS, N, LR = 3, 5, 0.1


def _run_workers(target, workers=WORKERS):
    run_workers(target, workers)


# --- a fixed gradient table against the recurrence computed by hand ----------------------------

def _start(worker):
    return table_start(worker, N)


def _grad(worker, step):
    return table_grad(worker, step, N)


def _hand(workers, steps, k, rate, momentum, overlap, keep_own=True):
    return reference_hpsgd(workers, steps, numel=N, lr=LR, k=k, rate=rate, momentum=momentum, overlap=overlap,
                           keep_own=keep_own)


@pytest.mark.parametrize("overlap,keep_own", [(True, True), (True, False), (False, True)])
def test_fixed_gradients_match_hand_recurrence(overlap, keep_own):
    steps, k, rate, momentum = 10, 3, 0.5, 0.9
    group = LoopbackGroup(WORKERS)
    trace, final = {r: [] for r in range(WORKERS)}, {}

    def worker(rank):
        w = nn.Parameter(_start(rank).float())
        opt = DistributedOptimizer(torch.optim.SGD([w], lr=LR, momentum=momentum),
                                   named_parameters=[("w", w)], algorithm="hpsgd",
                                   transport=group.transport(rank), window=k, merge_rate=rate,
                                   overlap=overlap, keep_own_change=keep_own)
        for t in range(1, steps + 1):
            w.grad = _grad(rank, t).float()
            opt.step()
            trace[rank].append((w.detach().clone(), opt.strategy.global_model.clone()))
        opt.load_global_model()
        final[rank] = (w.detach().clone(), opt.strategy.global_model.clone())
        opt.close()

    _run_workers(worker)
    want_trace, want_final = _hand(WORKERS, steps, k, rate, momentum, overlap, keep_own)
    for rank in range(WORKERS):
        for t, ((got_r, got_g), (want_rs, want_g)) in enumerate(zip(trace[rank], want_trace), start=1):
            torch.testing.assert_close(got_r.double(), want_rs[rank], rtol=0, atol=1e-5,
                                       msg=f"replica of worker {rank} after step {t}")
            torch.testing.assert_close(got_g.double(), want_g, rtol=0, atol=1e-5,
                                       msg=f"global model on worker {rank} after step {t}")
        for got in final[rank]:
            torch.testing.assert_close(got.double(), want_final, rtol=0, atol=1e-5)
    # The two modes' replicas really differ on this table (the final G does not: with gradients
    # that ignore the parameters every change is merged once either way), so the trace tells them apart.
    other = _hand(WORKERS, steps, k, rate, momentum, not overlap, not keep_own)[0]
    assert max((a[0][0] - b[0][0]).abs().max() for a, b in zip(other, want_trace)) > 1e-2


# --- against the ssgd strategy on a small model --------------------------------------------------

def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(5, 3)


def _data(worker, step):
    g = torch.Generator().manual_seed(100 * worker + step)
    return torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)


def _train(algorithm, steps, momentum=0.0, workers=WORKERS, seed=0, **options):
    """Train one model per worker thread; returns each worker's final parameters and stats."""
    group = LoopbackGroup(workers)
    models = [_model(seed) for _ in range(workers)]  # seeded here: the global RNG is not thread-safe
    out = {}

    def worker(rank):
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum),
                                   named_parameters=model.named_parameters(), algorithm=algorithm,
                                   transport=group.transport(rank), **options)
        for step in range(steps):
            x, y = _data(rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        opt.load_global_model()
        out[rank] = ([p.detach().clone() for p in model.parameters()], opt.stats(), opt.progress())
        opt.close()

    _run_workers(worker, workers)
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_window_one_without_overlap_equals_ssgd(momentum):
    hp = _train("hpsgd", 5, momentum, window=1, merge_rate=1.0, overlap=False)
    ss = _train("ssgd", 5, momentum)
    for rank in range(WORKERS):
        for got, want in zip(hp[rank][0], ss[rank][0]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    stale = _train("hpsgd", 5, momentum, window=1, overlap=True)  # one window late: not ssgd
    assert not torch.allclose(stale[0][0][0], ss[0][0][0], rtol=1e-6, atol=1e-6)


# --- synchronize, stats, options -----------------------------------------------------------------

def test_synchronize_makes_workers_identical():
    group = LoopbackGroup(WORKERS)
    models = [_model() for _ in range(WORKERS)]
    before, after = {}, {}

    def worker(rank):
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), algorithm="hpsgd",
                                   transport=group.transport(rank), window=4)
        for step in range(6):
            x, y = _data(rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        before[rank] = model.weight.detach().clone()
        opt.load_global_model()
        after[rank] = model.weight.detach().clone()
        assert torch.equal(after[rank].reshape(-1), opt.strategy.global_model[:after[rank].numel()])
        opt.close()

    _run_workers(worker)
    assert not torch.equal(before[0], before[1]), "replicas should differ mid-window"
    for rank in range(1, WORKERS):
        assert torch.equal(after[rank], after[0])


@pytest.mark.parametrize("overlap,staleness", [(True, 1.0), (False, 0.0)])
def test_stats(overlap, staleness):
    out = _train("hpsgd", 8, window=2, overlap=overlap)
    for rank in range(WORKERS):
        _, stats, progress = out[rank]
        assert stats["exchanges"] == 4  # boundaries at steps 2, 4, 6, 8
        assert stats["staleness_mean"] == staleness and stats["staleness_max"] == int(staleness)
        assert isinstance(stats["exchange_wait_seconds"], float) and stats["exchange_wait_seconds"] >= 0
        assert stats["skipped_nonfinite"] == 0
        assert progress == 8 * WORKERS


def test_partial_window_is_exchanged_without_staleness():
    out = _train("hpsgd", 5, window=2, overlap=True)  # stale merges at 4 and in synchronize; 5 not
    stats = out[0][1]
    assert stats["exchanges"] == 3 and stats["staleness_max"] == 1
    assert stats["staleness_mean"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("options,error,match", [
    ({"window": 0}, ValueError, r"window must be an integer >= 1 .*got 0"),
    ({"window": 2.0}, ValueError, r"window must be an integer >= 1 .*got 2.0"),
    ({"window": True}, ValueError, r"window must be an integer >= 1 .*got True"),
    ({"merge_rate": 0}, ValueError, r"merge_rate must be a finite number > 0 .*got 0"),
    ({"merge_rate": -1}, ValueError, r"merge_rate must be a finite number > 0 .*got -1"),
    ({"merge_rate": float("nan")}, ValueError, r"merge_rate must be a finite number > 0 .*got nan"),
    ({"merge_rate": float("inf")}, ValueError, r"merge_rate must be a finite number > 0 .*got inf"),
    ({"merge_rate": "1"}, ValueError, r"merge_rate must be a finite number > 0 .*got '1'"),
    ({"overlap": "yes"}, ValueError, r"overlap must be True or False, got 'yes'"),
    ({"lam": 0.1}, TypeError, r"unknown option\(s\) 'lam' for algorithm 'hpsgd'; accepted: window, "
                              r"merge_rate, overlap"),
])
def test_bad_options_name_the_value(options, error, match):
    with pytest.raises(error, match=match):
        parse_options(HPSGDAlgorithm.Options, "hpsgd", options)


def test_defaults_and_int_merge_rate():
    opts = parse_options(HPSGDAlgorithm.Options, "hpsgd", {"merge_rate": 2})
    assert (opts.window, opts.merge_rate, opts.overlap) == (4, 2.0, True)
    assert isinstance(opts.merge_rate, float)


def _single(params, **options):
    return DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=LR), named_parameters=params,
                                algorithm="hpsgd", transport=LoopbackGroup(1).transport(0), **options)


def test_mixed_dtype_or_device_is_refused():
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"one floating dtype, found torch.float32, torch.float64"):
        _single([("a", a), ("b", b)])
    c = nn.Parameter(torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match=r"one device, found cpu, meta"):
        _single([("a", a), ("c", c)])


def test_float64_model_trains():
    w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    opt = _single([("w", w)], window=2, overlap=False)
    for _ in range(2):
        w.grad = torch.tensor([1.0, -1.0], dtype=torch.float64)
        opt.step()
    assert w.dtype == torch.float64 and w.tolist() == pytest.approx([0.8, 2.2], abs=1e-12)


# --- non-finite gradients ------------------------------------------------------------------------

def test_nonfinite_gradient_skips_the_local_step(caplog):
    w = nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = _single([("w", w)], window=1, overlap=False)
    w.grad = torch.tensor([1.0, 1.0])
    opt.step()
    with caplog.at_level(logging.WARNING, logger="hvd_async.algorithms.hpsgd"):
        w.grad = torch.tensor([float("nan"), 1.0])
        opt.step()
    assert w.tolist() == pytest.approx([0.9, 1.9])
    assert opt.stats()["skipped_nonfinite"] == 1 and opt.strategy.steps == 2
    assert "NaN or infinity at step 2" in caplog.text


def test_nonfinite_on_one_worker_keeps_windows_aligned():
    group = LoopbackGroup(2)
    out = {}

    def worker(rank):
        w = nn.Parameter(torch.ones(3))
        opt = DistributedOptimizer(torch.optim.SGD([w], lr=LR), named_parameters=[("w", w)],
                                   algorithm="hpsgd", transport=group.transport(rank), window=2)
        for t in range(5):
            w.grad = torch.full((3,), float("inf") if (rank, t) == (1, 1) else 1.0)
            opt.step()
        opt.load_global_model()
        out[rank] = (w.detach().clone(), opt.stats()["skipped_nonfinite"])
        opt.close()

    _run_workers(worker, 2)
    assert out[0][1] == 0 and out[1][1] == 1
    assert torch.equal(out[0][0], out[1][0]) and torch.isfinite(out[0][0]).all()
    # Worker 0 moved 5 * lr, worker 1 4 * lr: the merged average is 4.5 * lr down from 1.
    torch.testing.assert_close(out[0][0], torch.full((3,), 1 - 4.5 * LR), rtol=0, atol=1e-6)


# --- checkpoints, closure, close ------------------------------------------------------------------

def _resume_run(save_at, total, state=None):
    """Train window=3 with overlap; synchronize and checkpoint at ``save_at`` (or resume from ``state``)."""
    group = LoopbackGroup(WORKERS)
    models = [_model(seed=0 if state is None else 7) for _ in range(WORKERS)]
    out, saved = {}, {}

    def worker(rank):
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                   named_parameters=model.named_parameters(), algorithm="hpsgd",
                                   transport=group.transport(rank), window=3)
        first = 0
        if state is not None:
            saved_state = torch.load(io.BytesIO(state[rank]))
            opt.load_state_dict(saved_state["optimizer"])
            opt.load_algorithm_state_dict(saved_state["algorithm"])
            first = save_at
        for step in range(first, total):
            if step == save_at and state is None:
                with pytest.raises(RuntimeError, match=r"call load_global_model\(\) on every worker first"):
                    opt.algorithm_state_dict()
                opt.load_global_model()
                buf = io.BytesIO()
                torch.save({"optimizer": opt.state_dict(), "algorithm": opt.algorithm_state_dict()}, buf)
                saved[rank] = buf.getvalue()
            x, y = _data(rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        opt.load_global_model()
        out[rank] = ([p.detach().clone() for p in model.parameters()], opt.strategy.steps)
        opt.close()

    _run_workers(worker)
    return out, saved


def test_state_dict_round_trip_resumes_mid_window():
    straight, saved = _resume_run(save_at=5, total=11)
    resumed, _ = _resume_run(save_at=5, total=11, state=saved)
    for rank in range(WORKERS):
        assert resumed[rank][1] == straight[rank][1] == 11
        for got, want in zip(resumed[rank][0], straight[rank][0]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_load_state_dict_refuses_another_model():
    opt = _single([("w", nn.Parameter(torch.zeros(3)))])
    with pytest.raises(ValueError, match="global model of 2 elements, this model has 3"):
        opt.strategy.load_state_dict({"steps": 0, "global": torch.zeros(2), "skipped_nonfinite": 0})


def test_step_with_closure_returns_its_loss():
    w = nn.Parameter(torch.tensor([3.0]))
    opt = _single([("w", w)], window=1, overlap=False)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0
    assert w.item() == pytest.approx(3.0 - LR * 6.0)


def test_close_waits_for_exchange_in_flight_and_blocks_further_use():
    group = LoopbackGroup(2)
    out = {}

    def worker(rank):
        w = nn.Parameter(torch.zeros(2))
        transport = group.transport(rank)
        opt = DistributedOptimizer(torch.optim.SGD([w], lr=LR), named_parameters=[("w", w)],
                                   algorithm="hpsgd", transport=transport, window=1, overlap=True)
        w.grad = torch.full((2,), float(rank + 1))
        opt.step()  # its exchange is now in flight; the replica restarted from G = 0 plus its own change
        assert opt.strategy._pending is not None
        opt.close()
        opt.close()  # idempotent
        assert opt.strategy._pending is None
        with pytest.raises(RuntimeError, match="closed"):
            opt.step()
        with pytest.raises(RuntimeError, match="closed"):
            opt.load_global_model()
        # The transport is not closed and has nothing left half-done: the same names work again.
        out[rank] = transport.allreduce_(torch.ones(1) * rank, name="hpsgd.delta.0", op=ReduceOp.SUM)
        out[("w", rank)] = w.detach().clone()

    _run_workers(worker, 2)
    assert out[0].item() == out[1].item() == 1.0
    for rank in range(2):  # the averaged change was dropped, never merged: only the own one remains
        assert torch.equal(out[("w", rank)], torch.full((2,), -LR * (rank + 1)))


def test_zero_grad_between_steps_is_allowed():
    w = nn.Parameter(torch.ones(2))
    opt = _single([("w", w)], window=2)
    for _ in range(3):
        opt.zero_grad()
        assert w.grad is None
        w.grad = torch.ones(2)
        opt.step()
    opt.load_global_model()
    assert opt.stats()["exchanges"] == 2

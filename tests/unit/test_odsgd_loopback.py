"""od-sgd over the in-process loopback transport (its allreduce exchange), against float64 replays."""
import pytest
import torch

from hvd_async import DistributedOptimizer
from hvd_async.transport import LoopbackGroup
from reference import Quadratic, delayed_ssgd, odsgd
from threads import run_workers

WORKERS, STEPS = 3, 7


def _run_workers(target, workers=WORKERS):
    run_workers(target, workers)


def _train(group, rank, out, *, lr, momentum, weight_decay, steps=STEPS, **options):
    model = Quadratic()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                               weight_decay=weight_decay),
                               model.named_parameters(), algorithm="od-sgd",
                               transport=group.transport(rank), exchange="allreduce", **options)
    for t in range(steps):
        opt.zero_grad()
        model.loss(rank, t).backward()
        opt.step()
        out[("local", t, rank)] = model.w.detach().double().clone()
    opt.load_global_model()
    out[("global", rank)] = model.w.detach().double().clone()
    out[("stats", rank)] = opt.stats()
    opt.close()


@pytest.mark.parametrize("lr,momentum,weight_decay,local_lr,local_momentum", [
    (0.1, 0.0, 0.0, 0.05, 0.0),
    (0.2, 0.9, 0.01, 0.1, 0.5),
])
def test_global_and_local_weights_follow_the_recurrence(lr, momentum, weight_decay, local_lr, local_momentum):
    group, out = LoopbackGroup(WORKERS), {}
    _run_workers(lambda r: _train(group, r, out, lr=lr, momentum=momentum, weight_decay=weight_decay,
                                  local_lr=local_lr, local_momentum=local_momentum))
    history, final = odsgd(Quadratic().w.detach(), Quadratic.grad, WORKERS, STEPS, lr=lr,
                           momentum=momentum, weight_decay=weight_decay, local_lr=local_lr,
                           local_momentum=local_momentum)
    for t in range(STEPS):
        for m in range(WORKERS):
            torch.testing.assert_close(out[("local", t, m)], history[t][m], rtol=0, atol=1e-5,
                                       msg=lambda s: f"worker {m} after step {t}: {s}")
    for m in range(WORKERS):
        torch.testing.assert_close(out[("global", m)], final, rtol=0, atol=1e-5)
    stats = out[("stats", 0)]
    assert stats["staleness_hist"][:2] == [1, STEPS - 1]  # every gradient but the first is one step late
    assert stats["exchange_wait_seconds"] >= 0


def test_local_lr_zero_is_one_step_delayed_ssgd():
    group, out = LoopbackGroup(WORKERS), {}
    _run_workers(lambda r: _train(group, r, out, lr=0.3, momentum=0.0, weight_decay=0.0, local_lr=0.0))
    expected = delayed_ssgd(Quadratic().w.detach(), Quadratic.grad, WORKERS, STEPS, lr=0.3)
    for m in range(WORKERS):
        torch.testing.assert_close(out[("global", m)], expected, rtol=0, atol=1e-5)
    # and it is not plain ssgd: the delay changes the result
    plain = Quadratic().w.detach().double()
    for t in range(STEPS):
        plain = plain - 0.3 * sum(Quadratic.grad(m, t, plain) for m in range(WORKERS)) / WORKERS
    assert (out[("global", 0)] - plain).abs().max() > 1e-3


def test_local_schedule_follows_fixed_or_callable():
    group = LoopbackGroup(1)
    model = Quadratic()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), model.named_parameters(),
                               algorithm="od-sgd", transport=group.transport(0), exchange="allreduce",
                               local_lr=0.1)
    local = opt.strategy.local_optimizer
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model.loss(0, 0).backward()
    opt.step()
    sched.step()
    model.loss(0, 1).backward()
    opt.step()
    assert local.param_groups[0]["lr"] == pytest.approx(0.05)  # halved with the global rate
    opt.close()

    model = Quadratic()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), model.named_parameters(),
                               algorithm="od-sgd", transport=group.transport(0), exchange="allreduce",
                               local_lr=0.1, local_schedule=lambda step: 0.01 * (step + 1))
    for t in range(3):
        model.loss(0, t).backward()
        opt.step()
    assert opt.strategy.local_optimizer.param_groups[0]["lr"] == pytest.approx(0.03)
    opt.close()


def test_nonfinite_gradient_is_not_exchanged_or_applied():
    group, out = LoopbackGroup(2), {}

    def work(rank):
        model = Quadratic()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   algorithm="od-sgd", transport=group.transport(rank), exchange="allreduce")
        for t in range(3):
            opt.zero_grad()
            model.loss(rank, t).backward()
            if rank == 1 and t == 1:
                model.w.grad[2] = float("nan")
            opt.step()
        opt.load_global_model()
        out[rank] = (model.w.detach().clone(), opt.stats())
        opt.close()

    _run_workers(work, workers=2)
    w0, stats0 = out[0]
    w1, stats1 = out[1]
    assert torch.isfinite(w0).all() and torch.equal(w0, w1)
    assert (stats0["skipped_nonfinite"], stats1["skipped_nonfinite"]) == (0, 1)


@pytest.mark.parametrize("options,fragment", [
    ({"local_lr": -0.1}, "local_lr must be a finite number >= 0"),
    ({"local_momentum": 1.0}, "local_momentum must be in [0, 1), got 1.0"),
    ({"local_optimizer": "adam"}, "local_optimizer must be a callable"),
    ({"local_schedule": "cosine"}, "local_schedule must be 'follow', 'fixed' or a callable"),
    ({"exchange": "nccl"}, "exchange must be one of window, allreduce, got 'nccl'"),
    ({"window": 3}, "unknown option(s) 'window' for algorithm 'od-sgd'"),
])
def test_bad_options_name_the_value(options, fragment):
    model = Quadratic()
    with pytest.raises((ValueError, TypeError)) as info:
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             algorithm="od-sgd", transport=LoopbackGroup(1).transport(0), **options)
    assert fragment in str(info.value)


def test_global_step_needs_sgd_and_local_optimizer_may_be_any():
    model = Quadratic()
    with pytest.raises(TypeError, match="od-sgd applies its SGD rule on the parameter servers: wrap a torch.optim.SGD"):
        DistributedOptimizer(torch.optim.Adam(model.parameters()), model.named_parameters(),
                             algorithm="od-sgd", transport=LoopbackGroup(1).transport(0), exchange="allreduce")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                               algorithm="od-sgd", transport=LoopbackGroup(1).transport(0), exchange="allreduce",
                               local_optimizer=lambda params: torch.optim.Adam(params, lr=0.01))
    assert isinstance(opt.strategy.local_optimizer, torch.optim.Adam)
    before = model.w.detach().clone()
    model.loss(0, 0).backward()
    opt.step()
    assert not torch.equal(before, model.w.detach())
    opt.close()

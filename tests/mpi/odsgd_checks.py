"""od-sgd under mpirun, run by tests/test_odsgd.py: ``SERVERS=S python odsgd_checks.py [CHECK ...]``.

Both exchanges (the servers' windows and Horovod's allreduce among the workers) against the float64
replays of tests/reference.py; worker 0 prints ``ODSGD CHECKS OK`` at the end.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import hvd_async as ha  # noqa: E402
from harness import check, main  # noqa: E402
from reference import Quadratic, delayed_ssgd, odsgd  # noqa: E402

STEPS = 9


def _train(steps=STEPS, *, lr, momentum=0.0, weight_decay=0.0, nan_at=None, sync_at=(), **options):
    rank = ha.rank()
    model = Quadratic(numel=7)  # 7 elements over 2 shards: 4 and 3
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                                  weight_decay=weight_decay),
                                  model.named_parameters(), algorithm="od-sgd", **options)
    local = []
    for t in range(steps):
        opt.zero_grad()
        model.loss(rank, t).backward()
        if nan_at == (rank, t):
            model.w.grad[0] = float("inf")
        opt.step()
        local.append(model.w.detach().double().clone())
        if t in sync_at:
            opt.load_global_model()
    opt.load_global_model()
    final = model.w.detach().double().clone()
    stats = opt.stats()
    opt.close()
    return local, final, stats


def _same_everywhere(final, what):
    everyone = ha.worker_comm().allgather(final)
    check(all(torch.equal(everyone[0], x) for x in everyone), f"{what}: workers disagree: {everyone}")


def recurrence():
    """Local and global weights equal the hand replay, through either exchange."""
    workers, rank = ha.size(), ha.rank()
    settings = dict(lr=0.2, momentum=0.9, weight_decay=0.01, local_lr=0.1, local_momentum=0.5)
    history, expected = odsgd(Quadratic(numel=7).w.detach(), Quadratic.grad, workers, STEPS, **settings)
    for exchange in ("window", "allreduce"):
        local, final, stats = _train(exchange=exchange, **settings)
        for t in range(STEPS):
            err = (local[t] - history[t][rank]).abs().max().item()
            check(err < 1e-5, f"{exchange}: worker {rank} after step {t} is {err:.2e} off the replay")
        err = (final - expected).abs().max().item()
        check(err < 1e-5, f"{exchange}: final global weights {err:.2e} off the replay")
        check(stats["staleness_hist"][:2] == [1, STEPS - 1], f"{exchange}: staleness {stats['staleness_hist'][:3]}")
        _same_everywhere(final, exchange)


def delayed():
    """local_lr=0 is synchronous SGD one step late."""
    expected = delayed_ssgd(Quadratic(numel=7).w.detach(), Quadratic.grad, ha.size(), STEPS, lr=0.3)
    for exchange in ("window", "allreduce"):
        _, final, _ = _train(lr=0.3, local_lr=0.0, exchange=exchange)
        err = (final - expected).abs().max().item()
        check(err < 1e-5, f"{exchange}: local_lr=0 is {err:.2e} off one-step-delayed ssgd")


def synchronize_midway():
    """synchronize() in the middle (an epoch end) restarts everyone from the global weights; the
    replay restarted there gives the same weights."""
    workers = ha.size()
    settings = dict(lr=0.2, local_lr=0.1)
    _, mid = odsgd(Quadratic(numel=7).w.detach(), Quadratic.grad, workers, 4, **settings)
    shifted = lambda m, t, w: Quadratic.grad(m, t + 4, w)  # noqa: E731
    _, expected = odsgd(mid, shifted, workers, 5, **settings)
    for exchange in ("window", "allreduce"):
        local, final, stats = _train(lr=0.2, local_lr=0.1, exchange=exchange, sync_at=(3,))
        err = (final - expected).abs().max().item()
        check(err < 1e-5, f"{exchange}: synchronize midway gave weights {err:.2e} off the replay")
        check(stats["staleness_hist"][:2] == [2, STEPS - 2], f"{exchange}: staleness {stats['staleness_hist'][:3]}")
        _same_everywhere(final, exchange)


def nonfinite():
    """An infinite gradient on the last worker is neither exchanged nor applied; nobody hangs."""
    last = ha.size() - 1
    for exchange in ("window", "allreduce"):
        _, final, stats = _train(lr=0.1, exchange=exchange, nan_at=(last, 2))
        check(bool(torch.isfinite(final).all()), f"{exchange}: non-finite weights {final}")
        check(stats["skipped_nonfinite"] == (1 if ha.rank() == last else 0), f"{exchange}: {stats}")
        _same_everywhere(final, exchange)


OVERLAP_NUMEL = 1 << 23  # 32 MB of float32: an exchange whose time can be measured


def _blocked_per_step(exchange: str, compute_s: float, steps: int = 8) -> float:
    """Seconds a step waited for the exchange in flight, per step, with ``compute_s`` of compute
    (a sleep, which leaves the cores to the exchange) between one step and the next."""
    w = torch.nn.Parameter(torch.zeros(OVERLAP_NUMEL))
    opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=0.01), [("w", w)], algorithm="od-sgd",
                                  exchange=exchange)
    w.grad = torch.full_like(w, 1e-3)
    opt.step()  # begins the exchange; this step had nothing in flight to wait for
    before = opt.stats()["exchange_wait_seconds"]
    for _ in range(steps):
        time.sleep(compute_s)
        opt.step()
    blocked = (opt.stats()["exchange_wait_seconds"] - before) / steps
    opt.load_global_model()
    opt.close()
    return blocked


def overlap():
    """The exchange runs while the worker computes: with compute to hide behind, a step blocks for
    well under the exchange's own time (what a step blocks for with no compute between steps).
    Means over the workers: one worker's wait also holds the scheduler's jitter on a loaded machine.
    The allreduce exchange at one worker is only the global step, done as the step waits: nothing to hide."""
    comm = ha.worker_comm()
    for exchange in ("window", "allreduce") if comm.size > 1 else ("window",):
        bare = comm.allreduce(_blocked_per_step(exchange, 0.0)) / comm.size
        compute = max(0.02, 3.0 * bare)
        hidden = comm.allreduce(_blocked_per_step(exchange, compute)) / comm.size
        if ha.rank() == 0:
            print(f"{exchange}: blocked {1e3 * bare:.2f} ms per step with no compute, {1e3 * hidden:.2f} ms "
                  f"with {1e3 * compute:.0f} ms of compute ({hidden / bare:.3f})", flush=True)
        check(bare > 5e-4, f"{exchange}: the exchange of {OVERLAP_NUMEL} floats took only {1e3 * bare:.3f} ms; "
                           "too short to show overlap")
        check(hidden < 0.5 * bare, f"{exchange}: blocked {1e3 * hidden:.2f} ms per step behind {1e3 * compute:.0f} "
                                   f"ms of compute, against {1e3 * bare:.2f} ms with none: the exchange is not hidden")

CHECKS = {f.__name__: f for f in (recurrence, delayed, synchronize_midway, nonfinite, overlap)}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "ODSGD CHECKS OK")

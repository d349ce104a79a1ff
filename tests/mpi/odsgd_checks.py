"""od-sgd under mpirun, run by tests/test_odsgd.py: ``SERVERS=S python odsgd_checks.py [CHECK ...]``.

Both exchanges (the servers' windows and Horovod's allreduce among the workers) against the float64
replays of tests/reference.py; worker 0 prints ``ODSGD CHECKS OK`` at the end.
"""
import os
import sys
import threading
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


def _watch(opt, exchange):
    """Instrument the exchange. Window: each exchange, on its comm thread, first waits for a gate the
    check opens only after step() returned (so a step that waited for its own exchange would stall
    until the gate gave up). Allreduce: the step that starts each handle and the step that waits for
    it. Returns (open_gate, log): log's entries are ("held", gate opened in time) or ("start"|"wait",
    step, handle)."""
    side, log, gate, steps = opt.strategy.exchange, [], threading.Event(), [0]
    if exchange == "window":
        run = side._exchange

        def gated(payload):
            log.append(("held", gate.wait(30)))
            return run(payload)

        side._exchange = gated
    else:
        transport = side.transport
        start, wait = transport.allreduce_async_, transport.synchronize

        def started(*args, **kwargs):
            handle = start(*args, **kwargs)
            log.append(("start", steps[0], handle))
            return handle

        def waited(handle):
            log.append(("wait", steps[0], handle))
            return wait(handle)

        transport.allreduce_async_, transport.synchronize = started, waited
    return gate, log, steps


def overlap():
    """The exchange runs while the worker computes: a step begins the exchange and returns without
    waiting for it (window: its exchange is held on the comm thread until step() returned; allreduce:
    each handle is waited for by the next step, never by the step that started it), and the exchange
    then completes with nothing but the worker's compute going on (the comm thread's or Horovod's own
    progress). How much of the exchange's time this hides is measured, not asserted, by
    benchmarks/speed/odsgd_blocking.py."""
    import horovod.torch as hvd

    comm = ha.worker_comm()
    for exchange in ("window", "allreduce") if comm.size > 1 else ("window",):
        w = torch.nn.Parameter(torch.zeros(1 << 16))
        opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=0.01), [("w", w)], algorithm="od-sgd",
                                      exchange=exchange)
        gate, log, steps = _watch(opt, exchange)
        side = opt.strategy.exchange
        for step in range(4):
            w.grad = torch.full_like(w, 1e-3)
            gate.clear()
            steps[0] = step
            opt.step()
            gate.set()
            if exchange == "window":
                done = side.future.done
            else:  # no handle left: the step already waited for it (the log below says so)
                done = lambda: side.handle is None or hvd.poll(side.handle)  # noqa: E731
            deadline = time.monotonic() + 60  # the compute: only wait, never call into the optimizer
            while not done() and time.monotonic() < deadline:
                time.sleep(0.001)
            check(done(), f"{exchange}: step {step}'s exchange did not complete in 60 s while the worker "
                          "computed: it only progresses when a step waits for it")
        opt.load_global_model()
        opt.close()
        if exchange == "window":
            check(len(log) == 4 and all(ok for _, ok in log),
                  f"{exchange}: a step waited for its own exchange (held until step() returned): {log}")
        else:
            began = {h: t for kind, t, h in log if kind == "start"}  # Horovod handles are ints
            waits = [(began.get(h), t) for kind, t, h in log if kind == "wait"]
            check(len(began) == 4 and all(b is not None and t > b for b, t in waits[:3]),
                  f"{exchange}: (started in step, waited for in step) {waits}: a step waited for its own exchange")


CHECKS = {f.__name__: f for f in (recurrence, delayed, synchronize_midway, nonfinite, overlap)}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "ODSGD CHECKS OK")

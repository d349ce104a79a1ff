"""od-sgd under mpirun, run by tests/test_odsgd.py: ``SERVERS=S python odsgd_checks.py [CHECK ...]``.

Both exchanges (the servers' windows and Horovod's allreduce among the workers) against the float64
replays of tests/reference.py; worker 0 prints ``ODSGD CHECKS OK`` at the end.
"""
import os
import statistics
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


def _blocked_per_step(exchange: str, compute_s: float, steps: int = 8):
    """(seconds a step waited for the exchange in flight, seconds the exchange itself took), each the
    median over ``steps`` steps (a step the loaded machine's scheduler held up does not count for the
    rest), with ``compute_s`` of compute (a sleep, which leaves the cores to the exchange) between one
    step and the next. The exchange's own time is timed on its thread (window exchange only; None for
    the allreduce, which Horovod's thread runs)."""
    w = torch.nn.Parameter(torch.zeros(OVERLAP_NUMEL))
    opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=0.01), [("w", w)], algorithm="od-sgd",
                                  exchange=exchange)
    own, spans, marks = [], [], []  # marks: ("go", when start() returned), ("stop", when finish() was called)
    if exchange == "window":
        worker_side = opt.strategy.exchange
        untimed, start_, finish_ = worker_side._exchange, worker_side.start, worker_side.finish

        def start(*args):
            start_(*args)
            marks.append(("go", time.perf_counter()))

        def finish():
            marks.append(("stop", time.perf_counter()))
            finish_()

        worker_side.start, worker_side.finish = start, finish

        def timed(header):
            began = time.perf_counter()
            answers = untimed(header)
            ended = time.perf_counter()
            own.append(ended - began)
            spans.append((began, ended))
            return answers

        worker_side._exchange = timed
    w.grad = torch.full_like(w, 1e-3)
    opt.step()  # begins the exchange; this step had nothing in flight to wait for
    waits = []
    for _ in range(steps):
        time.sleep(compute_s)
        before = opt.stats()["exchange_wait_seconds"]
        opt.step()
        waits.append(opt.stats()["exchange_wait_seconds"] - before)
    opt.load_global_model()
    opt.close()
    if compute_s and spans:  # the exchange ran while the worker computed (from start()'s return to finish())
        computing = [(a, b) for (k, a), (j, b) in zip(marks, marks[1:]) if (k, j) == ("go", "stop")]
        during = statistics.median(sum(max(0.0, min(e, b) - max(s, a)) for a, b in computing) / (e - s)
                                   for s, e in spans)  # per exchange (a stalled one does not outweigh the rest)
        check(during > 0.5, f"{exchange}: the median exchange ran {during:.0%} of its time while the worker "
                            f"computed (from start() returning to the next finish())")
    return statistics.median(waits), (statistics.median(own) if own else None)


def overlap():
    """The exchange runs while the worker computes: with compute to hide behind, a step blocks for
    well under the exchange's own time (the window exchange: timed on its thread; the allreduce: what
    a step blocks for with no compute between steps). Means over the workers of medians over steps.
    The allreduce exchange at one worker is only the global step, done as the step waits: nothing to hide."""
    comm = ha.worker_comm()
    for exchange in ("window", "allreduce") if comm.size > 1 else ("window",):
        bare, own = _blocked_per_step(exchange, 0.0)
        own = bare if own is None else own
        # one compute time for every worker (the largest): each timed its own exchange, and a worker that
        # computed less would wait in the allreduce for the others' longer compute, not for the exchange
        compute = max(comm.allgather(max(0.02, 5.0 * max(bare, own))))
        # up to three runs: on an oversubscribed machine (more ranks than cores, CI) one run's steps can
        # be held up by the scheduler; an exchange that is not overlapped blocks for its whole time in
        # every run (the figures are means over the workers, so every rank takes the same branch)
        for attempt in range(3):
            hidden, own_then = _blocked_per_step(exchange, compute)
            own_run = own if own_then is None else own_then  # timed in the same run as the compute
            own_run, hidden = comm.allreduce(own_run) / comm.size, comm.allreduce(hidden) / comm.size
            if hidden < 0.5 * own_run:
                break
            if ha.rank() == 0:
                print(f"{exchange}: run {attempt + 1} blocked {1e3 * hidden:.2f} ms of {1e3 * own_run:.2f} ms; "
                      f"measuring again", flush=True)
        own = own_run
        if ha.rank() == 0:
            print(f"{exchange}: the exchange takes {1e3 * own:.2f} ms; a step blocked {1e3 * hidden:.2f} ms "
                  f"behind {1e3 * compute:.0f} ms of compute ({hidden / own:.3f})", flush=True)
        check(own > 5e-4, f"{exchange}: the exchange of {OVERLAP_NUMEL} floats took only {1e3 * own:.3f} ms; "
                          "too short to show overlap")
        check(hidden < 0.5 * own, f"{exchange}: blocked {1e3 * hidden:.2f} ms per step behind {1e3 * compute:.0f} "
                                  f"ms of compute, against the exchange's own {1e3 * own:.2f} ms: it is not hidden")


CHECKS = {f.__name__: f for f in (recurrence, delayed, synchronize_midway, nonfinite, overlap)}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "ODSGD CHECKS OK")

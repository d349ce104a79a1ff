"""Parameter-server checks, run by tests/test_ps.py under mpirun: ``SERVERS=S python ps_checks.py [CHECK ...]``.

Server ranks serve and print what they hosted; workers run the named checks in order (all when none
is named) and worker 0 prints ``PS CHECKS OK`` at the end. A failing check aborts the whole job, so
no rank is left waiting.
"""
import os
import sys

import numpy as np
import torch

import hvd_async as ha
from harness import check, main, say
from hvd_async.algorithms.payload import SGDPayload
from hvd_async.transport import window as W

NUMEL = 1001  # not a multiple of 2: the shards differ in length
SCALE = float(os.environ.get("PS_SCALE", "1"))  # fewer pushes where every one crosses a slow link


def integer_grad(rank: int, i: int, numel: int = NUMEL) -> torch.Tensor:
    base = (torch.arange(numel) % 7 - 3).float()
    return base * float(i % 5 - 2) + float(rank + 1)


def integer_init(numel: int = NUMEL) -> torch.Tensor:
    return (torch.arange(numel) % 11).float()


# the server programs' options as the servers receive them (every field): dc-asgd uncompensated with
# no look-ahead and no push clip, softsync with one shared buffer at the full rate
DC_PLAIN = {"lam": 0.0, "adaptive": False, "ms_momentum": 0.95, "lookahead": False, "push_clip": 0.0}
SOFTSYNC_PLAIN = {"staleness_lr": False, "server_momentum": "shared", "push_rate": "full", "lookahead": False}


def open_transport(algorithm, mode, options, numel=NUMEL):
    return W.WindowTransport(numel, comms=ha.runtime.comms(), algorithm=algorithm, mode=mode, options=options)


def no_lost_update():
    """Thousands of concurrent integer pushes with lr=1: the global weights lose none of them."""
    workers, rank = ha.size(), ha.rank()
    cases = [("asgd", "accumulate", {}, int(1500 * SCALE)),
             ("dc-asgd", "mailbox", DC_PLAIN, int(400 * SCALE)),
             ("softsync", "mailbox", dict(SOFTSYNC_PLAIN, n=workers), int(400 * SCALE)),
             ("lc-asgd", "mailbox", dict(DC_PLAIN, loss_term=False), int(200 * SCALE))]
    for algorithm, mode, options, pushes in cases:
        t = open_transport(algorithm, mode, options)
        flat = integer_init().clone() if rank == 0 else torch.zeros(NUMEL)
        t.publish_(flat)
        bad = torch.nonzero(flat != integer_init()).flatten()
        check(len(bad) == 0, f"{algorithm}: publish_ gave other weights at {bad[:5].tolist()}..{bad[-5:].tolist()}: {flat[bad[:5]].tolist()}")
        pushed = torch.zeros(NUMEL, dtype=torch.float64)
        hist = np.zeros((t.servers, W.HIST_BINS), dtype=np.int64)
        last = np.full(t.servers, -1)
        for i in range(pushes):
            g = integer_grad(rank, i)
            if mode == "accumulate":
                if i % 10 == 7:  # push and read in one call (asgd's step)
                    staleness = t.accumulate_and_pull(-g, flat)
                elif i % 2:  # the non-blocking form, finished after some local work
                    pending = t.accumulate_async(-g)
                    g.sum()
                    staleness = pending.wait()
                else:
                    staleness = t.accumulate(-g)  # the delta of w -= 1 * g
                versions = t.latest_versions.copy()
                if i % 10 == 0:
                    t.pull(flat)
                elif i % 10 == 3:
                    t.pull(flat, after_push=True)
                elif i % 10 == 5:
                    t.pull_async(flat).wait()
            elif i % 2:
                answers = t.request_async(W.Kind.PUSH, grad=g, out=flat, payload=SGDPayload(lr=1.0).encode()).wait()
            else:
                answers = t.push(g, flat, SGDPayload(lr=1.0).encode())
            if mode == "mailbox":
                check(answers.all(W.Status.APPLIED), f"{algorithm}: push refused")
                staleness, versions = answers.staleness, answers.versions
            check((versions > last).all(), f"{algorithm}: versions went {last} -> {versions}")
            last = versions
            for k, s in enumerate(staleness):
                hist[k, min(int(s), W.HIST_BINS - 1)] += 1
            pushed += g.double()
        t.read_stats()  # also hands this worker's staleness counts still held locally to the servers
        total = ha.worker_comm().allreduce(pushed.numpy())
        all_hist = ha.worker_comm().allreduce(hist)
        t.barrier()
        t.pull(flat)
        flat.data = torch.zeros_like(flat)  # new storage under the same tensor: the transport must
        t.pull(flat)  # read into it, not into the old one whose views it cached
        expected = integer_init().double().numpy() - total
        check(np.array_equal(flat.double().numpy(), expected),
              f"{algorithm}: {int((flat.double().numpy() != expected).sum())} element(s) lost updates")
        for k, row in enumerate(t.read_stats()):
            check(row["version"] == pushes * workers and row["pushes"] == pushes * workers,
                  f"{algorithm}: shard {k} counted {row}, expected {pushes * workers} pushes")
            check(row["staleness_hist"] == all_hist[k].tolist(),
                  f"{algorithm}: shard {k} staleness counted by the server {row['staleness_hist'][:8]} "
                  f"!= reported by the workers {all_hist[k][:8].tolist()}")
        t.barrier()
        t.close()


def _round_robin(opt, param, grads, *, rounds, losses=None):
    """Workers push in turn (worker t % W at turn t), each push finished before the next starts."""
    workers, rank = ha.size(), ha.rank()
    opt.begin()  # collective: before the turns, where one worker steps while the others wait in a barrier
    for turn in range(rounds * workers):
        if turn % workers == rank:
            param.grad = grads[turn].clone()
            opt.step(loss=None if losses is None else losses[turn])
        ha.worker_comm().Barrier()
    opt.load_global_model()
    return param.detach().clone()


def _sequence(numel, turns, *, integer, seed=5):
    gen = torch.Generator().manual_seed(seed)
    if integer:
        return [torch.randint(-4, 5, (numel,), generator=gen).float() for _ in range(turns)]
    return [torch.randn(numel, generator=gen) for _ in range(turns)]


def _plain(algorithm, options):
    """The options of a check that replays a rule's arithmetic by hand: dc-asgd's and lc-asgd's push clip
    off unless the check sets it (the clip is checked in tests/unit/test_ps_rules.py)."""
    if algorithm in ("dc-asgd", "lc-asgd") and "push_clip" not in options:
        return dict(options, push_clip=0.0)
    return options


def _run(algorithm, init, grads, *, lr, momentum=0.0, rounds, losses=None, **options):
    param = torch.nn.Parameter(init.clone())
    opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=lr, momentum=momentum),
                                  named_parameters=[("w", param)], algorithm=algorithm, **_plain(algorithm, options))
    final = _round_robin(opt, param, grads, rounds=rounds, losses=losses)
    opt.close()
    return final


def dc_formula():
    """dc-asgd's server steps equal the paper's formula replayed by hand, for a fixed sequence."""
    workers, numel, rounds = ha.size(), 37, 5
    init = torch.linspace(-1, 1, numel)
    grads = _sequence(numel, rounds * workers, integer=False)
    for lam, adaptive, momentum, lookahead, kept in ((0.5, False, 0.0, False, "per-worker"),
                                                     (0.3, True, 0.0, False, "per-worker"),
                                                     (0.5, False, 0.5, False, "per-worker"),
                                                     (0.5, False, 0.5, True, "per-worker"),
                                                     (0.5, False, 0.5, False, "shared"),
                                                     (0.5, True, 0.5, True, "shared")):
        got = _run("dc-asgd", init, grads, lr=0.1, momentum=momentum, rounds=rounds, lam=lam,
                   adaptive=adaptive, ms_momentum=0.9, lookahead=lookahead, server_momentum=kept)
        # by hand, in float64: w <- w - lr * buf_m, buf_m <- mom * buf_m + g + lam_t * g * g * (w - bak_m);
        # the backup is what worker m received: w, or with the look-ahead w - lr * mom * sum_k buf_k.
        # One shared buffer: every m steps buf_0, and the look-ahead is w - lr * (mom + ... + mom**W) * buf_0
        w = init.double().numpy().copy()
        backup = [w.copy() for _ in range(workers)]
        buf = [np.zeros(numel) for _ in range(workers)]
        ms = np.zeros(numel)
        for turn, g in enumerate(grads):
            m, g = turn % workers, g.double().numpy()
            b = 0 if kept == "shared" else m
            ms = 0.9 * ms + 0.1 * g * g
            lam_t = lam / np.sqrt(ms + 1e-7) if adaptive else lam
            buf[b] = momentum * buf[b] + g + lam_t * g * g * (w - backup[m])
            w = w - 0.1 / workers * buf[b]  # push_rate 'average' (the default): lr / workers per push
            if not lookahead:
                backup[m] = w.copy()
            elif kept == "shared":
                backup[m] = w - 0.1 / workers * sum(momentum ** j for j in range(1, workers + 1)) * buf[0]
            else:
                backup[m] = w - 0.1 / workers * momentum * sum(buf)
        check(np.allclose(got.double().numpy(), w, rtol=1e-5, atol=1e-5),
              f"dc-asgd lam={lam} adaptive={adaptive} momentum={momentum} lookahead={lookahead} {kept}: max "
              f"error {np.abs(got.double().numpy() - w).max()}")


def lc_formula():
    """lc-asgd's server steps equal a float64 replay: each worker's own loss history and predictor
    (a replay that pools the workers' histories gives other weights), scale r times dc-asgd's step."""
    from hvd_async.rules.loss_prediction import make_predictor

    workers, numel, rounds, lam, lr = ha.size(), 23, 8, 0.3, 0.1
    init = torch.linspace(-1, 1, numel)
    grads = _sequence(numel, rounds * workers, integer=False, seed=7)
    # worker m's k-th report: a decaying curve of its own (m shifts its level and its rate)
    losses = [(1 + (t % workers)) * float(np.exp(-0.15 * (1 + t % workers) * (t // workers))) + 0.1
              for t in range(rounds * workers)]
    got = _run("lc-asgd", init, grads, lr=lr, rounds=rounds, losses=losses, lam=lam, adaptive=False,
               min_history=2)

    def replay(pooled):
        w = init.double().numpy().copy()
        backup = [w.copy() for _ in range(workers)]
        held, version = [0] * workers, 0
        own = [make_predictor("linear", min_history=2) for _ in range(workers)]
        shared = make_predictor("linear", min_history=2)
        for turn, g in enumerate(grads):
            m, g, loss = turn % workers, g.double().numpy(), losses[turn]
            predictor = shared if pooled else own[m]
            predictor.observe(held[m], loss)
            r = 1.0
            if predictor.ready:  # the predictor's own loss now over its loss at the version pulled
                r = min(max(np.sqrt(predictor.predict(version) / predictor.predict(held[m])), 0.25), 1.0)
            w = w - lr / workers * r * (g + lam * g * g * (w - backup[m]))
            version += 1
            backup[m], held[m] = w.copy(), version
        return w

    want = replay(pooled=False)
    err = np.abs(got.double().numpy() - want).max()
    check(err < 1e-4, f"lc-asgd: {err:.2e} off the per-worker replay")
    if workers > 1:
        pooled = np.abs(got.double().numpy() - replay(pooled=True)).max()
        check(pooled > 10 * max(err, 1e-6), f"lc-asgd: a pooled-history replay is as close ({pooled:.2e})")
    dc = _run("dc-asgd", init, grads, lr=lr, rounds=rounds, lam=lam, adaptive=False)
    off = _run("lc-asgd", init, grads, lr=lr, rounds=rounds, losses=losses, lam=lam, adaptive=False,
               loss_term=False)
    check(torch.equal(off, dc), f"lc-asgd without the loss term != dc-asgd: {(off - dc).abs().max()}")
    check(workers == 1 or not torch.equal(got, dc), "lc-asgd's loss term changed nothing")


def dbs_cursor():
    """dbs-asgd's shared cursor and speed table through the windows: concurrent draws of random
    sizes cover every sample exactly once per epoch; every worker reads the speeds all wrote."""
    from hvd_async.sampling import SharedCursorBatches

    workers, rank, n = ha.size(), ha.rank(), 53
    t = open_transport("dbs-asgd", "accumulate", {})
    batches = SharedCursorBatches(n, seed=3, fetch_add=t.fetch_add_counter)
    rng = np.random.default_rng(rank)
    claims = []
    while not claims or claims[-1][0] < 3 * n:
        size = int(rng.integers(1, 12))
        start = t.fetch_add_counter(size)
        claims.append((start, batches.indices(start, size)))
    everyone = t.allgather_object(claims)
    if rank == 0:
        positions = sorted((start + k, i) for mine in everyone for start, idx in mine for k, i in enumerate(idx))
        check([p for p, _ in positions] == list(range(len(positions))), "cursor positions overlap or skip")
        for epoch in range(3):
            seen = sorted(i for p, i in positions if p // n == epoch)
            check(seen == list(range(n)), f"epoch {epoch}: not every sample exactly once")
    t.publish_value(rank + 0.5)
    t.barrier()
    values = t.read_values()
    check(values.tolist() == [m + 0.5 for m in range(workers)], f"speed table {values}")
    t.close()


def equivalences():
    """With the whole rate per push: dc-asgd with lam=0 and softsync with n=workers (rate not scaled)
    equal asgd exactly; softsync with the rate scaled follows g / max(1, staleness); 1-softsync equals
    ssgd's averaging. With the default push_rate='average', each push is lr / workers."""
    workers, numel, rounds = ha.size(), 29, 6
    init = (torch.arange(numel) % 5).float()
    grads = _sequence(numel, rounds * workers, integer=True)  # with lr=0.5 every sum is exact
    full = {"push_rate": "full"}
    asgd = _run("asgd", init, grads, lr=0.5, rounds=rounds, **full)
    dc0 = _run("dc-asgd", init, grads, lr=0.5, rounds=rounds, lam=0.0, **full)
    soft = _run("softsync", init, grads, lr=0.5, rounds=rounds, n=workers, staleness_lr=False, **full)
    check(torch.equal(dc0, asgd), f"dc-asgd lam=0 != asgd: {(dc0 - asgd).abs().max()}")
    check(torch.equal(soft, asgd), f"softsync n=workers != asgd: {(soft - asgd).abs().max()}")
    lazy = _run("asgd", init, grads, lr=0.5, rounds=rounds, pull_every=3, **full)  # plain SGD's deltas do not
    check(torch.equal(lazy, asgd), "asgd pull_every=3 lost or repeated a push")  # depend on the weights
    scaled = _run("softsync", init, grads, lr=0.5, rounds=rounds, n=workers, staleness_lr=True, **full)
    w = init.double().numpy().copy()
    for turn, g in enumerate(grads):  # round robin: worker m last received the weights of its turn
        staleness = min(turn, workers - 1)
        w = w - 0.5 * g.double().numpy() / max(1, staleness)
    check(np.allclose(scaled.double().numpy(), w, rtol=1e-6, atol=1e-6), "softsync's scaled rate is off")
    # the default, push_rate='average': every algorithm's round of pushes is one step of lr / workers each
    want = init.double().numpy() - 0.5 / workers * sum(g.double().numpy() for g in grads)
    for algorithm, options in (("asgd", {}), ("dc-asgd", {"lam": 0.0}), ("softsync", {"n": workers})):
        got = _run(algorithm, init, grads, lr=0.5, rounds=rounds, **options).double().numpy()
        check(np.allclose(got, want, rtol=1e-6, atol=1e-6), f"{algorithm}: push_rate='average' is off "
              f"by {np.abs(got - want).max():.2e}")

    # 1-softsync: every worker pushes each round; the server averages all of them (like ssgd)
    def lockstep(algorithm, **options):
        param = torch.nn.Parameter(init.clone())
        opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.5), named_parameters=[("w", param)],
                                      algorithm=algorithm, **_plain(algorithm, options))
        for r in range(rounds):
            param.grad = grads[r * workers + ha.rank()].clone()
            opt.step()
        if algorithm != "ssgd":
            check(opt.stats()["staleness_max"] == 0, "1-softsync reported stale gradients")
            opt.load_global_model()
        opt.close()
        return param.detach().clone()

    sync = lockstep("softsync", n=1)
    check(torch.allclose(sync, lockstep("ssgd"), rtol=1e-6, atol=1e-6), "1-softsync != ssgd")


def asgd_lookahead():
    """asgd's look-ahead: after each pull a worker holds ``w + momentum * (w - w of its previous pull)``
    (float64 replay of a round robin with SGD momentum; two parameter groups, the second without
    momentum in the last case); the pushes, so the global weights, are plain asgd's; with
    ``lookahead=False`` the worker holds the pulled ``w``."""
    workers, rank, sizes, rounds, lr = ha.size(), ha.rank(), (7, 6), 4, 0.5
    numel = sum(sizes)
    init = (torch.arange(numel) % 5).float()
    grads = _sequence(numel, rounds * workers, integer=True)
    for lookahead, momenta in ((True, (0.9, 0.9)), (False, (0.9, 0.9)), (True, (0.9, 0.0))):
        params = [torch.nn.Parameter(part.clone()) for part in init.split(sizes)]
        groups = [{"params": [p], "momentum": mu} for p, mu in zip(params, momenta)]
        opt = ha.DistributedOptimizer(torch.optim.SGD(groups, lr=lr), named_parameters=[("a", params[0]), ("b", params[1])],
                                      algorithm="asgd", lookahead=lookahead)
        opt.begin()  # collective: before the turns
        for turn in range(rounds * workers):
            if turn % workers == rank:
                for p, g in zip(params, grads[turn].split(sizes)):
                    p.grad = g.clone()
                opt.step()
            ha.worker_comm().Barrier()
        held = torch.cat([p.detach().double() for p in params])
        opt.load_global_model()
        final = torch.cat([p.detach().double() for p in params])
        opt.close()
        mu = torch.cat([torch.full((n,), m, dtype=torch.float64) for n, m in zip(sizes, momenta)])
        w, buf = init.double(), [torch.zeros(numel, dtype=torch.float64)] * workers
        previous, model = [None] * workers, [w] * workers
        for turn, g in enumerate(grads):
            m = turn % workers
            buf[m] = mu * buf[m] + g.double()
            w = w - lr / workers * buf[m]  # push_rate='average'
            model[m] = w + mu * (w - previous[m]) if lookahead and previous[m] is not None else w
            previous[m] = w
        case = f"asgd lookahead={lookahead} momenta={momenta}"
        check(torch.allclose(final, w, rtol=1e-5, atol=1e-4), f"{case}: global weights off by {(final - w).abs().max():.2e}")
        check(torch.allclose(held, model[rank], rtol=1e-5, atol=1e-4),
              f"{case}: worker {rank} holds weights off by {(held - model[rank]).abs().max():.2e}")


def nonfinite():
    """A NaN gradient is skipped and counted, never applied; the others still are."""
    workers, rank, numel = ha.size(), ha.rank(), 11
    init = (torch.arange(numel) % 3).float()
    grads = _sequence(numel, 2 * workers, integer=True)
    poisoned = [g.clone() for g in grads]
    poisoned[0][3] = float("nan")  # worker 0's first push
    for algorithm in ("asgd", "dc-asgd", "softsync"):
        options = {"lam": 0.0, "push_rate": "full"} if algorithm == "dc-asgd" else {"push_rate": "full"}
        if algorithm == "softsync":
            options = {"n": workers, "staleness_lr": False, "push_rate": "full"}
        param = torch.nn.Parameter(init.clone())
        opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.5), named_parameters=[("w", param)],
                                      algorithm=algorithm, **_plain(algorithm, options))
        _round_robin(opt, param, poisoned, rounds=2)
        check(opt.stats()["skipped_nonfinite"] == (1 if rank == 0 else 0),
              f"{algorithm}: skipped_nonfinite={opt.stats()['skipped_nonfinite']}")
        expected = init - 0.5 * sum(grads[1:])
        check(torch.equal(param.detach(), expected), f"{algorithm}: the NaN push changed the weights")
        opt.close()
    # a NaN that reaches a server directly is refused there too
    t = open_transport("dc-asgd", "mailbox", DC_PLAIN, numel)
    flat = init.clone()
    t.publish_(flat)
    answers = t.push(torch.full((numel,), float("inf")), flat, SGDPayload(lr=1.0).encode())
    check(answers.all(W.Status.SKIPPED), "server applied an infinite gradient")
    check(torch.equal(flat, init), "an infinite gradient reached the weights")
    t.barrier()
    t.close()


def _expect_error(exc_type, fragment, make):
    try:
        make()
    except exc_type as exc:
        check(fragment in str(exc), f"error {str(exc)!r} does not say {fragment!r}")
        return
    raise AssertionError(f"expected {exc_type.__name__} saying {fragment!r}")


def bad_input():
    """Bad values fail on every worker at construction, before any window opens, and nothing hangs."""
    workers, rank = ha.size(), ha.rank()

    def make(algorithm, shape=(2, 3), optimizer=torch.optim.SGD, **options):
        param = torch.nn.Parameter(torch.zeros(shape))
        return ha.DistributedOptimizer(optimizer([param], lr=0.1), named_parameters=[("layer.weight", param)],
                                       algorithm=algorithm, **options)

    if workers > 1:
        shape = (3, 3) if rank == workers - 1 else (2, 3)
        _expect_error(ValueError, "'layer.weight' (2, 3) torch.float32 on worker 0 but 'layer.weight' "
                                  "(3, 3)", lambda: make("asgd", shape=shape))
    _expect_error(ValueError, f"between 1 and the number of workers ({workers}), got {workers + 1}",
                  lambda: make("softsync", n=workers + 1))
    _expect_error(ValueError, "lam must be a number >= 0", lambda: make("dc-asgd", lam=-0.1))
    _expect_error(ValueError, "pull_every must be an integer >= 1", lambda: make("asgd", pull_every=0))
    _expect_error(TypeError, "wrap a torch.optim.SGD (got Adam)",
                  lambda: make("dc-asgd", optimizer=torch.optim.Adam))
    _expect_error(TypeError, "unknown option(s) 'lamda'", lambda: make("dc-asgd", lamda=0.1))
    opt = make("asgd")  # the servers still answer after all that
    opt.close()


def shutdown():
    """A worker that finishes early does not hold up the others; serve() ends after the last one."""
    workers, rank = ha.size(), ha.rank()
    early = rank == workers - 1 and workers > 1
    stayers = ha.worker_comm().Split(0 if not early else 1, rank)
    t = open_transport("dc-asgd", "mailbox", DC_PLAIN)
    flat = integer_init().clone()
    t.publish_(flat)
    pushed = torch.zeros(NUMEL, dtype=torch.float64)
    for i in range(5 if early else int(300 * SCALE)):
        g = integer_grad(rank, i)
        t.push(g, flat, SGDPayload(lr=1.0).encode())
        pushed += g.double()
    total = ha.worker_comm().allreduce(pushed.numpy())  # the early worker's part is in here
    if early:
        t.close()  # returns once the others have closed too; they keep being served meanwhile
        say(f"EARLY WORKER {rank} CLOSED")
    else:
        stayers.Barrier()
        t.request_async(W.Kind.PULL, out=flat).wait()
        check(np.array_equal(flat.double().numpy(), integer_init().double().numpy() - total),
              "updates were lost around the early worker's exit")
        stayers.Barrier()
        t.close()
    stayers.Free()


CHECKS = {f.__name__: f for f in (no_lost_update, dc_formula, lc_formula, dbs_cursor, equivalences, asgd_lookahead,
                                   nonfinite, bad_input, shutdown)}


if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "PS CHECKS OK")

"""gossip and easgd under mpirun, run by tests/test_gossip_easgd.py.

``SERVERS=0 python gossip_checks.py [CHECK ...]`` runs the gossip checks (every rank a worker),
``SERVERS=1 ...`` the easgd checks (world rank 0 holds the centre); worker 0 prints
``GOSSIP CHECKS OK ...`` or ``EASGD CHECKS OK ...`` at the end.
"""
import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import hvd_async as ha  # noqa: E402
from harness import check, main  # noqa: E402
from reference import Quadratic  # noqa: E402
from hvd_async.algorithms.gossip import _PullMixer, _PushSumMixer  # noqa: E402
from hvd_async.algorithms.peers import PeerSchedule  # noqa: E402
from hvd_async.transport.peer import PeerWindowTransport  # noqa: E402

NUMEL = 37


def _allgather(x):
    return ha.worker_comm().allgather(x)


def _spread(values) -> float:
    return max((a - b).abs().max().item() for a, b in itertools.combinations(values, 2))


def _start(rank: int) -> torch.Tensor:
    """Weights that differ by worker."""
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 + rank)) * 10


# --- gossip ------------------------------------------------------------------------------------

def push_sum_keeps_the_sum():
    """Many concurrent push-sum rounds (no gradient) keep sum x and sum s; the models contract;
    the final average is the initial mean; the transport refuses use after close."""
    rank, size = ha.rank(), ha.size()
    t = PeerWindowTransport(NUMEL, comms=ha.runtime.comms(), name="check")
    flat = _start(rank)
    initial = sum(x.double() for x in _allgather(flat.clone()))
    mixer = _PushSumMixer(t, flat)
    peers = PeerSchedule("random", rank=rank, size=size, seed=3)
    for block in range(10):  # 200 rounds, concurrent within each block of 20
        for _ in range(20):
            peer = peers.next()
            if peer is not None:
                mixer.mix_(flat, peer)
        t.barrier()
    with t.own() as (x, s):
        mine = (x.double().clone(), float(s[0]))
    everyone = _allgather(mine)
    total_x = sum(x for x, _ in everyone)
    total_s = sum(s for _, s in everyone)
    err = ((total_x - initial).abs().max() / initial.abs().max()).item()
    check(err < 1e-5, f"push-sum changed sum x by {err:.2e} (relative)")
    check(abs(total_s - size) < 1e-9, f"push-sum weights sum to {total_s}, not {size}")
    if size > 1:
        models = [x / s for x, s in everyone]
        before = _spread(_allgather(_start(rank)))
        check(_spread(models) < before / 100, f"push-sum spread {_spread(models):.3g} from {before:.3g}")
    mixer.average_(flat)
    err = (flat.double() - initial / size).abs().max().item()
    check(err < 1e-4, f"average after push-sum is {err:.2e} off the initial mean")
    everyone = _allgather(flat.clone())
    check(all(torch.equal(everyone[0], x) for x in everyone), "workers differ after average_")
    t.close()
    try:
        t.get((rank + 1) % size, flat)
    except RuntimeError as exc:
        check("was closed" in str(exc), str(exc))
    else:
        check(False, "get after close did not raise")


def pull_contracts():
    """Pull gossip in blocks of concurrent rounds shrinks the spread between workers by a large factor."""
    rank, size = ha.rank(), ha.size()
    if size == 1:
        return
    t = PeerWindowTransport(NUMEL, comms=ha.runtime.comms(), name="check")
    flat = _start(rank)
    before = _spread(_allgather(flat.clone()))
    mixer = _PullMixer(t, flat)
    peers = PeerSchedule("random", rank=rank, size=size, seed=5)
    for block in range(8):
        for _ in range(5):
            mixer.mix_(flat, peers.next())
        t.barrier()
    after = _spread(_allgather(flat.clone()))
    check(after < before / 1000, f"pull gossip spread {after:.3g} from {before:.3g}")
    t.close()


def _virtual_compute(opt):
    """The strategy's clock, and a function that moves it an hour on, as a step's compute would
    (no real time passes): an exchange's timer that also held the compute would count the hour."""
    offset = [0.0]
    opt.strategy.clock = lambda: time.perf_counter() + offset[0]

    def compute():
        offset[0] += COMPUTE_S

    return compute


COMPUTE_S = 3600.0


def _gossip_run(steps, *, lr, sync_at=(), record=None, **options):
    rank = ha.rank()
    model = Quadratic(numel=NUMEL)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5),
                                  model.named_parameters(), algorithm="gossip", **options)
    if record is not None:
        original = opt.strategy.peers.next

        def next_peer():
            peer = original()
            record.append(peer)
            return peer

        opt.strategy.peers.next = next_peer
    compute = _virtual_compute(opt)
    for step in range(steps):
        opt.zero_grad()
        model.loss(rank, step).backward()
        compute()
        opt.step()
        if step in sync_at:
            opt.load_global_model()
    opt.load_global_model()
    final = model.w.detach().clone()
    stats = opt.stats()
    opt.close()
    return final, stats


def peer_sequence_reproducible():
    """Two runs with the same seed draw the same peers (never self); another seed draws others."""
    rank, size = ha.rank(), ha.size()
    runs = []
    for seed in (7, 7, 8):
        record = []
        _gossip_run(12, lr=0.05, seed=seed, record=record)
        runs.append(record)
    replay = PeerSchedule("random", rank=rank, size=size, seed=7)
    expected = [replay.next() for _ in range(12)]  # None with one worker: no peer
    check(runs[0] == runs[1] == expected, f"worker {rank}: peers {runs[0]} / {runs[1]} / replay {expected}")
    check(all(p != rank for p in runs[0]), f"worker {rank} picked itself: {runs[0]}")
    everyone = _allgather(runs)
    if size >= 3:
        check(any(r[0] != r[2] for r in everyone), "seeds 7 and 8 drew the same peers on every worker")
        check(len({tuple(r[0]) for r in everyone}) > 1, "every worker drew the same sequence")
    ring = []
    _gossip_run(4, lr=0.05, topology="ring", record=ring)
    check(ring == [None if size == 1 else (rank + 1) % size] * 4, f"ring peers {ring}")


def gossip_trains():
    """Short training with both variants and every topology: finite, and equal after synchronize."""
    size = ha.size()
    start = Quadratic(numel=NUMEL).w.detach()
    for variant, topology, every in (("pull", "random", 1), ("push", "random", 1),
                                     ("push", "exponential", 2), ("pull", "ring", 3)):
        final, stats = _gossip_run(30, lr=0.1, sync_at=(10,), variant=variant, topology=topology, every=every)
        what = f"{variant}/{topology}/every={every}"
        check(bool(torch.isfinite(final).all()), f"{what}: non-finite weights {final}")
        everyone = _allgather(final)
        check(all(torch.equal(everyone[0], x) for x in everyone), f"{what}: workers differ after synchronize")
        check((final - start).abs().max() > 1e-3, f"{what}: training did not move the weights")
        expected_mixes = 0 if size == 1 else 30 // every
        mixes = stats["mixes"] + stats["mixes_held"]
        check(mixes == expected_mixes, f"{what}: {mixes} mixes, expected {expected_mixes}")
        # the time in exchanges (mixes, and the averaging of load_global_model), never the compute
        check(0 < stats["exchange_wait_seconds"] < COMPUTE_S,
              f"{what}: {stats['exchange_wait_seconds']:.4f} s in exchanges beside 30 steps of an hour's compute")
        check(stats["staleness_max"] == 0, f"{what}: {stats}")
        check(stats["bytes_moved"] == stats["mixes"] * (4 * NUMEL + 8), f"{what}: {stats}")


# --- easgd -------------------------------------------------------------------------------------

def _easgd_replay(workers, steps, *, lr, tau, alpha):
    """Synchronous EASGD in float64, written out: local SGD, then every tau steps every worker moves
    against the same centre and the centre gets every move."""
    init = Quadratic(numel=NUMEL).w.detach().double()
    w, c = [init.clone() for _ in range(workers)], init.clone()
    for t in range(steps):
        w = [w[m] - lr * Quadratic.grad(m, t, w[m]) for m in range(workers)]
        if (t + 1) % tau == 0:
            d = [alpha * (w[m] - c) for m in range(workers)]
            w = [w[m] - d[m] for m in range(workers)]
            c = c + sum(d)
    return w, c


def _easgd_run(steps, *, lr, sync_at=(), resume=True, **options):
    rank = ha.rank()
    model = Quadratic(numel=NUMEL)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(),
                                  algorithm="easgd", **options)
    transport = opt.strategy.transport
    moved = torch.zeros(NUMEL, dtype=torch.float64)
    original = transport.accumulate

    def recording(delta):
        moved.add_(delta.double())
        return original(delta)

    transport.accumulate = recording
    compute = _virtual_compute(opt)
    for step in range(steps):
        opt.zero_grad()
        model.loss(rank, step).backward()
        compute()
        opt.step()
        if step in sync_at:
            opt.load_global_model()
            if resume:
                opt.strategy.resume_local()
    local = model.w.detach().double().clone()
    opt.load_global_model()
    centre = model.w.detach().double().clone()
    stats = opt.stats()
    opt.strategy.resume_local()
    check(torch.equal(model.w.detach().double(), local), "resume_local did not restore the own weights")
    opt.close()
    return local, centre, moved, stats


def easgd_moves_add_up():
    """Asynchronous and synchronous: the centre's change is the sum of every worker's moves."""
    size = ha.size()
    init = Quadratic(numel=NUMEL).w.detach().double()
    for synchronous, tau in ((False, 1), (False, 3), (True, 2)):
        _, centre, moved, stats = _easgd_run(40, lr=0.1, tau=tau, synchronous=synchronous)
        total = sum(_allgather(moved))
        err = (centre - init - total).abs().max().item()
        what = f"synchronous={synchronous} tau={tau}"
        check(err < 1e-4, f"{what}: centre change is {err:.2e} off the sum of the moves")
        check(stats["elastic_moves"] == 40 // tau and sum(stats["staleness_hist"]) == 40 // tau, f"{what}: {stats}")
        check(abs(stats["alpha"] - 0.9 / size) < 1e-12, f"{what}: alpha {stats['alpha']}")
        everyone = _allgather(centre)
        check(all(torch.equal(everyone[0], x) for x in everyone), f"{what}: workers loaded different centres")


def easgd_sync_replay():
    """The synchronous form equals the float64 replay (a synchronize midway with resume_local changes nothing)."""
    rank, size = ha.rank(), ha.size()
    settings = dict(lr=0.2, tau=2, alpha=0.3)
    w, c = _easgd_replay(size, 11, **settings)
    for sync_at in ((), (4,)):
        local, centre, _, stats = _easgd_run(11, synchronous=True, sync_at=sync_at, **settings)
        err = max((local - w[rank]).abs().max().item(), (centre - c).abs().max().item())
        check(err < 1e-5, f"sync_at={sync_at}: {err:.2e} off the replay")
        check(stats["staleness_max"] == 0, f"synchronous staleness {stats}")


def _mean_loss(w: torch.Tensor, steps: int) -> float:
    """The loss of weights ``w`` averaged over every worker's objectives of steps 0 to ``steps - 1``."""
    size = ha.size()
    total = sum(0.5 * Quadratic.scale(m) * float(((w.double() - Quadratic.target(m, t, NUMEL)) ** 2).sum())
                for m in range(size) for t in range(steps))
    return total / (size * steps)


def easgd_trains():
    """Asynchronous training with rho, and a synchronize without resume_local: finite, centre loaded."""
    local, centre, _, stats = _easgd_run(30, lr=0.1, tau=2, rho=2.0, sync_at=(9, 19), resume=False)
    check(bool(torch.isfinite(local).all()) and bool(torch.isfinite(centre).all()), f"non-finite: {local}")
    check(abs(stats["alpha"] - 0.2) < 1e-12, f"alpha = lr * rho: {stats['alpha']}")
    size, start = ha.size(), Quadratic(numel=NUMEL).w.detach().double()
    best = sum(Quadratic.scale(m) * Quadratic.target(m, t, NUMEL) for m in range(size) for t in range(30)) / (
        30 * sum(Quadratic.scale(m) for m in range(size)))  # the fixed weights of least mean loss
    before, after, least = _mean_loss(start, 30), _mean_loss(centre, 30), _mean_loss(best, 30)
    check(after - least < 0.5 * (before - least), f"the centre's mean loss over the workers' 30 steps is {after:.3f} "
          f"against {before:.3f} at the start and {least:.3f} at best: easgd did not close half the gap")
    # the elastic moves' time (15 of them, and 3 loads of the centre), never the steps' compute
    check(0 < stats["exchange_wait_seconds"] < COMPUTE_S,
          f"{stats['exchange_wait_seconds']:.4f} s in exchanges beside 30 steps of an hour's compute")


GOSSIP = {f.__name__: f for f in (push_sum_keeps_the_sum, pull_contracts, peer_sequence_reproducible,
                                  gossip_trains)}
EASGD = {f.__name__: f for f in (easgd_moves_add_up, easgd_sync_replay, easgd_trains)}

if __name__ == "__main__":
    gossip = os.environ.get("SERVERS", "1") == "0"
    main(GOSSIP if gossip else EASGD, sys.argv[1:], "GOSSIP CHECKS OK" if gossip else "EASGD CHECKS OK")

"""lb-sgd under mpirun, run by tests/test_lbsgd_mpi.py: ``SERVERS=0 mpirun -np W python lbsgd_checks.py [CHECK ...]``.

Each worker's speed is injected through the clock its Horovod transport reads (moved by its batch over
its speed before each step), not timed. Every worker draws ``opt.strategy.batch_size`` samples through
the strategy's lockstep cursor from one shared sequence, and checks its weights against one process
training on each step's whole global batch (positions ``k*B .. (k+1)*B-1``).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, main  # noqa: E402
from reference import cross_entropy_steps, global_batch_steps, paced_draws  # noqa: E402

import hvd_async as ha  # noqa: E402
from hvd_async.algorithms.lbsgd import share_batch  # noqa: E402
from hvd_async.sampling import SharedCursorBatches  # noqa: E402
from hvd_async.transport.horovod import HorovodTransport  # noqa: E402

N, BATCH, LR, SEED = 50, 4, 0.1, 5
DATA = torch.Generator().manual_seed(0)
X, Y = torch.randn(N, 6, generator=DATA), torch.randint(0, 3, (N,), generator=DATA)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def lb_run(steps, speeds, **options):
    """lb-sgd on this worker for ``steps`` steps at ``speeds(step, rank)`` samples/s; returns the weights,
    each step's averaged gradients and the batch sizes each step was drawn with."""
    now, rank, net = [0.0], ha.rank(), model()
    opt = ha.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR), named_parameters=net.named_parameters(),
                                  algorithm="lb-sgd", transport=HorovodTransport(clock=lambda: now[0]),
                                  batch_size=BATCH, **options)
    draw, sizes = paced_draws(opt, now, lambda step: speeds(step, rank), N, SEED)
    grads = cross_entropy_steps(net, opt, draw, X, Y, steps)
    opt.close()
    return [p.detach().clone() for p in net.parameters()], grads, sizes


def same_everywhere(tensors, what):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    gathered = ha.worker_comm().allgather(flat)
    check(all(torch.equal(gathered[0], other) for other in gathered), f"{what}: the workers differ")


def equal_speeds_are_ssgd():
    """Equal speeds: sizes stay at the nominal batch and the weights are ssgd's on the same samples, bit
    for bit (each worker's batch at step k: positions k*B + rank*b .. of the shared sequence)."""
    steps, workers, rank = 9, ha.size(), ha.rank()
    weights, _, sizes = lb_run(steps, lambda step, r: 128.0, every=2)
    check(sizes == [[BATCH] * workers] * steps, f"sizes moved at equal speeds: {sizes}")
    net, sequence = model(), SharedCursorBatches(N, seed=SEED, fetch_add=None)
    opt = ha.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR), named_parameters=net.named_parameters(),
                                  algorithm="ssgd")
    cross_entropy_steps(net, opt, lambda step: sequence.indices((step * workers + rank) * BATCH, BATCH), X, Y, steps)
    opt.close()
    for a, b in zip(weights, net.parameters()):
        check(torch.equal(a, b.detach()), f"lb-sgd at equal speeds is not ssgd: {a.reshape(-1)[:3]} against "
                                          f"{b.reshape(-1)[:3]}")
    same_everywhere(weights, "equal speeds")


def unequal_speeds_weighted_mean():
    """Worker r at 64 * 2**r samples/s (powers of two: the measured rates are exact): from step 3 on the
    global batch is shared by speed and each averaged gradient is the one of the union of the step's
    samples, the sample-weighted mean of the workers' (rtol/atol 1e-6: sums in another order)."""
    steps, workers = 7, ha.size()
    speeds = [64.0 * 2 ** r for r in range(workers)]
    weights, grads, sizes = lb_run(steps, lambda step, r: speeds[r], every=1, smoothing=0.0)
    shared = share_batch(workers * BATCH, speeds)
    check(sizes == [[BATCH] * workers] * 2 + [shared] * (steps - 2), f"sizes {sizes}, expected then {shared}")
    check(shared != [BATCH] * workers and sum(shared) == workers * BATCH, f"shared {shared}")
    reference, reference_grads = global_batch_steps(model(), SharedCursorBatches(N, seed=SEED, fetch_add=None),
                                                    X, Y, steps, workers * BATCH, lr=LR)
    for step, (got, want) in enumerate(zip(grads, reference_grads)):
        for a, b in zip(got, want):
            check(torch.allclose(a, b, rtol=1e-6, atol=1e-6), f"step {step}: averaged gradient {a.reshape(-1)[:3]} "
                                                               f"against the union's {b.reshape(-1)[:3]}")
    for a, b in zip(weights, reference):
        check(torch.allclose(a, b, rtol=1e-6, atol=1e-6), "weights differ from the union's steps")
    same_everywhere(weights, "unequal speeds")


def sizes_follow_a_speed_change():
    """The last worker drops from 128 to 32 samples/s at step 4 (the others at 128): with every=2 and
    smoothing 0.5 its averaged speed goes 80 (step 4), 56 (re-shared after step 5), 44, 38 (after step 7),
    35, 33.5 (after step 9), and the sizes follow share_batch of the averages on every worker."""
    workers = ha.size()
    last = workers - 1

    def speeds(step, r):
        return 32.0 if (r == last and step >= 4) else 128.0

    _, _, sizes = lb_run(11, speeds, every=2, smoothing=0.5)
    B = workers * BATCH
    after5 = share_batch(B, [128.0] * last + [56.0])
    after7 = share_batch(B, [128.0] * last + [38.0])
    after9 = share_batch(B, [128.0] * last + [33.5])
    expected = [[BATCH] * workers] * 6 + [after5] * 2 + [after7] * 2 + [after9]  # (the sizes each step drew)
    check(sizes == expected, f"sizes {sizes}, expected {expected}")
    check(after9[last] < BATCH, f"the slow worker kept its batch: {after9}")


CHECKS = {"equal_speeds_are_ssgd": equal_speeds_are_ssgd, "unequal_speeds_weighted_mean": unequal_speeds_weighted_mean,
          "sizes_follow_a_speed_change": sizes_follow_a_speed_change}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "LBSGD CHECKS OK")

"""lb-sgd over the in-process loopback transport (threads as workers), its speeds set by clocks the test
moves: equal speeds make exactly ssgd's steps, unequal ones the step on the union of the workers'
samples (the sample-weighted mean of their gradients), and the batch sizes follow a change of speed.
Also its share rule and the lockstep cursor the job draws batches through."""
import pytest
import torch
import torch.nn as nn

from hvd_async import DistributedOptimizer
from hvd_async.algorithms.lbsgd import LBSGDOptions, share_batch
from hvd_async.sampling import LockstepCursor, SharedCursorBatches
from hvd_async.transport import LoopbackGroup
from reference import cross_entropy_steps, global_batch_steps, paced_draws
from threads import run_workers

N, LR, SEED = 40, 0.1, 3
DATA = torch.Generator().manual_seed(0)
X, Y = torch.randn(N, 5, generator=DATA), torch.randint(0, 3, (N,), generator=DATA)


def _model():
    torch.manual_seed(0)
    return nn.Linear(5, 3)


def _run(algorithm, workers, steps, speeds, **options):
    """Train ``workers`` threads for ``steps`` steps, each drawing ``opt.strategy.batch_size`` samples
    from the shared sequence through the strategy's cursor; before each step worker m's clock moves by
    its batch over ``speeds(step, m)`` samples/s (its compute). Returns worker 0's (final weights, each
    step's averaged gradients, the batch sizes each step was drawn with)."""
    group, models = LoopbackGroup(workers), [_model() for _ in range(workers)]
    out = {}

    def worker(rank):
        now, model = [0.0], models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), algorithm=algorithm,
                                   transport=group.transport(rank, clock=lambda: now[0]), **options)
        draw, sizes = paced_draws(opt, now, lambda step: speeds(step, rank), N, SEED)
        grads = cross_entropy_steps(model, opt, draw, X, Y, steps)
        out[rank] = [p.detach().clone() for p in model.parameters()], grads, sizes

    run_workers(worker, workers)
    for rank in range(1, workers):
        assert all(torch.equal(a, b) for a, b in zip(out[0][0], out[rank][0])), f"worker {rank} differs from worker 0"
    return out[0]


def _ssgd_on_the_same_samples(workers, steps, batch):
    """ssgd over the loopback, worker m's batch at step k positions k*B + m*b ..: the same samples."""
    group, models = LoopbackGroup(workers), [_model() for _ in range(workers)]
    sequence, finals = SharedCursorBatches(N, seed=SEED, fetch_add=None), {}

    def worker(rank):
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), algorithm="ssgd",
                                   transport=group.transport(rank))
        cross_entropy_steps(model, opt, lambda step: sequence.indices((step * workers + rank) * batch, batch),
                            X, Y, steps)
        finals[rank] = [p.detach().clone() for p in model.parameters()]

    run_workers(worker, workers)
    return finals[0]


@pytest.mark.parametrize("workers", [2, 4])
def test_equal_speeds_make_exactly_ssgds_steps(workers):
    steps = 7
    weights, _, sizes = _run("lb-sgd", workers, steps, lambda step, m: 100.0, batch_size=4, every=2)
    assert sizes == [[4] * workers] * steps
    reference = _ssgd_on_the_same_samples(workers, steps, 4)
    assert all(torch.equal(a, b) for a, b in zip(weights, reference)), "lb-sgd at equal speeds is not ssgd"


@pytest.mark.parametrize("workers,speeds,shared", [(2, [300.0, 100.0], [12, 4]),
                                                    (4, [128.0, 128.0, 64.0, 256.0], [7, 7, 4, 14])])
def test_unequal_speeds_give_the_sample_weighted_mean(workers, speeds, shared):
    """Speeds measured at step 2 (the first interval is not measured); from step 3 on the batches are
    shared by speed, and each step's averaged gradient is the gradient of the mean loss over the union of
    the workers' samples, as is every weight (rtol/atol 1e-6: the sums run in another order). The speeds are
    powers of two where quotas have remainders, so the measured rates are exact and no tie flips by rounding."""
    steps, batch = 6, 8
    weights, grads, sizes = _run("lb-sgd", workers, steps, lambda step, m: speeds[m], batch_size=batch,
                                 every=1, smoothing=0.0)
    assert sizes == [[batch] * workers] * 2 + [shared] * (steps - 2)
    assert sum(shared) == workers * batch and shared == share_batch(workers * batch, speeds)
    reference, reference_grads = global_batch_steps(_model(), SharedCursorBatches(N, seed=SEED, fetch_add=None),
                                                    X, Y, steps, workers * batch, lr=LR)
    for step, (got, want) in enumerate(zip(grads, reference_grads)):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=f"step {step}: averaged gradient")
    for a, b in zip(weights, reference):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_batch_sizes_follow_an_injected_speed_change():
    """Worker 1 runs at 100 samples/s, then from step 6 at 300 (worker 0 at 100 throughout); speeds are
    re-shared every 2 steps with smoothing 0.5: the sizes follow the moving average of the speeds."""
    def speeds(step, m):
        return 300.0 if (m == 1 and step >= 6) else 100.0

    _, _, sizes = _run("lb-sgd", 2, 12, speeds, batch_size=8, every=2, smoothing=0.5)
    # worker 1's average (steps from 0): 100 up to step 5, then 200, 250 (re-shared after step 7: 16 * 100/350
    # = 4.57 -> [5, 11] for steps 8 and 9), 275, 287.5 (after step 9: 4.13 -> [4, 12] for steps 10 and 11)
    assert sizes == [[8, 8]] * 8 + [[5, 11]] * 2 + [[4, 12]] * 2, sizes


def test_share_rule_sums_to_the_global_batch():
    assert share_batch(16, [3.0, 1.0]) == [12, 4]
    assert share_batch(10, [1.0, 1.0, 1.0]) == [4, 3, 3]  # the remainder to the lower rank
    assert share_batch(8, [1000.0, 1.0, 1.0], min_batch=2) == [4, 2, 2]
    for speeds in ([1.0, 2.0, 3.0, 7.0], [0.3, 0.3, 0.3], [5.0, 1e-6]):
        assert sum(share_batch(13, speeds)) == 13 and min(share_batch(13, speeds)) >= 1
    with pytest.raises(ValueError, match="a global batch of 3 cannot give 4 workers 1 samples each"):
        share_batch(3, [1.0] * 4)


def test_lockstep_cursor_every_sample_once_and_one_epoch_end():
    """Workers drawing through their lockstep cursors, sizes changing between steps: each step's parts
    tile its positions, every sample is drawn once per epoch, and every worker sees an epoch's last step
    (the one that runs past its end) as that epoch's."""
    n, workers = 23, 3
    cursors = [LockstepCursor(rank, [3, 3, 3]) for rank in range(workers)]
    samplers = [SharedCursorBatches(n, seed=1, fetch_add=cursor) for cursor in cursors]
    per_epoch = {}
    for step, sizes in enumerate([[3, 3, 3]] * 4 + [[1, 5, 3]] * 6):
        for cursor in cursors:
            cursor.set_sizes(sizes)
        epochs = set()
        for rank, sampler in enumerate(samplers):
            epoch, idx = sampler.draw(sizes[rank])
            epochs.add(epoch)
            per_epoch.setdefault(epoch, []).extend(idx)
        assert len(epochs) == 1, f"step {step}: the workers disagree on the epoch {epochs}"
    first = per_epoch[0]
    assert sorted(first[:n]) == list(range(n)) and len(first) == 27  # 3 steps of 9, the third past the end
    with pytest.raises(ValueError, match="worker 1 drew a batch of 4 samples but its share of the step is 5"):
        samplers[1].draw(4)


@pytest.mark.parametrize("options,fragment", [
    ({}, "batch_size is required: pass the nominal batch per worker to the optimizer, "
         "DistributedOptimizer(..., algorithm='lb-sgd', batch_size=32)"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ({"batch_size": 8, "every": 0}, "every must be an integer >= 1, got 0"),
    ({"batch_size": 8, "smoothing": 1.0}, "smoothing (weight of the past"),
    ({"batch_size": 4, "min_batch": 5}, "min_batch must be at most batch_size (4) so that every worker can have it"),
])
def test_options_name_the_bad_value(options, fragment):
    with pytest.raises(ValueError) as info:
        LBSGDOptions(**options)
    assert fragment in str(info.value)

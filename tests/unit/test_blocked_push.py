"""A server program's push applied slice by slice equals the same push applied to the whole shard.

The programs run each push as one chain of elementwise operations over views of one slice at a time
(:class:`hvd_async.rules.Blocks`); what is not elementwise is taken before the slices or summed from
them. Two copies of each program get the same pushes, one cutting its shard of 203 elements into
slices of 64 (the last one 11), the other taking it whole: every buffer is equal to the bit after
every push, the shard's sums to rounding, for every rule and option of test_fused_rules.py."""
import dataclasses

import numpy as np
import pytest
import torch
from test_fused_rules import CASES, ORDER, SGD, WORKERS, _buffers, _push

from hvd_async import registry
from hvd_async.rules import Blocks
from hvd_async.sim.windows import SimShardHost
from hvd_async.transport import window as W

NUMEL, SLICE = 203, 64  # four slices, the last one short


def _hosts(algo, given, threads):
    cls = registry.algorithm(algo)
    options = cls.Options(**given)
    cls.resolve_options(options, WORKERS)
    spec = cls.window_spec(options, NUMEL, 1, WORKERS)
    hosts = [SimShardHost(spec, 0, cls.server_program) for _ in range(2)]
    start = torch.randn(NUMEL, generator=torch.Generator().manual_seed(3))
    for host in hosts:
        host.weights.copy_(start)
    whole, sliced = hosts
    whole.program.blocks = Blocks(NUMEL, block=NUMEL)
    sliced.program.blocks = Blocks(NUMEL, block=SLICE, threads=threads)
    assert len(sliced.program.blocks.slices) == 4 and NUMEL % SLICE
    return whole, sliced


IDS = [f"{a}-{'-'.join(f'{k}={v}' for k, v in g.items()) or 'defaults'}-{s}" for a, g, s in CASES]


@pytest.mark.parametrize("algo,given,sgd", CASES, ids=IDS)
def test_a_push_by_slices_equals_the_whole_shards(algo, given, sgd):
    _check(algo, given, sgd, threads=1)


def test_two_lanes_give_the_same_bits():
    # (one case, on the tests' one thread otherwise: the lanes share the slices, each with its own scratch)
    _check("dc-asgd", {}, "nesterov+wd", threads=2)


def _pushes(algo, given, sgd, payload_cls):
    """test_fused_rules.py's pushes: (worker, gradient, payload), an outlier for the push clip at turn 9,
    a falling loss for lc-asgd's predictor; softsync with n=1 gets each worker once per aggregate."""
    gen = torch.Generator().manual_seed(11)
    synchronous = algo == "softsync" and given.get("n") == 1
    names = {f.name for f in dataclasses.fields(payload_cls)}
    order = [t % WORKERS for t in range(len(ORDER))] if synchronous else ORDER
    for turn, worker in enumerate(backup_order(order) if algo == "backup-sgd" else order):
        extra = {k: v for k, v in (("loss", 3.0 * 0.9 ** turn), ("grad_norm", 0.0)) if k in names}
        yield worker, torch.randn(NUMEL, generator=gen) * (4.0 if turn == 9 else 1.0), \
            payload_cls(lr=0.05, **SGD[sgd], **extra)


def backup_order(order, need=WORKERS - 1):
    """``order`` as backup-sgd's workers can push: a worker whose gradient the open round accepted waits
    for the round's update before it pushes again (its gradient may wait in its inbox slot until then),
    so its pushes in between are left out; a push computed on an older version is dropped and answered
    at once. ``need``: the gradients a round takes (the default one backup)."""
    version, held, accepted, kept = 0, [0] * WORKERS, [], []
    for worker in order:
        if worker in accepted:
            continue
        kept.append(worker)
        if held[worker] != version:
            held[worker] = version
            continue
        accepted.append(worker)
        if len(accepted) == need:
            version += 1
            for m in accepted:
                held[m] = version
            accepted = []
    return kept


def _check(algo, given, sgd, threads):
    whole, sliced = _hosts(algo, given, threads)
    try:
        for turn, (worker, grad, payload) in enumerate(_pushes(algo, given, sgd, whole.program.Payload)):
            for host in (whole, sliced):
                _push(host, worker, grad, payload)
            want, got = _buffers(whole.program), _buffers(sliced.program)
            assert sorted(got) == sorted(want)
            unequal = [name for name in want if not torch.equal(got[name], want[name])]
            assert not unequal, f"push {turn} (worker {worker}): {unequal} differ"
            np.testing.assert_allclose(sliced.meta[W.META_SUMS:W.META_COUNTER].view(np.float64),
                                       whole.meta[W.META_SUMS:W.META_COUNTER].view(np.float64), rtol=1e-5, atol=1e-9)
        assert whole.version == sliced.version > 3
    finally:
        sliced.program.close()
        whole.program.close()

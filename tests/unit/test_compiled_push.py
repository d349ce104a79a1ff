"""dc-asgd's, lc-asgd's and softsync's push, and backup-sgd's update, as one compiled loop
(``--server-kernel compiled``, hvd_async/rules/fused.py) equal the eager chain to fp32 rounding: two
copies of each program get the same pushes, one compiled, one eager, for every dc-asgd, lc-asgd,
softsync and backup-sgd case of test_fused_rules.py (adaptive or constant lam, look-ahead, per-worker
and shared momentum, weight decay, the push clip, 'uncovered' compensation, lc-asgd's ratio r;
softsync's one-push aggregates, with staleness-scaled rates, and its larger aggregates, which stay
eager; backup-sgd's updates, beside the late pushes it drops) and two more of softsync's; every buffer
is compared after every push, to a few units of fp32's last place of its largest element (the same
operations, in another order within an element). The cases the compiled loop does not cover
(Nesterov, fp16 slots) take the eager chain, and are checked to."""
import numpy as np
import pytest
import torch
from test_blocked_push import _pushes
from test_fused_rules import CASES, NUMEL, WORKERS, _buffers, _push

from hvd_async import registry
from hvd_async.algorithms.compensation import ServerKernelOption
from hvd_async.rules import fused
from hvd_async.sim.windows import SimShardHost
from hvd_async.transport import window as W

COMPENSATED = [case for case in CASES if case[0] in ("dc-asgd", "lc-asgd", "softsync", "backup-sgd")] + [
    ("softsync", dict(staleness_lr=True), "momentum+wd"),  # a staleness factor in the one-push aggregate's rate
    ("softsync", dict(lookahead=False), "momentum"),  # no outbox: the pushers read the weights window
]


def _compiles(algo, given) -> bool:
    """Whether the program has a compiled push at all: softsync's only for one-push aggregates through
    per-worker buffers (n = workers, the default)."""
    return algo != "softsync" or (given.get("n") in (None, WORKERS) and given.get("server_momentum") != "shared")
IDS = [f"{a}-{'-'.join(f'{k}={v}' for k, v in g.items()) or 'defaults'}-{s}" for a, g, s in COMPENSATED]


def _host(algo, given, kernel):
    cls = registry.algorithm(algo)
    options = cls.Options(**given, server_kernel=kernel)
    cls.resolve_options(options, WORKERS)
    host = SimShardHost(cls.window_spec(options, NUMEL, 1, WORKERS), 0, cls.server_program)
    host.weights.copy_(torch.randn(NUMEL, generator=torch.Generator().manual_seed(3)))
    return host


@pytest.mark.parametrize("algo,given,sgd", COMPENSATED, ids=IDS)
def test_the_compiled_push_equals_the_eager_one(algo, given, sgd):
    eager, compiled = _host(algo, given, "eager"), _host(algo, given, "compiled")
    assert eager.program.fused is None and (compiled.program.fused is not None) == _compiles(algo, given)
    fusable = 0
    try:
        for turn, (worker, grad, payload) in enumerate(_pushes(algo, given, sgd, eager.program.Payload)):
            fusable += not payload.nesterov and given.get("compression") != "fp16" and _compiles(algo, given)
            for host in (eager, compiled):
                _push(host, worker, grad, payload)
            want, got = _buffers(eager.program), _buffers(compiled.program)
            assert sorted(got) == sorted(want)
            for name in want:  # fp32 rounding: a few units of the last place of the tensor's largest element
                torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5 * float(want[name].abs().max()),
                                           msg=lambda m: f"push {turn} (worker {worker}), {name}: {m}")
            np.testing.assert_allclose(compiled.meta[W.META_SUMS:W.META_COUNTER].view(np.float64),
                                       eager.meta[W.META_SUMS:W.META_COUNTER].view(np.float64), rtol=1e-4, atol=1e-9)
        if algo == "backup-sgd":  # an update at a time, not a push: every update it covers
            fusable = compiled.version if not payload.nesterov and given.get("compression") != "fp16" else 0
            # each with momentum read its gradients from the inbox slots they waited in (round_)
            assert compiled.program.fused is None or compiled.program.fused.rounds == (fusable if payload.momentum else 0)
            assert compiled.program.fused is None or compiled.program.fused.calls == (0 if payload.momentum else fusable)
        assert compiled.program.compiled_updates == fusable  # every push it covers
        assert eager.version == compiled.version > 3
    finally:
        compiled.program.close()
        eager.program.close()


def test_auto_compiles_for_large_shards_only():
    assert not fused.FusedPush.wanted("auto", fused.COMPILE_MIN - 1)
    assert fused.FusedPush.wanted("auto", fused.COMPILE_MIN)
    assert fused.FusedPush.wanted("compiled", 10) and not fused.FusedPush.wanted("eager", 1 << 30)


def test_a_bad_kernel_is_named():
    with pytest.raises(ValueError, match="server_kernel must be 'auto', 'compiled'.*got 'fast'"):
        ServerKernelOption(server_kernel="fast")


def test_where_torch_cannot_compile_the_eager_push_goes_on(monkeypatch, caplog):
    def cannot(self, variant):
        raise RuntimeError("no C++ compiler found\nmore lines")
    monkeypatch.setattr(fused.FusedPush, "warm_up", cannot)
    host = _host("dc-asgd", {}, "compiled")
    try:
        assert host.program.fused is None  # one warning, and the program kept its eager push
        assert "the compiled push is unavailable here (RuntimeError: no C++ compiler found)" in caplog.text
        worker, grad, payload = next(_pushes("dc-asgd", {}, "momentum+wd", host.program.Payload))
        _push(host, worker, grad, payload)
        assert host.version == 1
    finally:
        host.program.close()

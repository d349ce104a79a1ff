"""The server programs' fused pushes equal the unfused arithmetic they replaced, to fp32 rounding.

The reference is a copy of that arithmetic (a chain of whole-shard tensor operations: the step formed,
then the SGD step, the look-ahead's sum taken out and put back, the mean divided before it is applied),
kept here as subclasses of the real programs that override only the arithmetic. Both programs get the
same pushes from several workers, in an order with staleness, on in-memory shard hosts (the real
ShardHost, fp16 slots included), and every buffer is compared after every push: every rule and every
option that changes the arithmetic (adaptive lam, per-worker and shared momentum, look-ahead, push
clip, fp16 pushes, weight decay, Nesterov, no momentum, staleness-scaled rates)."""
import dataclasses

import numpy as np
import pytest
import torch

from hvd_async import registry
from hvd_async.algorithms.backup import BackupProgram
from hvd_async.algorithms.dcasgd import DCProgram
from hvd_async.algorithms.lcasgd import LCProgram
from hvd_async.algorithms.softsync import SoftSyncProgram
from hvd_async.rules.staleness import staleness_divisor
from hvd_async.sim.windows import SimShardHost
from hvd_async.transport import window as W

WORKERS, NUMEL = 3, 203
ORDER = [0, 1, 2, 0, 0, 1, 2, 2, 0, 1, 1, 2, 0, 2, 1, 0]  # pushes with staleness 0 to 4


# --- the unfused arithmetic, as it was ---------------------------------------------------------------
def unfused_term(rule, weights, grad, state, worker, active=True):
    """DCRule.term: ``lam_t * g * g * (w - w_bak)`` in five whole-shard operations."""
    step, work = state.scratch.take(grad, 2)
    if rule.adaptive:
        ms = state.mean_square
        ms.mul_(rule.ms_momentum).addcmul_(grad, grad, value=1.0 - rule.ms_momentum)
    if not (rule.lam and active):
        return None
    backup = state.backup[worker]
    if backup.dtype != weights.dtype:
        backup = step.copy_(backup)
    torch.sub(weights, backup, out=step)
    step.mul_(grad).mul_(grad)
    if rule.adaptive:
        step.div_(torch.add(state.mean_square, rule.eps, out=work).sqrt_())
    return step.mul_(rule.lam)


def unfused_direction(weights, grad, state, *, momentum=0.0, weight_decay=0.0, nesterov=False):
    """SGDRule.direction: the gradient with decay formed first, then the buffer."""
    if weight_decay:
        grad = grad.add(weights, alpha=weight_decay)
    if momentum:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = grad.clone()
        else:
            buf.mul_(momentum).add_(grad)
        grad = grad.add(buf, alpha=momentum) if nesterov else buf
    return grad


def unfused_apply(weights, grad, state, *, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
    step = unfused_direction(weights, grad, state, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    return weights.add_(step, alpha=-lr)


class UnfusedMean:
    """RunningMean: zeros, each gradient added, the total divided."""

    def __init__(self, like, *, scale=True):
        self.total, self.scale, self.count = torch.zeros_like(like), scale, 0

    def add(self, grad, staleness=0):
        if self.count == 0:
            self.total.zero_()
        if self.scale and staleness > 1:
            self.total.add_(grad, alpha=1.0 / staleness_divisor(staleness))
        else:
            self.total.add_(grad)
        self.count += 1

    def mean_(self):
        self.total.div_(self.count)
        self.count = 0
        return self.total


class UnfusedDC(DCProgram):
    """dc-asgd's (and, through ``lc``, lc-asgd's) push as it was: the step formed, then SGD."""

    def step_and_size(self, worker, grad, payload):
        active = self.active_for(worker, payload)
        term = unfused_term(self.rule, self.host.weights, grad, self.state, worker, active)
        if term is None:
            return grad, 0.0
        size = float(term.norm()) ** 2
        return term.add_(grad), size

    def on_push(self, worker, grad, payload, grad_norm=None):
        staleness = self.staleness(worker)
        step, compensation_sq = self.step_and_size(worker, grad, payload)
        if grad_norm is None:
            grad_norm = float(grad.norm())
        self.host.add_sums(compensation_sq, grad_norm ** 2)
        if self.push_clip is not None:
            whole = payload.grad_norm
            scale = self.push_clip.scale(whole if whole > 0 else grad_norm)
            if scale < 1.0:
                step = torch.mul(step, scale, out=self.state.scratch.take(grad, 1)[0])
        kwargs, buffer = payload.sgd_kwargs(), self.buffer(worker)
        if self.lookahead is not None:
            self.lookahead.remove(buffer)
        unfused_apply(self.host.weights, step, buffer, **kwargs)
        self.host.bump([staleness])
        if self.lookahead is None:
            self.snapshot(worker)
        else:
            self.lookahead.add(buffer)
            self.snapshot(worker, copy=False)
            self.lookahead.answer(self.host.outbox[worker], self.host.weights, *self.ahead(worker, kwargs))
        self.host.answer(worker, staleness, W.Status.APPLIED)


class UnfusedLC(UnfusedDC, LCProgram):
    def step_and_size(self, worker, grad, payload):
        loss, version = self.observed(worker, payload)
        r = self.rule.scale(self.state, worker, loss, self.host.version, version)
        term = unfused_term(self.rule._dc, self.host.weights, grad, self.state, worker)
        step = term.add_(grad) if term is not None else self.state.scratch.take(grad, 1)[0].copy_(grad)
        if r != 1.0:
            step.mul_(r)
        return step, float((step - grad).norm()) ** 2


class UnfusedSoftSync(SoftSyncProgram):
    def __init__(self, host, options):
        super().__init__(host, options)
        self.mean = UnfusedMean(host.weights, scale=self.scale)

    def on_push(self, worker, grad, payload, grad_norm=None):
        staleness = self.staleness(worker)
        if self.momentum is not None:
            kwargs = payload.sgd_kwargs()
            del kwargs["lr"]
            if self.lookahead is not None:
                self.lookahead.remove(self.momentum[worker])
            grad = unfused_direction(self.host.weights, grad, self.momentum[worker], **kwargs)
            if self.lookahead is not None:
                self.lookahead.add(self.momentum[worker])
        self.mean.add(grad, staleness)
        self.pending.append((worker, payload, staleness))
        self.maybe_apply()

    def apply_mean(self, kwargs):
        mean = self.mean.mean_()
        if self.momentum is None:
            if self.rate != 1.0:
                mean.mul_(self.rate)
            unfused_apply(self.host.weights, mean, self.sgd_state, **kwargs)
        else:
            self.host.weights.add_(mean, alpha=-self.rate * kwargs["lr"])


class UnfusedBackup(BackupProgram):
    def __init__(self, host, options):
        super().__init__(host, options)
        self.mean = UnfusedMean(host.weights, scale=False)

    def apply_mean(self, kwargs):
        unfused_apply(self.host.weights, self.mean.mean_(), self.sgd_state, **kwargs)


UNFUSED = {"dc-asgd": UnfusedDC, "lc-asgd": UnfusedLC, "softsync": UnfusedSoftSync, "backup-sgd": UnfusedBackup}


# --- the pushes -----------------------------------------------------------------------------------------
def _hosts(algo, given):
    cls = registry.algorithm(algo)
    options = cls.Options(**given)
    cls.resolve_options(options, WORKERS)
    spec = cls.window_spec(options, NUMEL, 1, WORKERS)
    fused = SimShardHost(spec, 0, cls.server_program)
    unfused = SimShardHost(spec, 0, lambda host: UNFUSED[algo](host, cls.server_spec(host)))
    start = torch.randn(NUMEL, generator=torch.Generator().manual_seed(3))
    for host in (fused, unfused):
        host.weights.copy_(start)
    return fused, unfused


def _push(host, worker, grad, payload):
    header = np.zeros(W.H_LEN, dtype=np.float64)
    W.encode_request(header, W.Kind.PUSH, payload.encode())
    host.inbox_raw[worker].copy_(grad)
    host.program.on_request(worker, W.Request.decode(header, 0, worker))


def _buffers(program):
    """Every tensor the program keeps that a push changes, by name."""
    out = {"weights": program.host.weights}
    if program.host.outbox is not None:
        out.update({f"outbox{m}": slot.float() for m, slot in enumerate(program.host.outbox)})
    states = [program.sgd_state] + list(program.momentum or [])
    out.update({f"momentum{k}": s["momentum_buffer"] for k, s in enumerate(states) if "momentum_buffer" in s})
    if program.lookahead is not None and program.lookahead.total is not None:
        out["lookahead_total"] = program.lookahead.total
    mean_square = getattr(getattr(program, "state", None), "mean_square", None)
    if mean_square is not None:
        out["mean_square"] = mean_square
    return out


SGD = {"momentum+wd": dict(momentum=0.9, weight_decay=1e-2),
       "nesterov+wd": dict(momentum=0.9, weight_decay=1e-2, nesterov=True),
       "plain+wd": dict(momentum=0.0, weight_decay=1e-2),
       "momentum": dict(momentum=0.5, weight_decay=0.0)}

CASES = [
    ("dc-asgd", {}, "momentum+wd"),  # the defaults: adaptive lam, look-ahead, per-worker momentum, push clip
    ("dc-asgd", {}, "nesterov+wd"),
    ("dc-asgd", {}, "plain+wd"),
    ("dc-asgd", dict(adaptive=False, lam=0.5, lookahead=False, push_clip=0.0), "momentum+wd"),
    ("dc-asgd", dict(server_momentum="shared"), "momentum+wd"),
    ("dc-asgd", dict(compensate="uncovered"), "momentum"),
    ("dc-asgd", dict(compression="fp16"), "momentum+wd"),
    ("dc-asgd", dict(lam=0.0, adaptive=False), "momentum+wd"),
    ("lc-asgd", dict(min_history=2), "momentum+wd"),  # r departs from 1 after two reports
    ("lc-asgd", dict(min_history=2, adaptive=False, lam=0.5, server_momentum="shared"), "nesterov+wd"),
    ("lc-asgd", dict(min_history=2, compression="fp16"), "plain+wd"),
    ("softsync", {}, "momentum+wd"),  # per-worker momentum, look-ahead, n = workers, rate averaged
    ("softsync", dict(staleness_lr=True), "nesterov+wd"),
    ("softsync", dict(staleness_lr=True, n=1), "momentum+wd"),
    ("softsync", dict(server_momentum="shared", staleness_lr=True), "momentum+wd"),
    ("softsync", dict(server_momentum="shared", n=1, push_rate="full", lookahead=False), "momentum+wd"),  # od-sgd's
    ("softsync", dict(compression="fp16"), "plain+wd"),
    ("backup-sgd", {}, "momentum+wd"),
    ("backup-sgd", {}, "nesterov+wd"),
    ("backup-sgd", dict(compression="fp16"), "plain+wd"),
]


@pytest.mark.parametrize("algo,given,sgd", CASES, ids=[f"{a}-{'-'.join(f'{k}={v}' for k, v in g.items()) or 'defaults'}-{s}"
                                                       for a, g, s in CASES])
def test_the_fused_push_equals_the_unfused_arithmetic(algo, given, sgd):
    fused, unfused = _hosts(algo, given)
    payload_cls = fused.program.Payload
    gen = torch.Generator().manual_seed(11)
    synchronous = algo == "softsync" and given.get("n") == 1  # each worker once per aggregate
    order = [t % WORKERS for t in range(len(ORDER))] if synchronous else ORDER
    for turn, worker in enumerate(order):
        grad = torch.randn(NUMEL, generator=gen) * (4.0 if turn == 9 else 1.0)  # the push clip's outlier
        extra = {f.name: v for f, v in ((f, {"loss": 3.0 * 0.9 ** turn + 0.1 * worker, "grad_norm": 0.0}.get(f.name))
                                         for f in dataclasses.fields(payload_cls)) if v is not None}
        payload = payload_cls(lr=0.05, **SGD[sgd], **extra)
        for host in (fused, unfused):
            _push(host, worker, grad, payload)
        want, got = _buffers(unfused.program), _buffers(fused.program)
        assert sorted(got) == sorted(want)
        for name in want:
            torch.testing.assert_close(got[name], want[name], msg=lambda m: f"push {turn} (worker {worker}), {name}: {m}")
        assert fused.version == unfused.version and fused.meta[W.META_PUSHES] == unfused.meta[W.META_PUSHES]
        np.testing.assert_allclose(fused.meta[W.META_SUMS:W.META_COUNTER].view(np.float64),
                                   unfused.meta[W.META_SUMS:W.META_COUNTER].view(np.float64), rtol=1e-4, atol=1e-9)
    assert fused.version > 3  # the pushes were applied, not all dropped or waiting

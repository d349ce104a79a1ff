"""dc-asgd: the servers apply each worker's gradient with delay compensation
``lam * g * g * (w - w_bak(m))``, through a momentum buffer per worker, and answer with the
look-ahead weights (``lookahead``)."""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

import torch

from ..checkpoint import tensors_copy
from ..options import option
from ..rules import DCRule
from ..rules.fused import FusedPush, Variant
from ..transport import window
from .base import CompensationSums
from .compensation import Compensation, PushClip, PushClipOption, ServerKernelOption
from .groups import Compression, InboxSlots, LookaheadOption, OptionGroup, PushRate, ServerMomentum, check_choice
from .payload import SGDPayload
from .ps import Lookahead, MailboxAlgorithm, MailboxProgram, MailboxStrategy

COMPENSATE = ("uncovered", "always")
COMPENSATE_HELP = ("which pushes the term compensates: 'uncovered' (those whose delay is longer than the "
                   "look-ahead's one push from each other worker: a straggler's; every push without the "
                   "look-ahead) or 'always' (every push, the look-ahead's residual included)")


@dataclass
class CompensateOption(OptionGroup):
    """Which pushes dc-asgd compensates (a group of its own so that its field keeps its place)."""

    compensate: str = option("always", COMPENSATE_HELP, flag="--dc-compensate", choices=COMPENSATE)

    def __post_init__(self):
        super().__post_init__()
        check_choice("compensate", self.compensate, COMPENSATE, "'uncovered' (the pushes delayed beyond what the "
                     "look-ahead covers) or 'always' (every push)")


@dataclass
class DCASGDOptions(ServerKernelOption, ServerMomentum, PushClipOption, CompensateOption, LookaheadOption, PushRate, InboxSlots,
                    Compression, Compensation):
    """dc-asgd's options: the compensation, compression, push rate, look-ahead, compensate, push clip,
    the servers' momentum, the servers' kernel."""



class DCASGD(MailboxStrategy):
    """dc-asgd: the server applies ``w -= lr * (g + lam * g * g * (w - w_bak(m)))`` per push.

    Options:
        lam: compensation strength (default 2.0, the paper's lam0 for DC-ASGD-a; 0 gives asgd's
            update).
        adaptive: DC-ASGD-a, ``lam / sqrt(MS + 1e-7)`` with a running mean square of gradients
            (default True: a small constant lam leaves the term negligible beside the gradient at
            the averaged rate; the adaptive form scales it to the gradients' size).
        ms_momentum: decay of that mean square (default 0.95).
        compression: ``hvd.Compression.fp16`` (or ``'fp16'``) sends the gradient and receives the
            weights in half precision, half the bytes; the servers keep and update fp32 weights.
            A gradient element beyond fp16's range (65504) rounds to infinity (from 65520), and the worker
            skips the whole push, as any non-finite one (no shard applies a part of it).
        push_rate: ``'average'`` (default: the server applies ``lr / workers`` per push, so a round
            of pushes makes one ssgd step, as asgd's) or ``'full'`` (``lr`` per push).
        lookahead: answer each push with ``w - lr * momentum * sum_k buf_k`` (DANA's look-ahead, Hakimi
            et al. 2019: where the workers' momentum will have carried the weights when this worker's
            next gradient lands; the backup ``w_bak(m)`` is that point) instead of ``w`` (default
            True; without momentum the two are the same).
        compensate: ``'always'`` (default: every push gets the term) or ``'uncovered'`` (only a push
            whose delay goes beyond what the look-ahead covers, one push from each other worker: a
            straggler's, or one that waited on a busy machine; without the look-ahead, every push).
            In a round robin the look-ahead leaves only the other workers' new gradients between the
            point a gradient was computed at and the weights it lands on, which ``g * g`` does not
            predict; the guide's convergence section compares the two settings.
        push_clip: a push whose gradient norm exceeds ``push_clip`` times the running mean of the
            pushes' gradient norms on the shard (decay 0.9) is scaled down to that bound (default
            1.5; 0: never): one push far out of line with the others (a real push order can hold
            such bursts) cannot throw the weights off.
        server_momentum: ``'per-worker'`` (default: each worker's pushes go through a momentum buffer of its
            own, so a round of pushes makes one ssgd momentum step) or ``'shared'`` (one buffer every
            push goes through, as MXNet's DC-ASGD keeps: the servers hold no momentum copy per worker;
            the look-ahead is then ``w - lr * (m + m**2 + ... + m**P) * v``, P the workers pushing).
    """

    def payload(self, grad, loss) -> "DCPayload":
        """Adds the whole gradient's 2-norm where the push clip reads it: a server holds one shard's
        slice only, and a clip on the whole norm scales every shard's slice alike."""
        norm = float(grad.norm()) if self.options.push_clip else 0.0
        return DCPayload(**dataclasses.asdict(super().payload(grad, loss)), grad_norm=norm)

    def add_server_stats(self, stats, rows) -> None:
        """The servers' pushes and the sums over them of ``||compensated step - g||^2`` and ``||g||^2``
        (the shards' parts add up)."""
        sums = window.named_sums(rows, DCProgram.sums)
        stats.compensation = CompensationSums(sums["compensation_sq"], sums["grad_sq"], rows[0]["pushes"])


class DCASGDAlgorithm(MailboxAlgorithm):
    """dc-asgd's declaration: its rule in the servers' program (replayable, its registry row says: one
    push, one update, applied in the order the mailbox takes them)."""

    Options: ClassVar[type] = DCASGDOptions  # a subclass declares its own
    strategy: ClassVar[type] = DCASGD

    @classmethod
    def server_program(cls, host):
        return DCProgram(host, cls.server_spec(host))


@dataclass(frozen=True)
class DCPayload(SGDPayload):
    """dc-asgd's push: SGD's hyperparameters and the whole gradient's 2-norm (0: not sent)."""

    grad_norm: float = 0.0



class DCProgram(MailboxProgram):
    """dc-asgd's server side: each push compensated, through its worker's momentum buffer, answered with
    the look-ahead weights; built from dc-asgd's options."""

    uses_grad_norm = True  # (the workers' stats and the push clip read it)
    Payload = DCPayload
    sums = ("compensation_sq", "grad_sq")  # over the applied pushes (DCASGD.add_server_stats reads them)

    def __init__(self, host, options, rule=None, compensate: Optional[str] = None):
        """``rule`` and ``compensate``: a program that extends this one passes its own (lc-asgd's rule,
        which compensates every push); by default dc-asgd's, from ``options``."""
        super().__init__(host)
        if rule is None:
            rule = DCRule(options.lam, adaptive=options.adaptive, ms_momentum=options.ms_momentum)
        self.rule, self.compensate = rule, options.compensate if compensate is None else compensate
        self.push_clip = PushClip(options.push_clip) if options.push_clip else None
        self.state = rule.init(self.host.weights)
        self.state.backup = self.host.outbox  # what each worker received: with the look-ahead, that point
        shared = options.shared_momentum  # one buffer (MailboxProgram.sgd_state) for every push
        self.momentum = None if shared else [{} for _ in range(self.host.spec.workers)]  # as asgd's workers
        self.lookahead = Lookahead(self.host.weights, shared=shared) if options.lookahead else None
        self.fused: Optional[FusedPush] = None  # the push as one compiled loop (rules/fused.py), where chosen
        if FusedPush.wanted(options.server_kernel, host.weights.numel()):
            self.fused = FusedPush(f"server {host.shard}")
            # before the first push: the variant of a push with momentum, compensated, looked ahead if chosen
            self.warm_up(self.variant(True, {"momentum": 0.9}, 1.0, 1.0 if self.lookahead else 0.0))

    def compensated(self, worker, grad, payload) -> torch.Tensor:
        """The rule's compensated step; under ``compensate='uncovered'`` only for a push applied later
        than the version its gradient stands for (:meth:`computed_at`)."""
        active = self.active_for(worker, payload)
        return self.rule.compensated(self.host.weights, grad, self.state, worker, active=active)

    def active_for(self, worker, payload) -> bool:
        """Whether this push gets the compensation (``compensate``: always, or only where uncovered)."""
        return self.compensate == "always" or self.host.version > self.computed_at(worker, payload)

    def plan(self, worker, payload) -> Tuple[bool, float]:
        """Before the push's slices: whether it gets the compensation, and the factor ``r`` its step
        ``r * (grad + term)`` is scaled by (dc-asgd's is 1)."""
        return self.active_for(worker, payload), 1.0

    def change_sq(self, term, grad, r: float, scratch) -> float:
        """One slice's part of the squared norm of what the step adds to the gradient (the workers'
        stats, TensorBoard ``compensation/``): the term's, taken before it joins the gradient, so that
        measuring costs no pass of its own."""
        return 0.0 if term is None else float(term.norm()) ** 2

    def computed_at(self, worker, payload) -> int:
        """The version the worker's gradient stands for. Without the look-ahead, the one it pulled.
        With it, the worker computed at the point where the other workers' momentum terms (the
        buffers in the look-ahead's sum) will have carried the weights when this push lands: one push
        from each of them later, so ``held + (their number)``, capped at now. What is left between that
        point and the weights the push lands on is the other workers' new gradients, which the
        compensation's ``g * g`` curvature does not predict; a straggler's extra rounds go beyond it."""
        held = self.held[worker]
        if not self.looks_ahead(payload.sgd_kwargs()):
            return held
        if self.momentum is None:  # a shared buffer: the answer looked ahead over every worker pushing
            others = len(self.active - {worker})
        else:
            others = sum(1 for k, state in enumerate(self.momentum)
                         if k != worker and state.get("momentum_buffer") is not None)
        return min(self.host.version, held + others)

    def looks_ahead(self, kwargs) -> bool:
        """Whether this program answers a push with these SGD settings with the look-ahead point."""
        return self.lookahead is not None and Lookahead.applies(kwargs)

    def buffer(self, worker) -> Dict:
        """The SGD state ``worker``'s push steps through: its own, or the one shared by every push."""
        return self.sgd_state if self.momentum is None else self.momentum[worker]

    def ahead(self, worker, kwargs) -> Tuple[float, Optional[torch.Tensor]]:
        """The look-ahead's step for this answer, and the buffer it multiplies (None: the per-worker
        buffers' sum): 0 where the push is not answered ahead."""
        if not self.looks_ahead(kwargs):
            return 0.0, None
        if self.momentum is not None:
            return kwargs["lr"] * kwargs["momentum"], None
        pushes = len(self.active)  # the other workers pushing, and this one's own next push
        return Lookahead.shared_step(kwargs["lr"], kwargs["momentum"], pushes), self.sgd_state.get("momentum_buffer")

    def state_dict(self) -> Dict:
        state = super().state_dict()
        momentum = None if self.momentum is None else list(self.momentum)
        state.update(momentum=momentum, rule=self.state.saved(),
                     push_clip_mean=self.push_clip.mean if self.push_clip else None,
                     lookahead_total=None if self.lookahead is None else self.lookahead.total)
        return state

    def load_state_dict(self, state: Dict) -> None:
        if (state["momentum"] is None) != (self.momentum is None):
            saved = "shared" if state["momentum"] is None else "per-worker"
            raise ValueError(f"this checkpoint's servers kept {saved} momentum; resume with "
                             f"--server-momentum {saved} (server_momentum={saved!r})")
        super().load_state_dict(state)
        if self.momentum is not None:
            self.momentum = [tensors_copy(buf) for buf in state["momentum"]]
        if self.push_clip is not None:
            self.push_clip.mean = state.get("push_clip_mean")
        if self.lookahead is not None and self.momentum is not None:
            self.lookahead.restore(state.get("lookahead_total"), self.momentum)
        self.state.load(tensors_copy(state["rule"]))

    def variant(self, active: bool, kwargs, r: float, step: float) -> Variant:
        """The fused push's variant for a push with these settings (its look-ahead ``step``)."""
        dc = self.rule.compensation
        if self.host.outbox is None:
            answer = "none"
        elif not step:
            answer = "weights"
        else:
            answer = "ahead" if self.momentum is not None else "ahead_buffer"
        return Variant(adaptive=dc.adaptive, compensated=bool(active and dc.lam), momentum=bool(kwargs["momentum"]),
                       total=self.lookahead is not None and self.momentum is not None and bool(kwargs["momentum"]),
                       answer=answer, scaled=r != 1.0)

    def fusable(self, grad, kwargs) -> bool:
        """Whether the fused push covers this one: fp32 arrays throughout, no Nesterov momentum."""
        outbox = self.host.outbox
        return (self.fused is not None and not kwargs.get("nesterov", False) and grad.dtype == torch.float32
                and self.host.weights.dtype == torch.float32 and (outbox is None or outbox[0].dtype == torch.float32))

    def on_push(self, worker, grad, payload, grad_norm=None) -> None:
        """The push in one sweep over the shard after the finite check, slice by slice
        (:class:`~hvd_async.rules.Blocks`): the term (:meth:`DCRule.term_of`), the gradient and the
        term added straight into the momentum buffer, the look-ahead's sum following the buffer, the
        weights, the answer (:meth:`SGDRule.step_`). What is not elementwise is a number known before
        the slices (the push clip's norms, lc-asgd's ratio ``r``) or a sum of theirs (the
        compensation's size). Where the program has a compiled push (:attr:`fused`) and it covers this
        one (:meth:`fusable`), the same arithmetic runs as that one loop over the whole shard instead."""
        staleness = self.staleness(worker)
        active, r = self.plan(worker, payload)
        if grad_norm is None:
            grad_norm = float(grad.norm())
        scale = r  # the step's factor: r, and the push clip's (which the compensation's size leaves out)
        if self.push_clip is not None:  # on the whole gradient's norm (the worker sends it): every shard alike
            whole = payload.grad_norm
            scale *= self.push_clip.scale(whole if whole > 0 else grad_norm)
        kwargs, buffer = payload.sgd_kwargs(), self.buffer(worker)
        self.sgd.ready_buffer_(buffer, grad, kwargs["momentum"])
        step, ahead_total = self.ahead(worker, kwargs)
        weights, mean_square = self.host.weights, self.state.mean_square
        backup = self.host.outbox[worker] if active else None  # what the worker received: w_bak
        total = None if self.lookahead is None else self.lookahead.total

        def chain(sl, scratch) -> float:
            w, g = weights[sl], grad[sl]
            term = self.rule.term_of(w, g, None if backup is None else backup[sl],
                                     None if mean_square is None else mean_square[sl], scratch)
            size = self.change_sq(term, g, r, scratch)
            out = scratch.take(g, 2)[1]  # free once the term is made (Nesterov's direction)
            self.sgd.step_(w, [(g, scale), (term, scale)], self.sgd.sliced(buffer, sl),
                           total=None if total is None else total[sl], out=out, **kwargs)
            self.answer_slice(worker, sl, scratch, step, ahead_total)
            return size

        variant = self.variant(active, kwargs, r, step) if self.fusable(grad, kwargs) else None
        if variant is not None:
            self.warm_up(variant)  # (at once where warm_up compiled it before the first push)
        if variant is not None and self.fused is not None:
            dc = self.rule.compensation
            numbers = (dc.lam, dc.ms_momentum, dc.eps, scale, kwargs["momentum"], kwargs["weight_decay"],
                       kwargs["lr"], step, r)
            compensation_sq = self.fused(variant, weights, grad, None if self.host.outbox is None else
                                         self.host.outbox[worker], mean_square,
                                         buffer.get("momentum_buffer"),
                                         total if variant.total else None, numbers)
        else:
            compensation_sq = self.blocks.run(chain)
        self.host.add_sums(compensation_sq, grad_norm ** 2)
        self.host.bump([staleness])
        self.snapshot(worker, copy=False)
        self.host.answer(worker, staleness, window.Status.APPLIED)

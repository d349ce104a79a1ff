"""The servers' program that applies the mean of every ``c`` gradients as one update: softsync's rule
(``c = floor(workers / n)``), and od-sgd's global step (every worker's gradient, averaged). A public
piece of the parameter-server family, built from plain values rather than one algorithm's options."""
from typing import Any, Dict, List, Optional

import torch

from ..checkpoint import tensors_copy
from ..rules import RunningMean, fold_
from ..rules.fused import FusedPush, Variant
from ..transport import window
from .ps import Lookahead, MailboxProgram


class AggregateProgram(MailboxProgram):
    """The servers apply the mean of every ``every`` gradients as one update (softsync's rule, od-sgd's
    global step with ``every`` = the workers): each push is folded into a running mean at once (through
    its worker's momentum buffer, or one shared buffer applies the mean), and the push that completes
    the aggregate applies it and answers its pushers."""

    def __init__(self, host, *, every: int, rate: float, staleness_lr: bool, shared_momentum: bool,
                 lookahead: bool, server_kernel: str = "auto"):
        """``every``: gradients an update takes (fewer when fewer workers are pushing); ``rate``: the
        share of the optimizer's lr an update takes; ``staleness_lr``: each gradient's rate divided by
        its staleness; ``shared_momentum``: one momentum buffer for the aggregates (else one per worker,
        through which each gradient goes as it lands); ``lookahead``: with per-worker buffers, answer
        each pusher with the look-ahead weights; ``server_kernel``: as dc-asgd's option."""
        super().__init__(host)
        self.outbox_on_push = host.spec.outbox  # False: the pushers read the weights window after the answer
        self.c = max(1, int(every))
        self.scale = staleness_lr
        self.rate = rate
        self.pending: List = []  # (worker, payload, staleness) of the gradients in the running mean
        self.mean = RunningMean(host.weights, scale=self.scale)
        # per worker: each worker's gradients go through its own momentum buffer (dc-asgd's and
        # asgd's), and the aggregate is the staleness-scaled mean of the workers' directions: one
        # aggregate of every worker is then ssgd's single buffer (the mean of linear buffers). Shared: one buffer.
        self.momentum = None if shared_momentum else [{} for _ in range(host.spec.workers)]
        # the look-ahead needs the per-worker buffers, and the pushers' answers in their outbox slots
        use = lookahead and self.momentum is not None and self.outbox_on_push
        self.lookahead = Lookahead(host.weights) if use else None
        # an aggregate of one push through its worker's buffer is dc-asgd's push without the term: the
        # compiled loop (rules/fused.py) applies it, where chosen
        self.fused: Optional[FusedPush] = None
        if self.c == 1 and self.momentum is not None and FusedPush.wanted(server_kernel, host.weights.numel()):
            self.fused = FusedPush(f"server {host.shard}")
            self.warm_up(self.variant(0.9, 1.0 if self.lookahead is not None else 0.0))

    def variant(self, momentum: float, step: float) -> Variant:
        """The fused push's variant for a one-push aggregate with this momentum and look-ahead ``step``."""
        answer = "none" if not self.outbox_on_push else "ahead" if step else "weights"
        return Variant(adaptive=False, compensated=False, momentum=bool(momentum),
                       total=self.lookahead is not None and bool(momentum), answer=answer, scaled=False)

    def fused_push(self, worker: int, grad, payload, factor: float) -> bool:
        """A push that is its own aggregate (``c`` = 1, per-worker momentum) as the compiled loop: the
        worker's direction through its buffer, the look-ahead's sum, the step (the mean's division and
        the staleness factor folded into the rate), the answer. False, and nothing done, where the loop
        does not cover it (Nesterov, fp16 slots, no compiled push)."""
        kwargs, outbox = payload.sgd_kwargs(), self.host.outbox
        if (self.fused is None or self.momentum is None or len(self.pending) != 1 or kwargs["nesterov"]
                or grad.dtype != torch.float32
                or (outbox is not None and outbox[0].dtype != torch.float32)):
            return False
        step = self.rate * kwargs["lr"] * kwargs["momentum"] if Lookahead.applies(kwargs) else 0.0
        variant = self.variant(kwargs["momentum"], step)
        self.warm_up(variant)
        if self.fused is None:
            return False
        _, inverse = self.mean.sum_()  # (the sum itself is not formed: the loop applies the one term)
        lr = self.rate * kwargs["lr"] * inverse * factor
        self.fused(variant, self.host.weights, grad, None if outbox is None else outbox[worker], None,
                   self.momentum[worker].get("momentum_buffer"),
                   None if self.lookahead is None else self.lookahead.total,
                   (0.0, 0.0, 1.0, 1.0, kwargs["momentum"], kwargs["weight_decay"], lr, step, 1.0))
        self.applied()
        return True

    def on_push(self, worker, grad, payload, grad_norm=None) -> None:
        """Fold the gradient (or, with per-worker momentum, its worker's direction) into the running
        mean at once: the weights do not move before the aggregate, so each term is what it would be
        then, and the inbox slot is free again. A push that completes the aggregate folds, applies it
        and writes the answers slice by slice (:meth:`maybe_apply`)."""
        staleness = self.staleness(worker)
        factor, first = self.mean.count_(staleness)
        weights, mean = self.host.weights, self.mean.total
        kwargs: Any  # the SGD keywords, set with buffer (fold reads them where buffer is set)
        buffer, kwargs, total = None, None, None
        if self.momentum is not None:  # the worker's direction (its buffer; the look-ahead's sum follows it)
            kwargs, buffer = payload.sgd_kwargs(), self.momentum[worker]
            del kwargs["lr"]
            self.sgd.ready_buffer_(buffer, grad, kwargs["momentum"])
            total = None if self.lookahead is None else self.lookahead.total

        def fold(sl, scratch) -> None:
            g = grad[sl]
            if buffer is not None:
                g = self.sgd.direction_(weights[sl], [(g, 1.0)], self.sgd.sliced(buffer, sl),
                                        total=None if total is None else total[sl], out=scratch, **kwargs)
            fold_(mean[sl], g, factor, first)

        self.pending.append((worker, payload, staleness))
        if self.complete():
            if not self.fused_push(worker, grad, payload, factor):
                self.maybe_apply(fold)
        else:
            self.blocks.run(fold)

    def waiting_on(self):
        """Gradients wait for the aggregate: every worker still pushing may be the one it waits for."""
        return self.active if self.pending else ()

    def state_dict(self) -> Dict:
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} gradient(s) wait for the "
                               f"aggregate; save after load_global_model() on every worker")
        state = super().state_dict()
        if self.momentum is not None:
            state["momentum"] = list(self.momentum)
            state["lookahead_total"] = None if self.lookahead is None else self.lookahead.total
        return state

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        if self.momentum is not None and "momentum" in state:
            self.momentum = [tensors_copy(buf) for buf in state["momentum"]]
            if self.lookahead is not None:
                self.lookahead.restore(state.get("lookahead_total"), self.momentum)

    def on_leave(self, worker) -> None:
        super().on_leave(worker)
        self.maybe_apply()

    def mean_chain(self, kwargs):
        """The aggregate's step as a chain of slices: the mean of the running sum at the rate ``kwargs``
        give (scaled by the push rate), the division folded into the step; through the shared buffer,
        or of the workers' directions already through theirs."""
        total, inverse = self.mean.sum_()
        if self.momentum is None:
            return self.mean_step(total, self.rate * inverse, kwargs)
        weights, alpha = self.host.weights, -self.rate * kwargs["lr"] * inverse

        def chain(sl, scratch) -> None:
            weights[sl].add_(total[sl], alpha=alpha)
        return chain

    def apply_mean(self, kwargs) -> None:
        """The aggregate's step alone, where no push comes with it (a worker left)."""
        self.blocks.run(self.mean_chain(kwargs))

    def complete(self) -> bool:
        """Whether the ``c`` gradients are in (fewer when fewer workers are pushing at all)."""
        return bool(self.pending) and len(self.pending) >= max(1, min(self.c, len(self.active)))

    def maybe_apply(self, fold=None) -> None:
        """Apply once the aggregate is :meth:`complete`. With ``fold`` (the completing push's chain) the
        fold, the step and the answers of one slice go before the next slice's."""
        if not self.complete():
            return
        workers = [m for m, _, _ in self.pending]
        last = self.pending[-1][1].sgd_kwargs()  # the rate and momentum of the aggregate's step
        if fold is None:
            self.apply_mean(last)
        else:
            apply = self.mean_chain(last)
        # with the look-ahead, each push's share of an aggregate's rate is rate * lr / c
        step = self.rate * last["lr"] * last["momentum"] / len(workers) if Lookahead.applies(last) else 0.0
        answered = workers if self.outbox_on_push else []  # (else the pushers read the weights window)

        def chain(sl, scratch) -> None:
            if fold is not None:
                fold(sl, scratch)
                apply(sl, scratch)
            for m in answered:
                self.answer_slice(m, sl, scratch, step)

        if fold is not None or answered:
            self.blocks.run(chain)
        self.applied()

    def applied(self) -> None:
        """The pending aggregate was applied: count it, and answer its pushers."""
        workers = [m for m, _, _ in self.pending]
        staleness = [s for _, _, s in self.pending]
        self.host.bump(staleness, pushes=len(workers))
        self.pending = []
        for m, s in zip(workers, staleness):
            self.snapshot(m, copy=False)
            self.host.answer(m, s, window.Status.APPLIED)

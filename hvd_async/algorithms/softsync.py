"""softsync (n-softsync): the servers apply the mean of every ``floor(workers / n)`` gradients."""
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from ..checkpoint import tensors_copy
from ..checks import is_int_at_least, user_stacklevel
from ..options import option
from ..rules import RunningMean, fold_
from ..rules.fused import FusedPush, Variant
from ..transport import window
from .compensation import ServerKernelOption
from .groups import (SERVER_MOMENTA, SERVER_MOMENTUM_DEFAULT, Compression, InboxSlots, LookaheadOption,
                     OptionGroup, PushRate, ServerMomentum, check_choice)
from .ps import Lookahead, MailboxProgram, MailboxStrategy


@dataclass
class AggregateOptions(OptionGroup):
    """softsync's aggregate: how many gradients, and their rates (the first of its own fields)."""

    n: Optional[int] = option(None, "apply an update per floor(workers/N) gradients, N in 1..workers "
                              "(default: workers)", flag="--softsync-n", metavar="N")
    staleness_lr: bool = option(False, "divide each gradient's rate by its staleness (the paper's rule)",
                                flag="--softsync-staleness-lr", action="store_true")

    def __post_init__(self):
        super().__post_init__()
        if self.n is not None and not is_int_at_least(self.n, 1):
            raise ValueError(f"n must be an integer between 1 and the number of workers, got {self.n!r}")
        if not isinstance(self.staleness_lr, bool):
            raise ValueError(f"staleness_lr must be True or False, got {self.staleness_lr!r}")


@dataclass
class DeprecatedMomentum(ServerMomentum):
    """softsync's ``momentum`` (``--softsync-momentum``), the name it had before the servers' momentum
    took one name for every algorithm (``server_momentum``, ``--server-momentum``): still accepted,
    with a FutureWarning, and moved onto ``server_momentum``."""

    momentum: Optional[str] = option(None, "deprecated: the old name of --server-momentum (same values)",
                                     flag="--softsync-momentum", choices=SERVER_MOMENTA)

    def __post_init__(self):
        if self.momentum is not None:
            check_choice("momentum", self.momentum, SERVER_MOMENTA, "'per-worker' or 'shared' (and name it "
                         "server_momentum: momentum is its deprecated name)")
            if self.server_momentum not in (SERVER_MOMENTUM_DEFAULT, self.momentum):
                raise ValueError(f"momentum={self.momentum!r} and server_momentum={self.server_momentum!r} say two "
                                 f"things; give server_momentum alone (momentum is its deprecated name)")
            warnings.warn(f"softsync's momentum={self.momentum!r} (--softsync-momentum) is deprecated and will be "
                          f"removed: use server_momentum={self.momentum!r} (--server-momentum), the name dc-asgd "
                          f"and lc-asgd use", FutureWarning, stacklevel=user_stacklevel())
            self.server_momentum, self.momentum = self.momentum, None
        super().__post_init__()


@dataclass
class SoftSyncOptions(ServerKernelOption, LookaheadOption, PushRate, DeprecatedMomentum, InboxSlots, Compression,
                      AggregateOptions):
    """softsync's options: n and staleness_lr, compression, server momentum, push rate, look-ahead, the
    servers' kernel."""


class SoftSync(MailboxStrategy):
    """softsync (n-softsync): the server applies one update per ``c = floor(workers / n)`` gradients
    (their mean, each optionally divided by its staleness); ``n=1`` is synchronous SGD, ``n=workers``
    asgd.

    Options:
        n: 1 .. workers (default: workers).
        push_rate: ``'average'`` (default: an aggregate of ``c`` gradients takes ``c / workers``
            of ``lr``, so the ``n`` aggregates of a round of pushes make one ssgd step, as asgd's
            pushes do) or ``'full'`` (``lr`` per aggregate).
        staleness_lr: divide each gradient's rate by ``max(1, staleness)`` (the paper's rule;
            default False: on top of ``push_rate='average'`` it cuts the progress per epoch again).
        compression: as dc-asgd's (fp16 on the wire, fp32 on the servers).
        server_momentum: ``'per-worker'`` (default: each worker's gradients go through a momentum buffer of
            its own, as in dc-asgd and asgd, and an aggregate is the mean of the workers' directions,
            so ``n=1`` is ssgd and ``n=workers`` with ``staleness_lr=False`` is asgd with
            ``push_rate='full'``) or ``'shared'`` (one buffer for every aggregate).
        lookahead: with per-worker momentum, answer each push with the look-ahead weights, as
            dc-asgd does (default True).
    """

    name = "softsync"
    Options = SoftSyncOptions
    scales_on_server = True  # an aggregate's rate is set where it is known how many gradients it holds

    def __init__(self, optimizer, named_parameters, transport, options):
        self._resolve_n(options, transport.size)
        super().__init__(optimizer, named_parameters, transport, options)

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        cls._resolve_n(options, comms.group.size)  # before the servers are asked to open anything
        return super().make_transport(named_parameters, options, comms)

    @classmethod
    def resolve_options(cls, options, workers: int) -> None:
        cls._resolve_n(options, workers)

    @classmethod
    def check_for_job(cls, given, *, workers, lr: float) -> None:
        n = given.get("n")
        if isinstance(n, int) and (n < 1 or (workers is not None and n > workers)):
            raise ValueError(f"n {n} must be between 1 and the number of workers ({workers})")

    @staticmethod
    def _resolve_n(options, workers: int) -> None:
        if options.n is None:
            options.n = workers
        if not 1 <= options.n <= workers:
            raise ValueError(f"n must be between 1 and the number of workers ({workers}), got {options.n}")

    @classmethod
    def outbox_for(cls, options) -> bool:
        """An outbox only for the per-worker look-ahead, whose answer differs per worker, or under fp16
        compression (the answer crosses in half precision; the weights window is fp32); otherwise every
        pusher reads the weights window after its answer, and the servers hold no copy per worker."""
        return (not options.shared_momentum and options.lookahead) or options.compression == "fp16"

    @classmethod
    def server_program(cls, host):
        return SoftSyncProgram(host, cls.server_spec(host))



class SoftSyncProgram(MailboxProgram):
    """softsync's server side: the mean of every ``c`` gradients, one update; built from softsync's
    options (``n`` resolved)."""

    def __init__(self, host, options: SoftSyncOptions):
        super().__init__(host)
        self.outbox_on_push = host.spec.outbox  # False: the pushers read the weights window after the answer
        self.c = max(1, host.spec.workers // options.n)
        self.scale = options.staleness_lr
        lookahead = options.lookahead
        # 'average': an aggregate of c gradients takes c / workers of the rate, so that the
        # aggregates of one round of pushes (one per worker) make one ssgd step
        self.rate = self.c / host.spec.workers if options.push_rate == "average" else 1.0
        self.pending: List = []  # (worker, payload, staleness) of the gradients in the running mean
        self.mean = RunningMean(host.weights, scale=self.scale)
        # 'per-worker': each worker's gradients go through its own momentum buffer (dc-asgd's and
        # asgd's), and the aggregate is the staleness-scaled mean of the workers' directions: n=1 is
        # then ssgd's single buffer (the mean of linear buffers), n=workers asgd's. 'shared': one buffer.
        self.momentum = None if options.shared_momentum else [{} for _ in range(host.spec.workers)]
        # the look-ahead needs the per-worker buffers, and the pushers' answers in their outbox slots
        use = lookahead and self.momentum is not None and self.outbox_on_push
        self.lookahead = Lookahead(host.weights) if use else None
        # an aggregate of one push through its worker's buffer is dc-asgd's push without the term: the
        # compiled loop (rules/fused.py) applies it, where chosen
        self.fused: Optional[FusedPush] = None
        if self.c == 1 and self.momentum is not None and FusedPush.wanted(options.server_kernel, host.weights.numel()):
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

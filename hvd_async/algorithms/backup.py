"""backup-sgd: synchronous SGD with backup workers; each update is the mean of the first
``workers - backups`` gradients computed on the current weights, the rest are dropped.

Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting Distributed Synchronous SGD" (2016; TensorFlow's
``SyncReplicasOptimizer`` with ``replicas_to_aggregate < total_num_replicas``). Horovod cannot do it
(an allreduce waits for every rank); the parameter servers' mailbox can:

- a worker pushes its gradient; the shard knows the version of the weights it computed it on (the
  version the shard last answered that worker with: the worker trains on exactly what it received,
  so the push carries its version implicitly, per shard);
- the shard accepts a push if that version is the current one, and holds it; at the
  ``workers - backups``-th accepted push it applies their mean with the SGD rule (lr, momentum,
  weight decay, Nesterov of the wrapped ``torch.optim.SGD``, one momentum buffer as ssgd's), bumps
  the version and answers the accepted workers with the new weights;
- a push computed on an older version is dropped: counted (per worker, and in the shard's
  ``sums[0]``) and answered at once with the current weights, so a slow worker never waits longer
  than its own push's round trip and starts its next gradient on the newest weights.

Choices where the paper leaves room: with fewer workers pushing than ``workers - backups`` (some went
idle to evaluate at an epoch's end, or ``--worker-timeout`` set one aside) an update takes every
active worker's gradient, as softsync's aggregate does; with several server shards each shard takes
its own first ``workers - backups`` (a push reaches the shards in its own order on each), so a
coordinate block is always the mean of that many gradients computed on the same weights.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from ..checks import is_int_at_least
from ..options import option
from ..rules import RunningMean
from ..rules.fused import FusedPush, Variant
from ..transport import window
from .compensation import ServerKernelOption
from .groups import COMPRESSION_DEFAULT, Compression, InboxSlots, OptionGroup
from .ps import MailboxAlgorithm, MailboxProgram, MailboxStrategy


@dataclass
class BackupsOption(OptionGroup):
    """How many late gradients each step drops (backup-sgd's own field, before compression)."""

    backups: Optional[int] = option(None, "each update is the mean of the first workers-B gradients computed on "
                                    "the current weights; the B late ones are dropped, 0 <= B < workers "
                                    "(default: 1; 0 with a single worker)", flag="--backups", metavar="B")

    def __post_init__(self):
        super().__post_init__()
        if self.backups is not None and not is_int_at_least(self.backups, 0):
            raise ValueError(f"backups must be an integer from 0 to workers - 1 (how many late gradients each "
                             f"step drops), got {self.backups!r}")


@dataclass
class BackupSGDOptions(ServerKernelOption, InboxSlots, Compression, BackupsOption):
    """backup-sgd's options: backups, the compression group (its help in this algorithm's words) and how
    the servers run an update (``server_kernel``)."""

    compression: Any = option(COMPRESSION_DEFAULT, "'fp16': gradients and weights cross the network in half "
                              "precision (fp32 weights and arithmetic on the servers)")


def check_backups(backups, workers: int) -> None:
    """``0 <= backups < workers``, in one line that says what to do."""
    if not 0 <= backups < workers:
        raise ValueError(f"backups {backups} must be between 0 and the number of workers minus 1 ({workers - 1}): "
                         f"each step needs at least one gradient; use fewer backups or more workers")


class BackupSGD(MailboxStrategy):
    """backup-sgd: synchronous SGD that does not wait for the ``backups`` slowest workers of a step.

    Each update of the global weights is one step of the wrapped ``torch.optim.SGD`` (its ``lr``,
    ``momentum``, ``weight_decay``, ``nesterov``; one momentum buffer on the servers, as ssgd's on the
    mean gradient) with the mean of the first ``workers - backups`` gradients computed on the current
    weights; later gradients for those weights are dropped. A worker whose gradient was accepted waits
    for the update and continues from the new weights; a dropped one receives the new weights at once.
    ``backups=0`` is ssgd (every gradient, one step per round).

    Options:
        backups: B, from 0 to workers - 1 (default 1; 0 with a single worker). The paper's rule of
            thumb: about the number of workers that are slow at any time (a few percent of them).
        compression: as dc-asgd's (fp16 on the wire, fp32 on the servers).
        server_kernel: as dc-asgd's: 'auto' (the default) applies an update as one compiled loop over a
            large shard (the round's gradients read from the inbox slots they wait in, the step and every
            answer in one pass), 'eager' as torch operations.

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      model.named_parameters(), algorithm="backup-sgd", backups=1)

    Tuning: use ssgd's hyperparameters (an update is one ssgd step, over ``workers - backups``
    gradients). ``stats()["dropped"]`` counts this worker's dropped pushes; a worker dropped almost
    every time is slower than the rest by more than a step: more backups do not help it, fixing it does.
    """

    scales_on_server = True  # an update is one whole step of lr, whatever the number of gradients in it

    def __init__(self, optimizer, named_parameters, transport, options):
        BackupSGDAlgorithm.resolve_options(options, transport.size)  # (a transport given by the caller)
        super().__init__(optimizer, named_parameters, transport, options)
        self.dropped = 0

    def _count(self, answers) -> None:
        status = answers.rows[:, window.R_STATUS]
        if (status == window.Status.DROPPED).any() and not (status == window.Status.SKIPPED).any():
            self.dropped += 1  # (by one shard at least: each shard takes its own first pushes)
        else:
            super()._count(answers)

    @property
    def dropped_gradients(self) -> int:  # type: ignore[override]  # read-only by design: nothing sets it
        """This worker's pushes dropped as late (the job counts their samples as not applied)."""
        return self.dropped

    def add_server_stats(self, stats, rows) -> None:
        """``dropped_pushes`` (every worker's pushes the first shard dropped: each shard takes its own
        first pushes) and, in ``extra``, ``dropped`` (this worker's pushes dropped as late)."""
        stats.dropped_pushes = int(window.named_sums(rows[:1], BackupProgram.sums)["dropped_pushes"])
        stats.extra["dropped"] = self.dropped

    def state_dict(self):
        state = super().state_dict()
        state["dropped"] = self.dropped
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.dropped = int(state["dropped"])


class BackupSGDAlgorithm(MailboxAlgorithm):
    """backup-sgd's declaration: ``backups`` resolved from the workers, its program."""

    Options = BackupSGDOptions
    strategy = BackupSGD

    @classmethod
    def resolve_options(cls, options, workers: int) -> None:
        if options.backups is None:
            options.backups = min(1, workers - 1)
        check_backups(options.backups, workers)

    @classmethod
    def check_for_job(cls, given, *, workers, lr: float) -> None:
        backups = given.get("backups")
        if isinstance(backups, int) and workers is not None:
            check_backups(backups, workers)

    @classmethod
    def server_program(cls, host):
        return BackupProgram(host, cls.server_spec(host))


class BackupProgram(MailboxProgram):
    """A shard's side of backup-sgd: takes the first ``workers - backups`` pushes computed on the current
    weights, applies their mean, drops the later ones (see the module docstring)."""

    sums = ("dropped_pushes",)  # the late pushes it dropped (BackupSGD.add_server_stats reads them)

    def __init__(self, host, options: BackupSGDOptions):
        super().__init__(host)
        self.need = host.spec.workers - options.backups
        self.accepted: List = []  # (worker, payload) of the gradients for the current version, as they came
        self.dropped = [0] * host.spec.workers
        self.mean = RunningMean(host.weights, scale=False)  # their sum, folded in as they land
        # the accepted gradients not folded into the sum yet: with the compiled update, each stays in its
        # worker's own inbox slot (which nothing writes before the worker's answer) until the round's
        # update reads them all in its one loop
        self.waiting: List[torch.Tensor] = []
        self.can_wait = False
        # an update is dc-asgd's push without the term, on the sum: the compiled loop applies it, where chosen
        if FusedPush.wanted(options.server_kernel, host.weights.numel()):
            # each worker's own fp32 inbox slot (no pool, no widening): the gradients may wait where they landed
            self.can_wait = not host.spec.pooled and host.inbox is host.inbox_raw
            self.fused = FusedPush(f"server {host.shard}")
            self.warm_up(self.variant(0.9))
            if self.fused is not None and self.can_wait and not self.fused.ready_round(
                    self.need, self.need if host.outbox is not None else 0, True):
                self.fused = None

    def variant(self, momentum: float) -> Variant:
        """The fused loop's variant for an update with this momentum (the answer: the first accepted
        worker's outbox slot, where the windows have one)."""
        return Variant(adaptive=False, compensated=False, momentum=bool(momentum), total=False,
                       answer="weights" if self.host.outbox is not None else "none", scaled=False)

    def on_push(self, worker, grad, payload, grad_norm=None) -> None:
        if self.held[worker] != self.host.version:  # computed on weights this shard has moved past
            self.drop(worker)
            return
        if self.fused is not None and self.can_wait:
            self.waiting.append(grad)
        else:
            self.mean.add(grad)
        self.accepted.append((worker, payload))
        self.maybe_apply()

    def fold_waiting(self) -> None:
        """Fold the gradients still waiting in their inbox slots into the running sum, in arrival order."""
        for grad in self.waiting:
            self.mean.add(grad)
        self.waiting = []

    def drop(self, worker: int) -> None:
        """Count the late push and answer with the current weights at once."""
        staleness = self.staleness(worker)
        self.dropped[worker] += 1
        self.host.add_sums(1.0)
        self.snapshot(worker)
        self.host.answer(worker, staleness, window.Status.DROPPED)

    def on_leave(self, worker) -> None:
        super().on_leave(worker)
        self.maybe_apply()

    def waiting_on(self):
        """The active workers whose gradient the update still waits for (none while nothing waits)."""
        return self.active - {m for m, _ in self.accepted} if self.accepted else ()

    def apply_mean(self, kwargs) -> None:
        """One SGD step (``kwargs``: the last accepted push's) with the mean of the accepted gradients,
        the division folded into the step, slice by slice."""
        total, inverse = self.mean.sum_()
        self.blocks.run(self.mean_step(total, inverse, kwargs))

    def fusable(self, kwargs) -> bool:
        """Whether a compiled loop covers an update with these SGD settings: one is compiled, no Nesterov
        momentum, fp32 answers."""
        outbox = self.host.outbox
        return (self.fused is not None and not kwargs["nesterov"]
                and (outbox is None or outbox[0].dtype == torch.float32))

    def fused_apply(self, kwargs, first: int) -> bool:
        """The update as the compiled loop: the step through the momentum buffer with the mean folded
        into the rate, and worker ``first``'s answer written in the same pass. False, and nothing done,
        where the loop does not cover it (Nesterov, fp16 slots, no compiled push)."""
        outbox = self.host.outbox
        if not self.fusable(kwargs):
            return False
        variant = self.variant(kwargs["momentum"])
        self.warm_up(variant)
        if self.fused is None:
            return False
        total, inverse = self.mean.sum_()
        self.sgd.ready_buffer_(self.sgd_state, total, kwargs["momentum"])
        self.fused(variant, self.host.weights, total, None if outbox is None else outbox[first], None,
                   self.sgd_state.get("momentum_buffer"), None,
                   (0.0, 0.0, 1.0, inverse, kwargs["momentum"], kwargs["weight_decay"], kwargs["lr"], 0.0, 1.0))
        return True

    def round_apply(self, kwargs, workers: List[int]) -> bool:
        """The update as the compiled round: the gradients read from the inbox slots they wait in, the
        step through the momentum buffer, every accepted worker's answer, in one loop. False, and
        nothing done, unless every accepted gradient waits and they are the ``workers - backups`` the
        round was compiled for (fewer where workers went idle), with momentum and no Nesterov."""
        outbox, fused = self.host.outbox, self.fused
        if (fused is None or not self.fusable(kwargs) or len(self.waiting) != len(workers)
                or len(workers) != self.need or not kwargs["momentum"]):
            return False
        self.sgd.ready_buffer_(self.sgd_state, self.host.weights, kwargs["momentum"])
        fused.round_(self.host.weights, self.sgd_state["momentum_buffer"], self.waiting,
                          [] if outbox is None else [outbox[m] for m in workers], 1.0 / len(workers),
                          kwargs["momentum"], kwargs["weight_decay"], kwargs["lr"])
        self.waiting = []
        return True

    def maybe_apply(self) -> None:
        """Apply once ``workers - backups`` gradients are in (fewer when fewer workers are pushing): as the
        compiled round (:meth:`round_apply`) where it covers the update; else from the running sum, the
        accepted workers' answers then in one sweep (each slice of the weights read once for all; the
        compiled update from the sum writes the first one itself)."""
        if not self.accepted or len(self.accepted) < min(self.need, max(1, len(self.active))):
            return
        workers = [m for m, _ in self.accepted]
        kwargs = self.accepted[-1][1].sgd_kwargs()
        if not self.round_apply(kwargs, workers):
            self.fold_waiting()
            fused = self.fused_apply(kwargs, workers[0])  # (the first answer written with the step)
            if not fused:
                self.apply_mean(kwargs)

            def answers(sl, scratch) -> None:
                for m in workers[1:] if fused else workers:
                    self.answer_slice(m, sl, scratch)

            self.blocks.run(answers)
        self.host.bump([0] * len(workers), pushes=len(workers))
        self.accepted = []
        for m in workers:
            self.snapshot(m, copy=False)
            self.host.answer(m, 0, window.Status.APPLIED)

    def state_dict(self) -> Dict:
        if self.accepted:
            raise RuntimeError(f"{len(self.accepted)} gradient(s) wait for the update; save after "
                               f"load_global_model() on every worker")
        return dict(super().state_dict(), dropped=list(self.dropped))

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self.dropped = [int(v) for v in state["dropped"]]

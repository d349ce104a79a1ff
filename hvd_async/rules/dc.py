"""Delay compensation (DC-ASGD, Zheng et al., ICML 2017): a first-order correction of a stale gradient.

A gradient ``g`` computed at the weights ``w_bak`` a worker last received is applied to the current
weights ``w`` as ``g + lam * g * g * (w - w_bak)`` (elementwise; ``g * g`` stands in for the
Hessian's diagonal). ``lam`` is a constant, or, adaptive (the paper's DC-ASGD-a),
``lam / sqrt(MS + eps)`` with ``MS <- ms_momentum * MS + (1 - ms_momentum) * g * g``. The
compensated gradient then takes an :class:`SGDRule` step (weight decay and momentum as the worker's
optimizer sets them; MXNet's DCASGD puts them in the same place).

Choices: one mean square per shard (the paper's Algorithm 3 keeps one on the server, updated by
every worker's gradient); the backups ``w_bak(m)`` are held by the caller (the server keeps one per
worker per shard) and passed in ``state.backup``: this rule reads them and does not refresh them,
because only the caller knows what the worker received.
"""
import dataclasses
from typing import Any, ClassVar, Dict, Optional, Tuple

import torch

from ..checks import is_finite_number
from .base import Rule, Scratch
from .sgd import SGDRule

_ZERO = torch.zeros(())  # the 0 that addcmul/addcdiv add to, so that each is a product in one pass


def check_compensation(lam, adaptive, ms_momentum) -> None:
    """The compensation's three numbers, as the rule needs them (the one check of them: the rules and
    dc-asgd's and lc-asgd's options call it)."""
    if not (is_finite_number(lam) and lam >= 0):
        raise ValueError(f"lam must be a number >= 0 and finite (0 turns compensation off), got {lam!r}")
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
    if not (is_finite_number(ms_momentum) and 0 <= ms_momentum < 1):
        raise ValueError(f"ms_momentum must be in [0, 1), got {ms_momentum!r}")


class DCRule(Rule):
    """The DC-ASGD server step.

    Args:
        lam: the compensation strength (``>= 0``; the paper uses 0.04 to 2). With ``adaptive`` it is
            the paper's ``lam0``.
        adaptive: scale ``lam`` by ``1 / sqrt(MS + eps)`` (DC-ASGD-a).
        ms_momentum: decay of the mean square ``MS`` (``0 <= m < 1``).
        eps: added under the square root.

    Example::

        >>> w, g = torch.tensor([1.0]), torch.tensor([2.0])
        >>> DCRule(lam=0.5).apply_(w, g, DCState(backup={0: torch.tensor([0.5])}), lr=0.1, worker=0)
        tensor([0.7000])
        >>> # 1 - 0.1 * (2 + 0.5 * 2 * 2 * (1 - 0.5)) = 1 - 0.1 * 3
    """

    name = "dc"

    def __init__(self, lam: float, *, adaptive: bool = False, ms_momentum: float = 0.95,
                 eps: float = 1e-7):
        check_compensation(lam, adaptive, ms_momentum)
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        self.lam, self.adaptive, self.ms_momentum, self.eps = float(lam), bool(adaptive), ms_momentum, eps
        self._sgd = SGDRule()

    @property
    def compensation(self) -> "DCRule":
        """The rule whose term is added (this one; :class:`LCRule` has one inside)."""
        return self

    def init(self, weights: torch.Tensor) -> "DCState":
        return DCState(mean_square=torch.zeros_like(weights) if self.adaptive else None)

    def compensated(self, weights, grad, state, worker: int, active: bool = True) -> torch.Tensor:
        """``g + lam_t * g * g * (w - w_bak(worker))`` (updates ``MS`` if adaptive; ``g`` alone where
        ``active`` is False: the caller's choice not to compensate this push), in a scratch
        tensor of ``state``'s that the caller may change and that the next call overwrites.

        No tensor is allocated per call: on a server every fresh temporary of a large model costs its
        pages' first-touch faults, several times the arithmetic (``lookahead_cost.py``)."""
        return self.joined(self.term(weights, grad, state, worker, active), grad, state)

    def term(self, weights, grad, state, worker: int, active: bool = True):
        """The compensation ``lam_t * g * g * (w - w_bak(worker))`` alone, in the scratch tensor that
        :meth:`compensated` returns (updates ``MS`` if adaptive); None where it is off (``lam`` 0, or
        not ``active``). ``joined(term, grad, state)`` is then that step, bit for bit."""
        backup = state.backup[worker] if self.lam and active else None
        return self.term_of(weights, grad, backup, state.mean_square, state.scratch)

    def term_of(self, weights, grad, backup, mean_square, scratch: Scratch) -> Optional[torch.Tensor]:
        """:meth:`term` on the tensors given: ``backup`` (None: no term; ``MS`` is updated all the same),
        ``mean_square`` (None without ``adaptive``), and the result in ``scratch``'s first tensor. Every
        operation is elementwise, so a server may pass views of one slice of its shard at a time
        (:class:`~hvd_async.rules.Blocks`) and gets each element as the whole shard's call gives it."""
        step, work = scratch.take(grad, 2)
        if self.adaptive:
            mean_square.mul_(self.ms_momentum).addcmul_(grad, grad, value=1.0 - self.ms_momentum)
        if not (self.lam and backup is not None):
            return None
        if backup.dtype != weights.dtype:  # an fp16 outbox slot: widened here, not into a temporary
            backup = step.copy_(backup)
        torch.sub(weights, backup, out=step)  # the drift
        step.mul_(grad)
        if not self.adaptive:  # lam * g * (g * drift), one pass
            return torch.addcmul(_ZERO, step, grad, value=self.lam, out=step)
        torch.add(mean_square, self.eps, out=work).sqrt_()
        step.mul_(grad)  # lam * (g * g * drift) / sqrt(MS + eps), one pass
        return torch.addcdiv(_ZERO, step, work, value=self.lam, out=step)

    @staticmethod
    def joined(term, grad, state) -> torch.Tensor:
        """The compensated step from :meth:`term`'s result: ``term + g`` in place, or ``g`` copied into
        the scratch tensor where ``term`` is None."""
        return state.scratch.take(grad, 1)[0].copy_(grad) if term is None else term.add_(grad)

    def apply_(self, weights, grad, state, *, lr, staleness=0, worker=0, momentum=0.0,
               weight_decay=0.0):
        step = self.compensated(weights, grad, state, worker)
        return self._sgd.apply_(weights, step, state.sgd, lr=lr, momentum=momentum,
                                weight_decay=weight_decay)


@dataclasses.dataclass
class DCState:
    """:class:`DCRule`'s state.

    Attributes:
        backup: worker -> the weights it last received, ``w_bak`` (the caller's: a dict, or a server's
            outbox slots).
        mean_square: ``MS`` of DC-ASGD-a (None without ``adaptive``).
        scratch, scratch_diff: reused temporaries (the step's, and a caller's for a difference).
        sgd: the SGD state of :meth:`DCRule.apply_` (its momentum buffer).
    """

    SAVED: ClassVar[Tuple[str, ...]] = ("mean_square",)  # what a checkpoint holds (the rest is rebuilt)

    backup: Any = dataclasses.field(default_factory=dict)
    mean_square: Optional[torch.Tensor] = None
    scratch: Scratch = dataclasses.field(default_factory=Scratch)
    scratch_diff: Scratch = dataclasses.field(default_factory=Scratch)
    sgd: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def saved(self) -> Dict[str, Any]:
        """The fields a checkpoint holds, by name."""
        return {name: getattr(self, name) for name in self.SAVED}

    def load(self, saved: Dict[str, Any]) -> None:
        """Put back what :meth:`saved` returned."""
        for name in self.SAVED:
            setattr(self, name, saved[name])

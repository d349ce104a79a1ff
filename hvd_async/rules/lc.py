"""Loss-prediction compensation (LC-ASGD, Li, He, Ren, Mao, ICPP 2020): a stale gradient rescaled by the loss the server predicts for its worker.

The paper's abstract gives the idea (predict each worker's loss from the losses it reported, and use
the prediction to compensate the delayed gradient, optionally on top of DC-ASGD); its exact
predictor and formula are not available to us. The design implemented here:

A push from worker ``m`` carries a gradient ``g`` computed at the weights ``w_bak`` it last pulled
(global version ``v_bak = v_now - tau``) and its mini-batch loss ``L`` there. The server applies it
at version ``v_now``, to weights ``w`` that other workers have moved meanwhile.

* Direction. DC-ASGD's first-order Taylor step from ``w_bak`` to ``w``, with ``g * g`` for the
  Hessian's diagonal, gives ``g + lam * g * g * (w - w_bak)``. It is a local correction: its error
  grows with ``w - w_bak``, hence with the delay.
* Magnitude. Near a minimum ``w*`` take the loss locally quadratic,
  ``L(w) - L* = 1/2 (w - w*)^T H (w - w*)``, so ``grad L(w) = H (w - w*)``. For an isotropic
  ``H = h I``, ``||grad L(w)||^2 = h^2 ||w - w*||^2 = 2 h (L(w) - L*)``: the gradient's norm goes as
  ``sqrt(L - L*)``. The gradient worker ``m`` would compute at ``v_now`` is therefore about ``r``
  times the one it sent, with ``r = sqrt((Lhat(v_now) - floor) / (Lhat(v_bak) - floor))``, where
  ``Lhat(v)`` is ``m``'s loss at version ``v`` as predicted from ``m``'s own reports
  (:mod:`hvd_async.rules.loss_prediction`) and ``floor`` stands for ``L*`` (0 for cross-entropy).
  The prediction does not decay with the delay the way the Taylor term's accuracy does: it follows
  the loss curve, which is what lets the compensation reach further.
* ``r`` is clipped to ``[r_min, r_max]`` (0.25 and 1 by default: a stale gradient is damped, never
  amplified, unless ``r_max > 1``), and is 1 while ``m``'s predictor holds fewer than
  ``min_history`` reports, or when ``L`` is missing, not finite or not above ``floor``.

Compensated gradient: ``g_lc = r * (g + lam_t * g * g * (w - w_bak))`` (``lam_t`` constant or
DC-ASGD-a's adaptive one), then an :class:`SGDRule` step (weight decay and momentum applied to
``g_lc`` as :class:`DCRule` does; ``r`` does not scale the weight decay). ``loss_term=False`` makes
``r = 1``: exactly DC-ASGD (:meth:`DCRule.compensated` is reused, not re-implemented); with
``lam=0`` as well it is plain ASGD.

Order of calls for one push: ``observe(state, m, v_bak, L)`` first (the push's own report joins
``m``'s history, so the fit includes it), then ``apply_(..., worker=m, loss=L, version_now=v_now)``.
``apply_`` does not observe by itself. ``v_bak`` is the version the gradient stands for: the
pulled one, or, when the worker computed at DANA's look-ahead point, the later version that point
anticipates (:meth:`hvd_async.algorithms.dcasgd.DCProgram.computed_at`). Both ends of the ratio are the predictor's (``v_bak`` is
passed as ``version_pulled``): dividing by the pushed mini-batch loss ``L`` instead, as an earlier
version did, made ``r`` carry one batch's noise, below 1 on average even at zero delay (a random
rate cut); now ``r`` is exactly 1 at zero delay and departs from 1 as the delay grows.
"""
import dataclasses
import math
import time
from typing import Any, ClassVar, Dict, Optional, Tuple

import torch

from ..checks import is_finite_number
from .base import Rule
from .dc import DCRule, DCState
from .loss_prediction import PREDICTORS, LossPredictor, make_predictor
from .sgd import SGDRule


class LCRule(Rule):
    """The LC-ASGD server step: DC-ASGD's compensated gradient scaled by the predicted-loss ratio.

    Args:
        lam, adaptive, ms_momentum: :class:`DCRule`'s (``lam=0`` turns the DC term off).
        loss_term: scale by ``r`` (``False``: exactly :class:`DCRule`).
        predictor: a name in :data:`~hvd_async.rules.loss_prediction.PREDICTORS` (``"linear"``,
            ``"mlp"``).
        predictor_options: that predictor's options (``window``, ``decay``, ``max_horizon``, ...),
            checked here; ``floor`` and ``min_history`` are this rule's own.
        floor: the loss's lower bound ``L*``.
        r_min, r_max: the clip of ``r`` (``0 < r_min <= 1 <= r_max``).
        min_history: reports a worker's predictor needs before ``r`` departs from 1 (``>= 2``).

    State counters (``init``'s dict): ``predictor_seconds`` and ``predictor_calls`` (time spent in
    the predictors' ``observe`` and ``predict``, for "server time per push"), ``scale_sum`` and
    ``scale_calls`` (mean ``r``).

    Example::

        >>> rule = LCRule(lam=0.0, min_history=2)
        >>> w = torch.tensor([1.0]); state = rule.init(w)
        >>> rule.observe(state, 0, 0, 4.0); rule.observe(state, 0, 1, 2.0)
        >>> round(rule.scale(state, 0, 2.0, 2), 6)   # predicted 1.0 at version 2: r = sqrt(1 / 2)
        0.707107

    Tuning: lower ``r_min`` lets the rule damp long delays harder; ``r_max > 1`` also lets it
    amplify gradients whose worker's loss is predicted to rise (off by default: a noisy rise would
    amplify noise).
    """

    name = "lc"

    def __init__(self, lam: float, *, adaptive: bool = False, ms_momentum: float = 0.95,
                 loss_term: bool = True, predictor: str = "linear",
                 predictor_options: Optional[Dict[str, Any]] = None, floor: float = 0.0,
                 r_min: float = 0.25, r_max: float = 1.0, min_history: int = 4):
        self._dc = DCRule(lam, adaptive=adaptive, ms_momentum=ms_momentum)
        if not isinstance(loss_term, bool):
            raise ValueError(f"loss_term must be True or False, got {loss_term!r}")
        if predictor not in PREDICTORS:
            raise ValueError(f"predictor must be one of: {', '.join(PREDICTORS)}; got {predictor!r}")
        if predictor_options is None:
            predictor_options = {}
        if not isinstance(predictor_options, dict):
            raise ValueError(f"predictor_options must be a dict of options, got {predictor_options!r}")
        for own in ("floor", "min_history"):
            if own in predictor_options:
                raise ValueError(f"predictor_options must not set {own!r} (got {predictor_options[own]!r}); "
                                 f"pass {own}= to LCRule itself")
        for key, value in (("r_min", r_min), ("r_max", r_max), ("floor", floor)):
            if not is_finite_number(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
        if not 0 < r_min <= 1:
            raise ValueError(f"r_min must be in (0, 1], got {r_min!r}")
        if not r_max >= 1:
            raise ValueError(f"r_max must be >= 1 (r = 1 is the uncompensated step), got {r_max!r}")
        self.loss_term, self.predictor = loss_term, predictor
        self.predictor_options = dict(predictor_options)
        self.floor, self.r_min, self.r_max = float(floor), float(r_min), float(r_max)
        self.min_history = min_history
        self.new_predictor()  # checks min_history and the options now, not at the first push
        self._sgd = SGDRule()

    @property
    def lam(self) -> float:
        return self._dc.lam

    @property
    def compensation(self) -> DCRule:
        """The DC rule whose term this rule adds (its ``lam``, ``adaptive``, ``ms_momentum``, ``eps``)."""
        return self._dc

    def new_predictor(self) -> LossPredictor:
        """A fresh predictor with this rule's options (one per worker)."""
        return make_predictor(self.predictor, floor=self.floor, min_history=self.min_history,
                              **self.predictor_options)

    def init(self, weights: torch.Tensor) -> "LCState":
        return LCState(mean_square=self._dc.init(weights).mean_square)

    def observe(self, state, worker: int, version: int, loss: float) -> None:
        """Add worker ``worker``'s loss report for version ``version`` to its history (no-op without
        ``loss_term``)."""
        if not self.loss_term:
            return
        predictors = state.predictors
        if worker not in predictors:
            predictors[worker] = self.new_predictor()
        start = time.perf_counter()
        predictors[worker].observe(version, loss)
        state.predictor_seconds += time.perf_counter() - start
        state.predictor_calls += 1

    def scale(self, state, worker: int, loss: Optional[float], version_now: int,
              version_pulled: Optional[int] = None) -> float:
        """``r = clip(sqrt((Lhat(version_now) - floor) / (Lhat(version_pulled) - floor)), r_min, r_max)``:
        the predictor's own values at both ends, so that ``r`` is exactly 1 at zero delay (dividing
        by the pushed mini-batch ``loss`` instead, as before, made ``r`` a random rate cut there).
        ``version_pulled`` None (the old call) uses ``loss`` as the denominator. 1.0 without
        ``loss_term``, before ``min_history`` reports, or for a missing or invalid ``loss``."""
        r = 1.0
        predictor = state.predictors.get(worker)
        if (self.loss_term and predictor is not None and predictor.ready and loss is not None
                and math.isfinite(loss) and loss > self.floor):
            start = time.perf_counter()
            predicted = predictor.predict(version_now)
            then = loss if version_pulled is None else predictor.predict(version_pulled)
            state.predictor_seconds += time.perf_counter() - start
            state.predictor_calls += 1
            if then > self.floor and math.isfinite(then) and math.isfinite(predicted):
                r = math.sqrt(max(0.0, predicted - self.floor) / (then - self.floor))
                r = min(max(r, self.r_min), self.r_max)
        state.scale_sum += r
        state.scale_calls += 1
        return r

    def term(self, weights, grad, state, worker: int) -> Optional[torch.Tensor]:
        """:meth:`DCRule.term` (every push compensated): the step is ``r * (g + term)``, ``r`` from
        :meth:`scale`; a server adds both parts into its momentum buffer without forming the step."""
        return self._dc.term(weights, grad, state, worker)

    def term_of(self, weights, grad, backup, mean_square, scratch) -> Optional[torch.Tensor]:
        """:meth:`DCRule.term_of`: the term on the tensors given (one slice of a shard)."""
        return self._dc.term_of(weights, grad, backup, mean_square, scratch)

    def compensated(self, weights, grad, state, worker: int, *, loss: Optional[float],
                    version_now: int, version_pulled: Optional[int] = None) -> torch.Tensor:
        """``r * (g + lam_t * g * g * (w - w_bak(worker)))`` as a new tensor."""
        r = self.scale(state, worker, loss, version_now, version_pulled)
        step = self._dc.compensated(weights, grad, state, worker)
        return step if r == 1.0 else step.mul_(r)

    def apply_(self, weights, grad, state, *, lr, staleness=0, worker=0, momentum=0.0,
               weight_decay=0.0, loss=None, version_now=0, version_pulled=None):
        step = self.compensated(weights, grad, state, worker, loss=loss, version_now=version_now,
                                version_pulled=version_pulled)
        return self._sgd.apply_(weights, step, state.sgd, lr=lr, momentum=momentum,
                                weight_decay=weight_decay)


@dataclasses.dataclass
class LCState(DCState):
    """:class:`LCRule`'s state: :class:`DCState`'s, each worker's loss predictor (saved apart, by its
    own ``state_dict``) and the running costs and scales the stats report."""

    SAVED: ClassVar[Tuple[str, ...]] = DCState.SAVED + ("predictor_seconds", "predictor_calls", "scale_sum",
                                                        "scale_calls")

    predictors: Dict[int, LossPredictor] = dataclasses.field(default_factory=dict)
    predictor_seconds: float = 0.0
    predictor_calls: int = 0
    scale_sum: float = 0.0
    scale_calls: int = 0

"""lc-asgd: dc-asgd's step scaled by the loss the servers predict for the pushing worker."""
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..options import option
from ..rules import LCRule
from ..rules.loss_prediction import PREDICTORS
from .compensation import Compensation, PushClipOption, ServerKernelOption, change_sq
from .dcasgd import DCASGD, DCASGDAlgorithm, DCPayload, DCProgram
from .groups import Compression, InboxSlots, LookaheadOption, OptionGroup, PushRate, ServerMomentum


@dataclass
class LossPredictionOptions(OptionGroup):
    """lc-asgd's own options: the loss term and its predictor (checked by LCASGDOptions with the rule)."""

    loss_term: bool = option(True, "switch the loss-prediction term off (then it is dc-asgd)",
                             flag="--no-loss-term", action="store_false")
    predictor: str = option("linear", "the servers' per-worker loss predictor (a weighted log-linear fit, or "
                            "a tiny network trained online)", flag="--predictor", choices=tuple(PREDICTORS))
    predictor_options: Optional[Dict] = option(None, "the predictor's own options (window, decay, max_horizon, ...)")
    floor: float = option(0.0, "the loss's lower bound")
    r_min: float = option(0.25, "smallest scale of a stale gradient (its scale r is clipped to "
                          "[r-min, r-max])", flag="--r-min")
    r_max: float = option(1.0, "largest scale of a stale gradient", flag="--r-max")
    min_history: int = option(4, "loss reports needed before r departs from 1")


@dataclass
class LCASGDOptions(ServerKernelOption, ServerMomentum, PushClipOption, LookaheadOption, PushRate, InboxSlots, Compression,
                    LossPredictionOptions, Compensation):
    """lc-asgd's options: dc-asgd's compensation, the loss prediction, compression, push rate,
    look-ahead, push clip, the servers' momentum and kernel."""

    def __post_init__(self):
        super().__post_init__()
        if self.predictor in PREDICTORS and isinstance(self.predictor_options, dict):
            accepted = _predictor_keywords(self.predictor)
            unknown = sorted(set(self.predictor_options) - set(accepted) - {"floor", "min_history"})
            if unknown:
                raise ValueError(f"predictor_options {', '.join(map(repr, unknown))} unknown to the "
                                 f"{self.predictor!r} predictor; accepted: {', '.join(accepted)}")
        LCRule(**self.rule_options())  # validates

    def rule_options(self) -> Dict:
        """The keywords of :class:`~hvd_async.rules.LCRule`: the compensation's and the loss prediction's."""
        return {field.name: getattr(self, field.name)
                for group in (Compensation, LossPredictionOptions) for field in dataclasses.fields(group)}



def _predictor_keywords(name: str) -> List[str]:
    """The keyword options of loss predictor ``name`` that predictor_options may set."""
    found = set()
    for cls in PREDICTORS[name].__mro__:
        if "__init__" in vars(cls):
            found |= {p.name for p in inspect.signature(vars(cls)["__init__"]).parameters.values()
                      if p.kind is p.KEYWORD_ONLY}
    return sorted(found - {"floor", "min_history"})



class LCASGD(DCASGD):
    """lc-asgd: dc-asgd's step scaled by ``r``, from the loss the server predicts for the pushing
    worker at the version its gradient is applied to (rules/lc.py has the derivation).

    Every push carries the worker's mini-batch loss: call ``opt.step(loss=loss)`` (or
    ``opt.step(closure)``); the servers keep each worker's loss history and predictor.

    Options: dc-asgd's ``lam`` (0: no DC term), ``adaptive``, ``ms_momentum``, with dc-asgd's
    defaults (lam 2, adaptive: a small constant lam leaves the term negligible);
    ``loss_term`` (False: exactly dc-asgd), ``predictor`` (``"linear"``: a weighted fit of log-loss against
    version; ``"mlp"``: a tiny network trained online), ``predictor_options``, ``floor`` (the loss's
    lower bound, 0), ``r_min``/``r_max`` (clip of ``r``, 0.25 and 1), ``min_history`` (4);
    dc-asgd's ``lookahead`` (True) and ``server_momentum`` ('per-worker').
    """

    def _exchange(self, grad, loss) -> None:
        if loss is None and self.options.loss_term:
            raise ValueError("lc-asgd sends the mini-batch loss with every push: call "
                             "opt.step(loss=loss) (or opt.step(closure))")
        super()._exchange(grad, loss)

    def payload(self, grad, loss) -> "LCPayload":
        """Adds the mini-batch loss (0 where none was given)."""
        return LCPayload(**dataclasses.asdict(super().payload(grad, loss)), loss=0.0 if loss is None else float(loss))



class LCASGDAlgorithm(DCASGDAlgorithm):
    """lc-asgd's declaration: dc-asgd's, with its own options and program."""

    Options = LCASGDOptions
    strategy = LCASGD

    @classmethod
    def server_program(cls, host):
        return LCProgram(host, cls.server_spec(host))


@dataclass(frozen=True)
class LCPayload(DCPayload):
    """lc-asgd's push: dc-asgd's, and the worker's mini-batch loss."""

    loss: float = 0.0


class LCProgram(DCProgram):
    """dc-asgd's program with the step scaled by the worker's predicted loss (rules/lc.py)."""

    Payload = LCPayload

    def __init__(self, host, options: LCASGDOptions):
        super().__init__(host, options, rule=LCRule(**options.rule_options()), compensate="always")

    def state_dict(self) -> Dict:
        state = super().state_dict()
        state["predictors"] = {int(m): p.state_dict() for m, p in self.state.predictors.items()}  # each its own
        return state

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self.state.predictors = {}
        for worker, saved in state["predictors"].items():
            predictor = self.state.predictors[int(worker)] = self.rule.new_predictor()
            predictor.load_state_dict(saved)

    def observed(self, worker, payload) -> Tuple[float, int]:
        """The push's loss and the version its gradient stands for, after the loss joined the worker's
        history (the loss where the gradient was computed)."""
        loss, version = payload.loss, self.computed_at(worker, payload)
        self.rule.observe(self.state, worker, version, loss)
        return loss, version

    def compensated(self, worker, grad, payload) -> torch.Tensor:
        loss, version = self.observed(worker, payload)
        return self.rule.compensated(self.host.weights, grad, self.state, worker, loss=loss,
                                     version_now=self.host.version, version_pulled=version)

    def plan(self, worker, payload) -> Tuple[bool, float]:
        """Every push compensated, and ``r`` from the predicted losses (the push's loss observed first)."""
        loss, version = self.observed(worker, payload)
        return True, self.rule.scale(self.state, worker, loss, self.host.version, version)

    def change_sq(self, term, grad, r: float, scratch) -> float:
        """The slice's part of ``||r * (grad + term) - grad||^2`` (the loss ratio scales the gradient
        too), through ``scratch``'s third tensor (taken at the first push: the memory does not grow once
        ``r`` departs from 1)."""
        return change_sq(term, grad, r, scratch.take(grad, 3)[2])

"""lc-asgd: dc-asgd's step scaled by the loss the servers predict for the pushing worker."""
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..horovod_options import compression_name
from ..options import option
from ..rules import LCRule
from ..rules.loss_prediction import PREDICTORS
from .compensation import (ADAPTIVE_DEFAULT, ADAPTIVE_HELP, LAM_DEFAULT, LAM_HELP, MS_MOMENTUM_DEFAULT,
                           MS_MOMENTUM_HELP, PUSH_CLIP_HELP, check_compensation_numbers, check_push_clip, distance_sq)
from .dcasgd import DCASGD, DCPayload, DCProgram
from .ps import LOOKAHEAD_HELP, PUSH_RATE_HELP, PUSH_RATES, check_lookahead, check_push_rate


@dataclass
class LCASGDOptions:
    lam: float = option(LAM_DEFAULT, LAM_HELP, flag="--lam")
    adaptive: bool = option(ADAPTIVE_DEFAULT, ADAPTIVE_HELP, flag="--dc-adaptive", action="boolean")
    ms_momentum: float = option(MS_MOMENTUM_DEFAULT, MS_MOMENTUM_HELP, flag="--ms-momentum")
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
    compression: Any = option("none", "'fp16': gradients and weights cross the network in half precision (the "
                              "servers keep fp32 weights and arithmetic)")
    push_rate: str = option("average", PUSH_RATE_HELP, flag="--push-rate", choices=PUSH_RATES)
    lookahead: bool = option(True, LOOKAHEAD_HELP, flag="--lookahead", action="boolean")
    push_clip: float = option(1.5, PUSH_CLIP_HELP, flag="--push-clip")

    def __post_init__(self):
        self.compression = compression_name(self.compression)
        check_push_rate(self.push_rate)
        check_lookahead(self.lookahead)
        check_push_clip(self.push_clip)
        check_compensation_numbers(self.lam, self.ms_momentum)
        if self.predictor in PREDICTORS and isinstance(self.predictor_options, dict):
            accepted = _predictor_keywords(self.predictor)
            unknown = sorted(set(self.predictor_options) - set(accepted) - {"floor", "min_history"})
            if unknown:
                raise ValueError(f"predictor_options {', '.join(map(repr, unknown))} unknown to the "
                                 f"{self.predictor!r} predictor; accepted: {', '.join(accepted)}")
        LCRule(**self.rule_options())  # validates

    def rule_options(self) -> Dict:
        return {k: v for k, v in vars(self).items() if k not in ("compression", "push_rate", "lookahead", "push_clip")}



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
    dc-asgd's ``lookahead`` (True).
    """

    name = "lc-asgd"
    Options = LCASGDOptions

    def _exchange(self, grad, loss) -> None:
        if loss is None and self.options.loss_term:
            raise ValueError("lc-asgd sends the mini-batch loss with every push: call "
                             "opt.step(loss=loss) (or opt.step(closure))")
        super()._exchange(grad, loss)

    def payload(self, grad, loss) -> "LCPayload":
        """Adds the mini-batch loss (0 where none was given)."""
        return LCPayload(**dataclasses.asdict(super().payload(grad, loss)), loss=0.0 if loss is None else float(loss))

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

    def compensated(self, worker, grad, payload) -> torch.Tensor:
        loss, version = payload.loss, self.computed_at(worker, payload)
        self.rule.observe(self.state, worker, version, loss)  # the loss where the gradient was computed
        return self.rule.compensated(self.host.weights, grad, self.state, worker, loss=loss,
                                     version_now=self.host.version, version_pulled=version)

    def compensated_and_size(self, worker, grad, payload) -> Tuple[torch.Tensor, float]:
        """The step, and its squared distance from the gradient: the loss ratio scales the gradient too."""
        step = self.compensated(worker, grad, payload)
        return step, distance_sq(self.state, step, grad)


"""What the update is: pure tensor math, unit-tested against hand-computed numbers."""
from .base import Rule, Scratch
from .dc import DCRule, DCState
from .lc import LCRule, LCState
from .sgd import SGDRule, mean_
from .staleness import RunningMean, staleness_scaled_mean_

__all__ = ["Rule", "Scratch", "DCRule", "LCRule", "SGDRule", "mean_", "RunningMean", "staleness_scaled_mean_"]

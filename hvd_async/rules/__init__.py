"""What the update is: pure tensor math, unit-tested against hand-computed numbers."""
from .base import BLOCK, Blocks, Rule, Scratch
from .dc import DCRule, DCState
from .lc import LCRule, LCState
from .sgd import SGDRule, mean_
from .staleness import RunningMean, fold_, staleness_scaled_mean_

__all__ = ["BLOCK", "Blocks", "Rule", "Scratch", "DCRule", "DCState", "LCRule", "LCState", "SGDRule", "mean_", "RunningMean", "fold_",
           "staleness_scaled_mean_"]

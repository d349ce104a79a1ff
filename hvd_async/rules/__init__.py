"""What the update is: pure tensor math, unit-tested against hand-computed numbers."""
from .base import Rule
from .sgd import SGDRule, mean_

__all__ = ["Rule", "SGDRule", "mean_"]

"""A rule is the update's pure math: tensors in, tensors out; no MPI, no Horovod, no ranks.

Modelled on optax's (init, update) pair: ``init(weights)`` builds the rule's own state (e.g. the
per-worker backups of DC-ASGD), ``apply_(weights, grad, state, ...)`` changes ``weights`` in place.
Strategies call rules; the same rule object runs on a server rank, in a worker, or in the simulator.
"""
import abc
from typing import Any, Dict, List

import torch


class Rule(abc.ABC):
    """The update applied to a flat fp32 weight buffer when a gradient arrives."""

    name: str = "rule"

    def init(self, weights: torch.Tensor) -> Dict[str, Any]:
        """The rule's state for these weights (empty by default)."""
        return {}

    @abc.abstractmethod
    def apply_(self, weights: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], *,
               lr: float, staleness: int = 0, worker: int = 0) -> torch.Tensor:
        """Update ``weights`` in place with ``grad``; returns ``weights``."""


class Scratch:
    """Temporaries shaped as a given tensor, made at the first :meth:`take` (or again when its shape or
    dtype changes) and reused push after push: a server allocates nothing per push."""

    def __init__(self):
        self.held: List[torch.Tensor] = []

    def take(self, like: torch.Tensor, count: int) -> List[torch.Tensor]:
        """``count`` tensors shaped as ``like`` (their contents are the last user's)."""
        held = self.held
        if len(held) < count or held[0].shape != like.shape or held[0].dtype != like.dtype:
            held = self.held = [torch.empty_like(like) for _ in range(count)]
        return held[:count]

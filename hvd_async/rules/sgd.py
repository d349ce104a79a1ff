"""Plain SGD: w <- w - lr * g, the rule of ASGD's server and of every worker's local step."""
import torch

from .base import Rule


class SGDRule(Rule):
    """``w -= lr * g``; staleness and worker are ignored.

    Example::

        >>> w = torch.tensor([1.0, 2.0]); SGDRule().apply_(w, torch.tensor([0.5, -1.0]), {}, lr=0.1)
        tensor([0.9500, 2.1000])
    """

    name = "sgd"

    def apply_(self, weights, grad, state, *, lr, staleness=0, worker=0):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        return weights.add_(grad, alpha=-lr)


def mean_(grads, out: torch.Tensor) -> torch.Tensor:
    """``out <- mean(grads)`` summed in the given order (synchronous averaging, deterministic)."""
    out.zero_()
    for grad in grads:
        out.add_(grad)
    return out.div_(len(grads))

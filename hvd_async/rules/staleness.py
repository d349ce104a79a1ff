"""Staleness-scaled aggregation (n-softsync, Zhang, Gupta et al., IJCAI 2016).

The server averages the ``c`` gradients it collected, each divided by its staleness, so the rate a
gradient gets is ``lr / tau``: ``g_agg = mean_i g_i / max(1, tau_i)``. Staleness 0 (the gradient
was computed on the weights it is applied to) and 1 both keep the full rate; the ``max`` is our
choice, so that 1-softsync (every gradient fresh) is exactly synchronous averaging.
"""
from typing import Sequence, Tuple

import torch


def staleness_divisor(staleness: int) -> float:
    return float(max(1, int(staleness)))


def staleness_scaled_mean_(grads: Sequence[torch.Tensor], staleness: Sequence[int], out: torch.Tensor,
                           *, scale: bool = True) -> torch.Tensor:
    """``out <- mean_i g_i / max(1, tau_i)`` (or the plain mean when ``scale`` is False), summed in order.

    Example::

        >>> out = torch.zeros(1)
        >>> staleness_scaled_mean_([torch.tensor([4.0]), torch.tensor([4.0])], [0, 2], out)
        tensor([3.])
    """
    if len(grads) != len(staleness) or not grads:
        raise ValueError(f"need one staleness per gradient and at least one gradient, got "
                         f"{len(grads)} gradient(s) and {len(staleness)} staleness value(s)")
    out.zero_()
    for grad, tau in zip(grads, staleness):
        fold_(out, grad, term_factor(tau, scale))
    return out.div_(len(grads))


def term_factor(staleness: int, scale: bool = True) -> float:
    """What a gradient of this staleness is multiplied by in the mean's sum: ``1 / max(1, tau)``, or 1
    without ``scale``."""
    return 1.0 / staleness_divisor(staleness) if scale else 1.0


def fold_(out: torch.Tensor, grad: torch.Tensor, factor: float, first: bool = False) -> None:
    """``out += factor * grad`` (``out = factor * grad`` for the sum's ``first`` term: written, not
    added to zeros, one pass less and the same bits): one term of the mean. Elementwise: ``out`` and
    ``grad`` may be views of one slice of a shard."""
    if first:
        if factor == 1.0:
            out.copy_(grad)
        else:
            torch.mul(grad, factor, out=out)
    elif factor == 1.0:
        out.add_(grad)
    else:
        out.add_(grad, alpha=factor)


class RunningMean:
    """``staleness_scaled_mean_`` taken one gradient at a time, as the gradients land: ``add`` folds
    each into ``total`` (summed in arrival order, as the list form sums them, with the same result to
    the bit), ``mean_()`` divides by their count and the next ``add`` starts a new sum. A server that
    waits for several gradients keeps this one buffer instead of the gradients."""

    def __init__(self, like: torch.Tensor, *, scale: bool = True):
        self.total = torch.zeros_like(like)
        self.scale = scale
        self.count = 0

    def add(self, grad: torch.Tensor, staleness: int = 0) -> None:
        fold_(self.total, grad, *self.count_(staleness))

    def count_(self, staleness: int = 0) -> Tuple[float, bool]:
        """Count one more gradient without adding it: its factor and whether it is the sum's first, for
        a caller that folds it in slice by slice (``fold_(total[sl], grad[sl], factor, first)``)."""
        first = self.count == 0
        self.count += 1
        return term_factor(staleness, self.scale), first

    def sum_(self):
        """``(total, 1 / count)``: the sum of the gradients added since the last call and the factor that
        makes it their mean, for a caller that folds the factor into its own step (no pass of its own);
        the next ``add`` starts a new sum."""
        if not self.count:
            raise ValueError("no gradient was added since the last mean")
        count, self.count = self.count, 0
        return self.total, 1.0 / count

    def mean_(self) -> torch.Tensor:
        """The mean of the gradients added since the last call (``total``, divided in place)."""
        count = self.count
        total, _ = self.sum_()
        return total.div_(count)

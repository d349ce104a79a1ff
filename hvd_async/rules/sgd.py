"""Plain SGD: w <- w - lr * (g + wd * w), with optional heavy-ball momentum (torch.optim.SGD's form).

ASGD's workers run it inside the wrapped optimizer; the parameter servers of dc-asgd and softsync run
it on their shard, with the hyperparameters each push carries.
"""
import torch

from .base import Rule


class SGDRule(Rule):
    """``buf <- momentum * buf + (g + wd * w)``; ``w <- w - lr * buf`` (``buf = g + wd * w`` without
    momentum; with ``nesterov``: ``w <- w - lr * (g + wd * w + momentum * buf)``), as
    ``torch.optim.SGD`` with ``dampening=0``. Staleness and worker are ignored. Any rate the
    optimizer holds is applied as it is (a schedule may anneal it to 0; torch checks it).

    Example::

        >>> w = torch.tensor([1.0, 2.0]); SGDRule().apply_(w, torch.tensor([0.5, -1.0]), {}, lr=0.1)
        tensor([0.9500, 2.1000])
    """

    name = "sgd"

    def direction(self, weights, grad, state, *, momentum=0.0, weight_decay=0.0, nesterov=False):
        """The step's direction ``d`` (``w <- w - lr * d``), updating the momentum buffer in ``state``;
        a new tensor or ``grad`` itself (without momentum and weight decay)."""
        if weight_decay:
            grad = grad.add(weights, alpha=weight_decay)
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.clone()
            else:
                buf.mul_(momentum).add_(grad)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        return grad

    def apply_(self, weights, grad, state, *, lr, staleness=0, worker=0, momentum=0.0,
               weight_decay=0.0, nesterov=False):
        step = self.direction(weights, grad, state, momentum=momentum, weight_decay=weight_decay,
                              nesterov=nesterov)
        return weights.add_(step, alpha=-lr)


def mean_(grads, out: torch.Tensor) -> torch.Tensor:
    """``out <- mean(grads)`` summed in the given order (synchronous averaging, deterministic)."""
    out.zero_()
    for grad in grads:
        out.add_(grad)
    return out.div_(len(grads))

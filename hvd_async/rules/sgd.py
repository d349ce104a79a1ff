"""Plain SGD: w <- w - lr * (g + wd * w), with optional heavy-ball momentum (torch.optim.SGD's form).

ASGD's workers run it inside the wrapped optimizer; the parameter servers of dc-asgd and softsync run
it on their shard, with the hyperparameters each push carries.
"""
import torch

from .base import Rule, Scratch


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

    def direction_(self, weights, terms, state, *, momentum=0.0, weight_decay=0.0, nesterov=False,
                   total=None, out=None) -> torch.Tensor:
        """The step's direction ``d`` (``w <- w - lr * d``) for the gradient ``sum_i c_i * g_i``
        (``terms``: ``(g_i, c_i)`` pairs, None tensors skipped: a gradient and a compensation term,
        each scaled), fused: each term goes straight into the momentum buffer, no gradient is formed
        first, and no tensor is allocated (but the buffer at the first push).

        Returns the momentum buffer itself (momentum without Nesterov), else ``d`` formed in ``out``
        (a tensor like ``weights``; a lone gradient with coefficient 1 and no decay is returned as it
        is; ``out`` may be a :class:`Scratch`, taken from only then). ``total``: a tensor kept equal
        to a sum of momentum buffers this one belongs to (a server's look-ahead): it follows this
        buffer's change. ``terms`` must not hold ``out``."""
        terms = [(t, float(c)) for t, c in terms if t is not None]
        if weight_decay:
            terms.append((weights, weight_decay))
        if momentum and not nesterov:
            return self._buffer_(terms, state, momentum, total)
        if out is None:
            out = torch.empty_like(weights)
        elif isinstance(out, Scratch):
            out = out.take(weights, 1)[0]
        d = _combine(terms, out)
        if not momentum:
            return d
        buf = self._buffer_([(d, 1.0)], state, momentum, total)
        return torch.add(d, buf, alpha=momentum, out=out)  # Nesterov: d + momentum * buf

    @staticmethod
    def _buffer_(terms, state, momentum, total) -> torch.Tensor:
        """``buf <- momentum * buf + sum_i c_i * g_i`` in place (``buf = sum`` at the first push)."""
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = _combine(terms, torch.empty_like(terms[0][0]), copy=True)
        else:
            if total is not None:
                total.sub_(buf)
            (first, c), rest = terms[0], terms[1:]
            if c == 1.0:  # one pass for both: first + momentum * buf
                torch.add(first, buf, alpha=momentum, out=buf)
            else:
                buf.mul_(momentum).add_(first, alpha=c)
            for t, c in rest:
                buf.add_(t, alpha=c)
        if total is not None:
            total.add_(buf)
        return buf

    @staticmethod
    def ready_buffer_(state, like: torch.Tensor, momentum: float) -> None:
        """Make, as zeros, the momentum buffer a push with ``momentum`` steps through where ``state`` has
        none yet: a push applied slice by slice (:class:`~hvd_async.rules.Blocks`) then steps views of
        one buffer, and ``momentum * 0 + d`` is the ``d`` that the first push would have copied in."""
        if momentum and state.get("momentum_buffer") is None:
            state["momentum_buffer"] = torch.zeros_like(like)

    @staticmethod
    def sliced(state, sl: slice) -> dict:
        """``state`` with its momentum buffer (if any) as a view of slice ``sl``: what :meth:`step_` and
        :meth:`direction_` take for one slice of a shard (make the buffer first: :meth:`ready_buffer_`)."""
        buf = state.get("momentum_buffer")
        return {} if buf is None else {"momentum_buffer": buf[sl]}

    def step_(self, weights, terms, state, *, lr, momentum=0.0, weight_decay=0.0, nesterov=False,
              total=None, out=None) -> torch.Tensor:
        """``w <- w - lr * d`` with :meth:`direction_`'s ``d``: one server push's SGD in a few passes."""
        d = self.direction_(weights, terms, state, momentum=momentum, weight_decay=weight_decay,
                            nesterov=nesterov, total=total, out=out)
        return weights.add_(d, alpha=-lr)

    def apply_(self, weights, grad, state, *, lr, staleness=0, worker=0, momentum=0.0,
               weight_decay=0.0, nesterov=False):
        return self.step_(weights, [(grad, 1.0)], state, lr=lr, momentum=momentum,
                          weight_decay=weight_decay, nesterov=nesterov)


def _combine(terms, out: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``sum_i c_i * g_i`` into ``out`` (a lone term with coefficient 1 is returned as it is unless
    ``copy``), in as few passes as torch's fused add-with-alpha allows."""
    (first, c), rest = terms[0], terms[1:]
    if c == 1.0 and not rest and not copy:
        return first
    if c == 1.0 and rest:
        (second, c2), rest = rest[0], rest[1:]
        torch.add(first, second, alpha=c2, out=out)
    elif c == 1.0:
        out.copy_(first)
    else:
        torch.mul(first, c, out=out)
    for t, c in rest:
        out.add_(t, alpha=c)
    return out


def mean_(grads, out: torch.Tensor) -> torch.Tensor:
    """``out <- mean(grads)`` summed in the given order (synchronous averaging, deterministic)."""
    out.zero_()
    for grad in grads:
        out.add_(grad)
    return out.div_(len(grads))

"""DANA's look-ahead on the servers: the running sum of the workers' momentum buffers, and the
look-ahead weights a server program answers a push with (dc-asgd, lc-asgd, softsync)."""
from typing import Dict, Optional

import torch


class Lookahead:
    """DANA-Zero's look-ahead (Hakimi et al., 2019, "Taming momentum in a distributed asynchronous
    environment"), for server programs that keep a momentum buffer per worker, or one shared buffer.

    Every worker's next push adds ``lr * momentum * buf_k`` (its momentum term) to the global weights
    whatever its gradient, so by the time worker m's next gradient lands the weights have moved by
    about ``lr * momentum * sum_k buf_k``: the program answers m with that point,
    ``w - lr * momentum * sum_k buf_k``. The sum is kept as the buffers change (two adds a push).

    With one momentum buffer ``v`` shared by every push (``shared=True``) there is no sum to keep: each
    of the next pushes, this worker's own included, carries the weights by ``lr * momentum**j * v``
    (``j = 1 .. pushes``), and the program answers ``w - lr * sum_j momentum**j * v`` (:meth:`shared_step`).
    """

    def __init__(self, like: torch.Tensor, shared: bool = False):
        self.total: Optional[torch.Tensor] = None if shared else torch.zeros_like(like)
        self.wide: Optional[torch.Tensor] = None  # fp32 scratch for answers into fp16 slots (made at the first)

    @staticmethod
    def shared_step(lr: float, momentum: float, pushes: int) -> float:
        """``lr * (momentum + momentum**2 + ... + momentum**pushes)``: how far, in units of a shared
        buffer, its momentum carries the weights over the next ``pushes`` pushes."""
        return lr * sum(momentum ** j for j in range(1, pushes + 1))

    @staticmethod
    def applies(kwargs) -> bool:
        """Whether a push with these SGD settings (``step_kwargs``) is answered ahead: with momentum,
        and not with Nesterov's, whose step looks ahead already."""
        return bool(kwargs["momentum"]) and not kwargs["nesterov"]

    def remove(self, state: Dict) -> None:
        """Before a worker's buffer (its SGD state) changes."""
        buf = state.get("momentum_buffer")
        if buf is not None and self.total is not None:  # (a shared buffer has no sum to keep)
            self.total.sub_(buf)

    def add(self, state: Dict) -> None:
        """After it changed."""
        buf = state.get("momentum_buffer")
        if buf is not None and self.total is not None:
            self.total.add_(buf)

    def rebuild(self, states) -> None:
        """From every worker's buffer (after a checkpoint load)."""
        assert self.total is not None  # per-worker buffers only (a shared one has no sum)
        self.total.zero_()
        for state in states:
            self.add(state)

    def restore(self, total: Optional[torch.Tensor], states) -> None:
        """After a checkpoint load: the saved running sum, bit for bit (the sum kept push by push
        rounds otherwise than one summed afresh), or, from a checkpoint without it, :meth:`rebuild`."""
        if total is None:
            self.rebuild(states)
        else:
            assert self.total is not None  # (as in rebuild)
            self.total.copy_(total)

    def answer(self, out: torch.Tensor, weights: torch.Tensor, step: float, total=None, wide=None) -> None:
        """``out <- weights - step * sum_k buf_k`` in one pass (``step``: the rate per push times the
        momentum; ``out``: the worker's outbox slot, fp16 under compression). ``total``: the shared
        buffer, or a slice of the sum, in place of the sum (with ``step`` from :meth:`shared_step`).
        ``wide``: an fp32 tensor like ``weights`` for an fp16 ``out`` (default: one kept here)."""
        total = self.total if total is None else total
        if step and out.dtype != weights.dtype:  # an fp16 slot: torch would cast via a fresh temporary
            if wide is None:
                if self.wide is None:
                    self.wide = torch.empty_like(weights)
                wide = self.wide
            out.copy_(torch.add(weights, total, alpha=-step, out=wide))
        elif step:
            torch.add(weights, total, alpha=-step, out=out)
        else:
            out.copy_(weights)

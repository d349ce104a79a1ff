"""Gossip mixing math (pull averaging and push-sum), pure tensor functions with no MPI in them.

Pull (Jin, Yuan, Iandola, Keutzer, arXiv 1611.04581): ``w_i <- (w_i + w_j) / 2`` with ``w_j`` read
from a peer. Asymmetric (``j`` does not change), so the mean over workers is not kept exactly.

Push-sum (Kempe, Dobra, Gehrke, FOCS 2003; with SGD: Assran et al., "Stochastic Gradient Push",
ICML 2019): worker ``i`` holds a numerator ``x_i`` and a weight ``s_i`` (1 at the start); its model
is ``z_i = x_i / s_i``. To gossip it halves both and adds one half into a peer's
(``x_j += x_i / 2``, ``s_j += s_i / 2``). No mass is created or lost, so ``sum_i x_i`` and
``sum_i s_i = N`` are invariant under mixing, and every ``z_i`` tends to ``sum x / sum s``, the mean
of the models. A local optimizer change ``dz`` enters as ``x_i += s_i * dz`` (so ``z_i`` moves by
exactly ``dz``).
"""
import torch


def pull_average_(w: torch.Tensor, peer: torch.Tensor) -> torch.Tensor:
    """``w <- (w + peer) / 2`` in place.

    Example::

        >>> pull_average_(torch.tensor([1.0, 4.0]), torch.tensor([3.0, 0.0]))
        tensor([2., 2.])
    """
    return w.add_(peer).mul_(0.5)


def push_sum_fold_(x: torch.Tensor, s: float, change: torch.Tensor) -> torch.Tensor:
    """A local change ``dz`` of the model ``z = x / s`` into the numerator: ``x <- x + s * dz``."""
    return x.add_(change, alpha=float(s))


def push_sum_split_(x: torch.Tensor, s: float, send: torch.Tensor) -> float:
    """Halve the numerator in place and copy the half to send into ``send``; returns the halved weight
    (kept, and sent alongside ``send``). Halving is exact in binary floating point."""
    x.mul_(0.5)
    send.copy_(x)
    return 0.5 * float(s)


def push_sum_receive_(x: torch.Tensor, s: float, x_in: torch.Tensor, s_in: float) -> float:
    """What a push does at its target (there, ``MPI_Accumulate``): ``x += x_in``; returns ``s + s_in``."""
    x.add_(x_in)
    return float(s) + float(s_in)


def push_sum_estimate_(x: torch.Tensor, s: float, out: torch.Tensor) -> torch.Tensor:
    """The model ``out <- x / s``.

    Example::

        >>> push_sum_estimate_(torch.tensor([1.0, 3.0]), 0.5, torch.empty(2))
        tensor([2., 6.])
    """
    if not s > 0:
        raise ValueError(f"push-sum weight must be > 0, got {s}")
    return torch.div(x, float(s), out=out)

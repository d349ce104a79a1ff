"""Elastic averaging (EASGD, Zhang, Choromanska, LeCun, NIPS 2015): the move between a worker and the centre.

Every ``tau`` steps worker ``i`` computes ``d = alpha * (w_i - c)`` against the centre ``c`` it read,
then ``w_i <- w_i - d`` and ``c <- c + d``: the worker is pulled towards the centre and the centre
towards the worker by the same amount, so ``w_i + c`` is unchanged by a move. The synchronous form
applies every worker's move against one centre: ``c <- c + sum_i d_i``.

Rate: ``alpha = lr * rho`` (the paper's moving rate, ``rho`` the elastic coefficient); the paper
suggests ``beta = N * alpha = 0.9`` for N workers, our default ``alpha = 0.9 / N``. Stable for
``0 < alpha < 1`` (the synchronous form also needs ``N * alpha`` below 2 for the centre).
"""
from typing import List, Optional, Sequence, Tuple

import torch

from ..checks import is_finite_number

BETA = 0.9  # the paper's suggested N * alpha


def default_alpha(workers: int) -> float:
    """``0.9 / workers``: the paper's ``beta = N * alpha = 0.9``."""
    return BETA / max(1, int(workers))


def resolve_alpha(alpha: Optional[float], rho: Optional[float], lr: float, workers: int) -> float:
    """The moving rate: ``alpha`` if given, ``lr * rho`` if ``rho`` is, else ``0.9 / workers``;
    ``ValueError`` unless it lies strictly between 0 and 1."""
    if alpha is not None and rho is not None:
        raise ValueError(f"give alpha or rho, not both (alpha={alpha!r}, rho={rho!r}); alpha = lr * rho")
    if alpha is None:
        alpha = default_alpha(workers) if rho is None else float(lr) * float(rho)
        source = "0.9 / workers" if rho is None else f"lr * rho = {lr} * {rho}"
    else:
        source = "alpha"
    if not (is_finite_number(alpha) and 0 < alpha < 1):
        raise ValueError(f"the elastic moving rate must be in (0, 1), got {alpha!r} (from {source}); "
                         f"lower rho or give alpha directly, e.g. alpha={default_alpha(workers):.3g}")
    return float(alpha)


def elastic_move(w: torch.Tensor, centre: torch.Tensor, alpha: float,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``d = alpha * (w - centre)`` (into ``out`` when given); the caller applies ``w -= d``, ``c += d``.

    Example::

        >>> elastic_move(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), 0.5)
        tensor([ 0.5000, -1.0000])
    """
    out = torch.sub(w, centre, out=out) if out is not None else w - centre
    return out.mul_(alpha)


def sync_round(workers: Sequence[torch.Tensor], centre: torch.Tensor,
               alpha: float) -> Tuple[List[torch.Tensor], torch.Tensor]:
    """One synchronous round: every worker moves against the same centre; the centre gets every move.

    Returns the new workers' weights and centre (inputs unchanged)."""
    moves = [elastic_move(w, centre, alpha) for w in workers]
    new_centre = centre.clone()
    for d in moves:
        new_centre.add_(d)
    return [w - d for w, d in zip(workers, moves)], new_centre

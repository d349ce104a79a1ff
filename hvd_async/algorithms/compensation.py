"""What dc-asgd and lc-asgd share: the compensation's option groups (declared once: defaults, flags,
checks), the servers' push clip, and the size of a compensated step's change (the workers' stats)."""
from dataclasses import dataclass
from typing import Optional

import torch

from ..checks import is_finite_number
from ..options import option
from ..rules.dc import check_compensation
from ..rules.fused import COMPILE_MIN, KERNELS
from .groups import OptionGroup, check_choice

PUSH_CLIP_HELP = ("the servers scale a push down when its gradient's norm (the whole gradient's, every shard "
                  "alike) exceeds this factor times the running mean of the pushes' gradient norms (decay 0.9), "
                  "to that bound: a push out of line with the others cannot throw the weights off (0: never)")


@dataclass
class Compensation(OptionGroup):
    """The delay compensation's strength: a constant ``lam``, or DC-ASGD-a's adaptive ``lam0`` (the
    paper's lam0 = 2; a small constant leaves the term negligible beside the gradient)."""

    lam: float = option(2.0, "delay-compensation strength (0: none); lam0 with --dc-adaptive", flag="--lam")
    adaptive: bool = option(True, "adaptive lam / sqrt(mean square of gradients) (DC-ASGD-a)",
                            flag="--dc-adaptive", action="boolean")
    ms_momentum: float = option(0.95, "decay of the mean square of gradients that --dc-adaptive divides by, "
                                "in [0, 1)", flag="--ms-momentum")

    def __post_init__(self):
        super().__post_init__()
        check_compensation(self.lam, self.adaptive, self.ms_momentum)


SERVER_KERNEL_HELP = ("how the servers apply a push: 'compiled' (one loop over the shard, compiled by torch.compile "
                      "before the first push, seconds once a process), 'eager' (a chain of torch operations, slice "
                      f"by slice) or 'auto' (compiled for shards of 2**{COMPILE_MIN.bit_length() - 1} elements or more)")


@dataclass
class ServerKernelOption(OptionGroup):
    """How the servers run a push (:mod:`hvd_async.rules.fused`)."""

    server_kernel: str = option("auto", SERVER_KERNEL_HELP, flag="--server-kernel", choices=KERNELS)

    def __post_init__(self):
        super().__post_init__()
        check_choice("server_kernel", self.server_kernel, KERNELS,
                     "'auto', 'compiled' (one compiled loop a push) or 'eager' (torch operations)")


@dataclass
class PushClipOption(OptionGroup):
    """The servers' clip of a push far out of line with the others (:class:`PushClip`)."""

    push_clip: float = option(1.5, PUSH_CLIP_HELP, flag="--push-clip")

    def __post_init__(self):
        super().__post_init__()
        if not (is_finite_number(self.push_clip) and (self.push_clip == 0 or self.push_clip >= 1)):
            raise ValueError(f"push_clip must be 0 (never clip) or a factor >= 1 of the running mean gradient "
                             f"norm, got {self.push_clip!r}")


class PushClip:
    """Scales down a push whose gradient norm exceeds ``factor`` times the running mean of the pushes'
    gradient norms, to that bound. The norm is the whole gradient's (the worker sends it with the push),
    so every shard keeps the same mean and scales its slice by the same factor: the applied step stays
    parallel to the gradient with any number of servers. The mean decays by 0.9 a push and takes each norm
    as kept (clipped), so one push far out of line moves the bound little."""

    DECAY = 0.9

    def __init__(self, factor: float):
        self.factor = float(factor)
        self.mean: Optional[float] = None

    def scale(self, norm: float) -> float:
        """The factor this push's step is multiplied by (1.0: kept as it is); updates the mean."""
        if self.mean is None:  # the first push: no bound yet, its norm kept as it is
            self.mean = norm
            return 1.0
        bound = self.factor * self.mean
        clipped = norm > bound
        kept = bound if clipped else norm
        self.mean = self.DECAY * self.mean + (1.0 - self.DECAY) * kept
        return bound / norm if clipped else 1.0


def change_sq(term, grad: torch.Tensor, r: float, diff: torch.Tensor) -> float:
    """``||r * (grad + term) - grad||^2``, what a step scaled by ``r`` adds to the gradient (``term``
    None: none), through ``diff`` (a scratch tensor like ``grad``) where ``r`` is not 1. Elementwise but
    for the norm: on one slice of a shard it gives that slice's part of the sum."""
    if r == 1.0:
        return 0.0 if term is None else float(term.norm()) ** 2
    torch.mul(grad, r - 1.0, out=diff)
    if term is not None:
        diff.add_(term, alpha=r)
    return float(diff.norm()) ** 2

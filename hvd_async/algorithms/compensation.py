"""What dc-asgd and lc-asgd share: the compensation options' help, defaults and checks, the servers'
push clip, and the size of a compensated step's change (the workers' stats)."""
import torch

from ..checks import is_finite_number

LAM_HELP = "delay-compensation strength (0: none); lam0 with --dc-adaptive"
ADAPTIVE_HELP = "adaptive lam / sqrt(mean square of gradients) (DC-ASGD-a)"
# dc-asgd's compensation defaults; lc-asgd's too (its docstring)
LAM_DEFAULT, ADAPTIVE_DEFAULT, MS_MOMENTUM_DEFAULT = 2.0, True, 0.95
MS_MOMENTUM_HELP = "decay of the mean square of gradients that --dc-adaptive divides by, in [0, 1)"
PUSH_CLIP_HELP = ("the servers scale a push down when its gradient's norm (the whole gradient's, every shard "
                  "alike) exceeds this factor times the running mean of the pushes' gradient norms (decay 0.9), "
                  "to that bound: a push out of line with the others cannot throw the weights off (0: never)")


def check_push_clip(value) -> None:
    if not (is_finite_number(value) and (value == 0 or value >= 1)):
        raise ValueError(f"push_clip must be 0 (never clip) or a factor >= 1 of the running mean gradient "
                         f"norm, got {value!r}")


class PushClip:
    """Scales down a push whose gradient norm exceeds ``factor`` times the running mean of the pushes'
    gradient norms, to that bound. The norm is the whole gradient's (the worker sends it with the push),
    so every shard keeps the same mean and scales its slice by the same factor: the applied step stays
    parallel to the gradient with any number of servers. The mean decays by 0.9 a push and takes each norm
    as kept (clipped), so one push far out of line moves the bound little."""

    DECAY = 0.9

    def __init__(self, factor: float):
        self.factor, self.mean = float(factor), None

    def scale(self, norm: float) -> float:
        """The factor this push's step is multiplied by (1.0: kept as it is); updates the mean."""
        bound = None if self.mean is None else self.factor * self.mean
        clipped = bound is not None and norm > bound
        kept = bound if clipped else norm
        self.mean = kept if self.mean is None else self.DECAY * self.mean + (1.0 - self.DECAY) * kept
        return bound / norm if clipped else 1.0


def check_compensation_numbers(lam, ms_momentum) -> None:
    """dc-asgd's and lc-asgd's numbers, as finite numbers in range (the rule checks the rest)."""
    if not (is_finite_number(lam) and lam >= 0):
        raise ValueError(f"lam must be a number >= 0 and finite (0 turns compensation off), got {lam!r}")
    if not (is_finite_number(ms_momentum) and 0 <= ms_momentum < 1):
        raise ValueError(f"ms_momentum must be in [0, 1), got {ms_momentum!r}")


def distance_sq(state, step: torch.Tensor, grad: torch.Tensor) -> float:
    """``||step - grad||^2``, through a scratch tensor of ``state``'s (no temporary: see
    DCRule.compensated)."""
    diff, = state.scratch_diff.take(grad, 1)
    return float(torch.sub(step, grad, out=diff).norm()) ** 2

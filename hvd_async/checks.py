"""Small checks shared by the modules: user input, whether gradients hold NaN or infinity, an
exception put in a few words for a one-line error, and where a warning should point."""
import math
import numbers
import os
import sys
from types import FrameType
from typing import Dict, List, Optional, Sequence

import torch


def is_int_at_least(value, minimum: int) -> bool:
    """True for a real ``int`` (not a bool) that is >= ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_finite_number(value) -> bool:
    """True for a finite real number (an int, a float, a NumPy scalar; not a bool, NaN or infinity)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite (no NaN, no infinity).

    A screen first: one sum per tensor (accumulated in fp32 or wider), and the sums summed. NaN and
    infinity always reach that total, so a finite total proves every element finite; it costs one
    vectorised pass per tensor, a tenth of ``isfinite().all()``'s time on the CPU (it allocates no
    mask). Only when the total is not finite (a non-finite element, or finite values whose sum
    overflows) does the exact element-wise check decide, so a large but finite gradient is never
    called non-finite.
    """
    if not tensors:
        return True
    tensors = [t._values() if t.is_sparse else t for t in tensors]
    if all(t.is_cuda and t.is_floating_point() for t in tensors):
        return all_finite_fused(tensors, foreach=True)
    sums = [t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
            if t.is_floating_point() else t.sum() for t in tensors]
    if bool(torch.isfinite(torch.stack([s.double() for s in sums]).sum())):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def norm_if_finite(t: torch.Tensor) -> Optional[float]:
    """The 2-norm of ``t`` where every element is finite, else None, in one pass where it is: a finite
    norm proves every element finite (as :func:`all_finite`'s sum does). A norm that is not finite
    goes to the exact check, which keeps finite values whose squares overflow (their norm, infinity,
    is returned as it is)."""
    norm = float(t.norm())
    if math.isfinite(norm) or bool(torch.isfinite(t).all()):
        return norm
    return None


FP16_OVERFLOW = 65520.0  # the smallest magnitude fp16 rounds to infinity (65504 is its largest finite)


def finite_in_fp16(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` stays finite when rounded to fp16: no NaN, nothing at or beyond
    ±65520. A screen first, as cheap as :func:`all_finite`'s sum: a sum of squares below 65520²
    proves it (a sum of non-negative terms never falls below its largest, rounding included; NaN
    fails the comparison). Otherwise the exact min/max decides (NaN propagates into both)."""
    flat = t.reshape(-1)
    if float(torch.dot(flat, flat)) < FP16_OVERFLOW ** 2:
        return True
    lo, hi = torch.aminmax(flat)
    return bool((lo > -FP16_OVERFLOW) & (hi < FP16_OVERFLOW))


def all_finite_fused(tensors: Sequence[torch.Tensor], foreach: bool = True) -> bool:
    """:func:`all_finite` for GPU tensors, where launches and host syncs are what cost: one norm over
    all the tensors (torch's fused foreach kernels), then one read. A finite norm proves every element
    finite, as the sums do; a non-finite one (or finite values whose squares overflow) goes to the
    exact element-wise check."""
    if bool(torch.isfinite(torch.nn.utils.get_total_norm(tensors, 2.0, foreach=foreach))):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


# torch's own kernel for GradScaler's check: one fused pass over a list of tensors (one device, one
# dtype) that sets a flag tensor on a NaN or infinite element, with no host sync (private, but what
# torch.amp has called since 1.6)
_AMP_CHECK = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)
DEVICE_TYPES = ("cuda",)  # where a host read is what costs; tests add "cpu"


def nonfinite_on_device(tensors: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """Whether some element of some tensor is NaN or infinite, without a host sync: a 0-dim float32
    tensor on the tensors' device (the shape torch's optimizers take as ``found_inf``), 1.0 if so, else
    0.0; exact (element by element, in torch's fused GradScaler kernel, scaling by 1). None where it
    does not apply: no tensors, a sparse or non-floating tensor, tensors on several devices or not on
    a device of ``DEVICE_TYPES``."""
    if not tensors or _AMP_CHECK is None:
        return None
    device = tensors[0].device
    groups: Dict[torch.dtype, List[torch.Tensor]] = {}
    for t in tensors:
        if t.device != device or t.is_sparse or not t.is_floating_point() or device.type not in DEVICE_TYPES:
            return None
        groups.setdefault(t.dtype, []).append(t)
    found = torch.zeros((), dtype=torch.float32, device=device)  # (0-dim, as GradScaler's)
    one = torch.ones((), dtype=torch.float32, device=device)
    for group in groups.values():
        _AMP_CHECK(group, found, one)
    return found


def brief_error(error: BaseException) -> str:
    """An exception in a few words for a one-line error: its type and its text's first line (cut at 100)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by this function's caller that names the first line
    outside the package (the user's call), past the package's frames and dataclasses' generated
    ``__init__`` (file ``<string>``): a deprecation then points at the line to change."""
    frame: Optional[FrameType]
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename.startswith("<")):
        frame, level = frame.f_back, level + 1
    return level

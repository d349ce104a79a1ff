"""The worker's model as one flat fp32 buffer, and the local step that skips a non-finite gradient:
what every window-based strategy (the parameter-server family, od-sgd, easgd, gossip) builds on."""
import logging
from typing import List, Optional

import torch

from ..checks import all_finite, finite_in_fp16

logger = logging.getLogger(__name__)


class FlatModel:
    """The parameters as one flat fp32 CPU buffer: views when they are CPU float32, copies otherwise."""

    def __init__(self, params: List[torch.Tensor]):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel, dtype=torch.float32)
        self.grad = torch.zeros(self.numel, dtype=torch.float32)
        self.views = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)
        self.slices, start = [], 0
        for p in params:
            self.slices.append(slice(start, start + p.numel()))
            start += p.numel()
        with torch.no_grad():
            for p, s in zip(params, self.slices):
                self.flat[s].copy_(p.detach().reshape(-1))
                if self.views:
                    p.data = self.flat[s].view_as(p)

    def load_params(self) -> None:
        """After ``flat`` changed: make the parameters hold it (nothing to do for views)."""
        if not self.views:
            with torch.no_grad():
                for p, s in zip(self.params, self.slices):
                    p.copy_(self.flat[s].view_as(p))

    def store_params(self) -> None:
        """After the parameters changed: copy them into ``flat`` (nothing to do for views)."""
        if not self.views:
            with torch.no_grad():
                for p, s in zip(self.params, self.slices):
                    self.flat[s].copy_(p.detach().reshape(-1))

    def gather_grads(self) -> torch.Tensor:
        """The parameters' gradients into ``grad`` (zeros where a parameter got none)."""
        with torch.no_grad():
            for p, s in zip(self.params, self.slices):
                if p.grad is None:
                    self.grad[s].zero_()
                else:
                    grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
                    self.grad[s].copy_(grad.detach().reshape(-1))
        return self.grad



def finite_grads(strategy, model: "FlatModel", skipped: str, fp16: bool = False) -> Optional[torch.Tensor]:
    """The model's gradients as one flat tensor, or None (counted in ``strategy.skipped_nonfinite``
    and logged, ``skipped`` saying what is not done) when one holds NaN or infinity; with ``fp16``
    (the gradient goes on the wire in fp16), also when one would round to infinity there."""
    grad = model.gather_grads()
    if finite_in_fp16(grad) if fp16 else all_finite([grad]):
        return grad
    strategy.skipped_nonfinite += 1
    if strategy.skipped_nonfinite == 1 or strategy.skipped_nonfinite % 100 == 0:
        logger.warning("worker %d: gradient holds NaN or infinity at step %d; %s (%d skipped so far)",
                       strategy.transport.rank, strategy.steps + 1, skipped, strategy.skipped_nonfinite)
    return None



def local_step_if_finite(strategy, model: "FlatModel") -> bool:
    """The wrapped optimizer's step on the worker's weights, skipped when a gradient is not finite
    (gossip, easgd)."""
    if finite_grads(strategy, model, "optimizer step skipped") is None:
        return False
    strategy.optimizer.step()
    model.store_params()
    return True

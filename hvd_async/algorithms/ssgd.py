"""ssgd: synchronous SGD, each gradient averaged across workers by allreduce (the baseline).

Same semantics as ``horovod.torch.DistributedOptimizer``: an allreduce starts from a hook as soon as
a parameter's gradient has been accumulated in ``backward()`` (overlapping the rest of the backward
pass), ``step()`` waits for all of them and then runs the wrapped optimizer. With
``backward_passes_per_step=k`` gradients accumulate locally over k backward passes (summed, as in
Horovod) and are reduced once. Parameters that got no gradient are reduced as zeros so that all
workers submit the same collectives. With a single worker nothing is exchanged (as in Horovod, so
fp16 compression does not round the gradients then).
"""
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..checks import all_finite, is_int_at_least
from ..transport.base import ReduceOp
from .base import Strategy

logger = logging.getLogger(__name__)


def _compression(value):
    """Horovod's compressor classes, or the names 'none' / 'fp16'."""
    from horovod.torch.compression import Compression

    if value is None or value == "none":
        return Compression.none
    if value == "fp16":
        return Compression.fp16
    if hasattr(value, "compress") and hasattr(value, "decompress"):
        return value
    raise ValueError(f"compression must be 'none', 'fp16' or a horovod Compression class "
                     f"(hvd.Compression.fp16), got {value!r}")


@dataclass
class SSGDOptions:
    backward_passes_per_step: int = 1
    compression: Any = None
    op: Any = "average"

    def __post_init__(self):
        bpps = self.backward_passes_per_step
        if not is_int_at_least(bpps, 1):
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {bpps!r}")
        self.compression = _compression(self.compression)
        self.op = ReduceOp.parse(self.op)


class SSGD(Strategy):
    """Synchronous data-parallel SGD through the workers' allreduce.

    Args (keyword options of ``DistributedOptimizer``):
        backward_passes_per_step: backward passes accumulated locally per ``step()`` (default 1).
        compression: 'none' (default), 'fp16', or a ``hvd.Compression`` class.
        op: 'average' (default) or 'sum' (``hvd.Average`` / ``hvd.Sum`` accepted).
    """

    name = "ssgd"
    Options = SSGDOptions

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._names = {p: name for name, p in named_parameters}
        self._trainable = [p for _, p in sorted(named_parameters, key=lambda item: item[0])
                           if p.requires_grad and transport.size > 1]
        self._delay = {p: options.backward_passes_per_step for p in self._trainable}
        self._handles = {}  # parameter -> (handle or None, compression context)
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self._trainable]
        self.skipped_nonfinite = 0

    def _allreduce_async(self, p):
        compressed, ctx = self.options.compression.compress(p.grad)
        handle = self.transport.allreduce_async_(compressed, name=f"ssgd.{self._names[p]}",
                                                 op=self.options.op)
        return handle, ctx

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._handles.get(p, (None,))[0] is not None and self._delay[p] <= 0:
            raise RuntimeError("gradients were computed more than backward_passes_per_step times "
                               "before step(); increase backward_passes_per_step to accumulate "
                               "them locally")
        self._delay[p] -= 1
        self._handles[p] = self._allreduce_async(p) if self._delay[p] == 0 else (None, None)

    def synchronize(self) -> None:
        for p in self._trainable:
            if self._handles.get(p, (None,))[0] is None:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._handles[p] = self._allreduce_async(p)
        for p, (handle, ctx) in self._handles.items():
            output = self.transport.synchronize(handle)
            self._delay[p] = self.options.backward_passes_per_step
            p.grad.set_(self.options.compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()`` (e.g. to clip gradients) so step() does not repeat it."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            self.synchronize()
        self._synchronized = False
        self.steps += 1
        if closure is None and not self._reduced_grads_finite():
            self.skipped_nonfinite += 1  # the same reduced gradients on every worker: all skip alike
            if self.skipped_nonfinite == 1 or self.skipped_nonfinite % 100 == 0:
                logger.warning("ssgd: the averaged gradient holds NaN or infinity at step %d; optimizer "
                               "step skipped (%d skipped so far)", self.steps, self.skipped_nonfinite)
            return None
        return self.optimizer.step(closure)

    def _reduced_grads_finite(self) -> bool:
        grads = [p.grad for _, p in self.named_parameters if p.grad is not None]
        return all_finite(grads)

    def stats(self):
        out = super().stats()
        out["skipped_nonfinite"] = self.skipped_nonfinite
        return out

    def state_dict(self):
        return {"steps": self.steps, "skipped_nonfinite": self.skipped_nonfinite}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])
        self.skipped_nonfinite = int(state.get("skipped_nonfinite", 0))

    def check_zero_grad(self) -> None:
        if self._handles:
            raise RuntimeError("zero_grad() was called after backward() but before step() or "
                               "synchronize(); that would race with the allreduce in flight")

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

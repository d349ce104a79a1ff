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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .. import checks
from ..checks import all_finite, is_int_at_least, nonfinite_on_device
from ..options import option
from ..transport.base import ReduceOp
from .algorithm import Algorithm
from .base import Strategy
from .step_undo import StepUndo

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


def device_flag(screens) -> torch.Tensor:
    """1.0 when the screens' sum is not finite, else 0.0, as a one-element tensor where the screens are
    (same dtype): computed on the device, so nothing waits for the GPU before the flag is reduced."""
    return torch.isfinite(torch.stack(screens).double().sum()).logical_not().float().reshape(1)


@dataclass
class SSGDOptions:
    backward_passes_per_step: int = option(1, "backward passes accumulated locally per step",
                                           flag="--backward-passes-per-step")
    compression: Any = option(None, "compress gradients to fp16 for the allreduce", flag="--fp16-allreduce",
                              action="store_true", convert=lambda on: "fp16")
    op: Any = option("average", "Horovod's: 'average' (hvd.Average) or 'sum' (hvd.Sum); Adasum is refused")
    gradient_predivide_factor: float = option(1.0, "Horovod's: gradients scaled by 1/f before the sum, f after")
    sparse_as_dense: bool = option(False, "Horovod's: densify sparse gradients (else a sparse allreduce)")
    num_groups: int = option(0, "Horovod's fusion groups: accepted (Horovod's fusion buffer batches anyway)")
    groups: Any = option(None, "Horovod's explicit fusion groups: accepted, as num_groups")
    undo_on_device: bool = option(True, "GPU, optimizer without found_inf: skip a non-finite step by undoing "
                                  "it on the device (a copy of parameters and state); False: host read")
    process_set: Any = option(None, "Horovod's process set (Python only): train over its workers alone")

    def __post_init__(self):
        bpps = self.backward_passes_per_step
        if not is_int_at_least(bpps, 1):
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {bpps!r}")
        if not isinstance(self.undo_on_device, bool):
            raise ValueError(f"undo_on_device must be True or False, got {self.undo_on_device!r}")
        self.compression = _compression(self.compression)
        self.op = ReduceOp.parse(self.op)


class SSGD(Strategy):
    """Synchronous data-parallel SGD through the workers' allreduce.

    Args (keyword options of ``DistributedOptimizer``):
        backward_passes_per_step: backward passes accumulated locally per ``step()`` (default 1).
        compression: 'none' (default), 'fp16', or a ``hvd.Compression`` class.
        op: 'average' (default) or 'sum' (``hvd.Average`` / ``hvd.Sum`` accepted).
        gradient_predivide_factor: gradients scaled by 1/f before the sum and by f after (Horovod's).
        process_set: Horovod's process set: only its workers build the optimizer and average among
            themselves (``hvd.add_process_set``; None or ``hvd.global_process_set``: every worker).
        sparse_as_dense: densify sparse gradients for the allreduce (the optimizer then gets the
            sum made sparse again); without it a sparse gradient is reduced by Horovod's sparse
            allreduce (an allgather). Both as Horovod does.
        num_groups, groups: Horovod's fusion groups; accepted, with no effect on the result.
        undo_on_device: with gradients on a GPU and an optimizer that cannot skip on a device flag
            (torch's unfused SGD), a step whose averaged gradient is not finite is undone on the device
            from a copy of the parameters and their state (default True: no host read, one copy in GPU
            memory); False reads the check on the host before the step.
    """

    # what this worker's gradients are multiplied by as they go out to the allreduce (lb-sgd: its share
    # of the step's samples, so that the average weights each sample alike)
    grad_weight = 1.0

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._names = {p: name for name, p in named_parameters}
        self._trainable = [p for _, p in sorted(named_parameters, key=lambda item: item[0])
                           if p.requires_grad and transport.size > 1]
        self._delay = {p: options.backward_passes_per_step for p in self._trainable}
        self._handles = {}  # parameter -> (handle or None, compression context)
        self._densified = set()  # sparse gradients reduced dense (sparse_as_dense): made sparse again after
        # The non-finite guard: each worker screens its own gradients as they go out (hot in cache),
        # and one flag per step, reduced with the gradients, says whether any worker's screen
        # tripped; only then is the averaged gradient checked element by element.
        self._screens = []  # squared norms of this step's outgoing local gradients
        self._flag = None  # (handle, tensor) of the step's flag allreduce
        self._exact_check = self.options.compression is not _compression(None) \
            or self.options.gradient_predivide_factor != 1.0  # (fp16 or scaling can overflow)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self._trainable]
        # With gradients on the GPU the check stays on the device, so nothing waits for the GPU (a
        # read on the host would stall every step; the guide's GPU section has the speeds): an
        # optimizer that takes torch.amp's found_inf (torch's fused SGD, Adam, AdamW) skips the step in its own kernel; another has its
        # step undone on the device (StepUndo; undo_on_device=False reads the check instead). Skips are
        # counted there too, and read every 100 steps and by stats().
        self._skipped = 0
        self._skipped_on_device = None  # a 0-dim tensor of skips not yet read, or None
        self._device_skip_ready = False  # after one step through the optimizer (its state exists)
        self._undo, self._undo_plan = StepUndo(), None

    def _allreduce_async(self, p):
        name, op, factor = f"ssgd.{self._names[p]}", self.options.op, self.options.gradient_predivide_factor
        if self.grad_weight != 1.0:
            p.grad.mul_(self.grad_weight)
        if p.grad.is_sparse:
            if not self.options.sparse_as_dense:  # Horovod's sparse allreduce (indices and values)
                values = p.grad.coalesce().values().reshape(-1)
                self._screens.append(torch.dot(values, values))
                return self.transport.sparse_allreduce_async(p.grad, name=name, op=op), None
            p.grad = p.grad.to_dense()
            self._densified.add(p)
        flat = p.grad.reshape(-1)
        self._screens.append(torch.dot(flat, flat) if flat.is_floating_point() else flat.sum())
        if factor != 1.0:
            p.grad.mul_(1.0 / factor)
        compressed, ctx = self.options.compression.compress(p.grad)
        return self.transport.allreduce_async_(compressed, name=name, op=op), ctx

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
        self._start_flag()
        factor = self.options.gradient_predivide_factor
        for p, (handle, ctx) in self._handles.items():
            output = self.transport.synchronize(handle)
            self._delay[p] = self.options.backward_passes_per_step
            if output.is_sparse:
                p.grad = output
                continue
            p.grad.set_(self.options.compression.decompress(output, ctx))
            if factor != 1.0:
                p.grad.mul_(factor)
            if p in self._densified:  # as Horovod: the optimizer gets a sparse gradient, as it would alone
                p.grad = p.grad.to_sparse()
        self._densified.clear()
        self._handles.clear()

    def _start_flag(self) -> None:
        """Reduce, with the step's gradients, whether this worker's screen tripped: a finite sum of
        squares bounds every element below 1.9e19, so finite local gradients on every worker give
        a finite sum or average (no fp32 overflow below 1.7e19 workers)."""
        if not self._trainable:
            return
        if self._flag is not None:  # a second synchronize() before step(): the newer flag counts
            self._flagged()
        screens = self._screens
        if screens and screens[0].is_cuda and len({s.dtype for s in screens}) == 1:
            flag = device_flag(screens)  # on the GPU: a few launches and no host sync here
        else:
            screened = torch.stack([s.double() for s in screens]).sum() if screens else torch.zeros(())
            flag = torch.tensor([0.0 if bool(torch.isfinite(screened)) else 1.0])
        self._screens = []
        self._flag = self.transport.allreduce_async_(flag, name="ssgd.nonfinite", op=ReduceOp.SUM), flag

    def _flagged(self) -> bool:
        """Whether some worker's screen tripped this step (waits for the flag's allreduce)."""
        if self._flag is None:
            return True  # nothing was reduced (one worker, or nothing trainable): check exactly
        handle, _ = self._flag
        self._flag = None
        return float(self.transport.synchronize(handle)[0]) > 0

    def step(self, closure=None):
        if self._should_synchronize:  # (a step after the user's synchronize(): the wrapper warns)
            self.synchronize()
        self.steps += 1
        if closure is not None:
            self._flagged()  # (drained: a closure recomputes the loss, the check is skipped as before)
        else:
            found = self._found_on_device()
            if found is not None:
                return self._step_skipping_on_device(found)
            if not self._reduced_grads_finite():
                self.skipped_nonfinite += 1  # the same reduced gradients on every worker: all skip alike
                if self.skipped_nonfinite == 1 or self.skipped_nonfinite % 100 == 0:
                    logger.warning("ssgd: the averaged gradient holds NaN or infinity at step %d; optimizer "
                                   "step skipped (%d skipped so far)", self.steps, self.skipped_nonfinite)
                return None
        result = self.optimizer.step(closure)
        self._device_skip_ready = True
        return result

    def _found_on_device(self):
        """The exact check of the averaged gradients as a tensor on their GPU (no host read), where the
        step can be skipped on it there (see ``_step_skipping_on_device``); else None (read on the host)."""
        opt = self.optimizer
        amp = getattr(opt, "_step_supports_amp_scaling", False)
        if not (self._device_skip_ready and (amp or self.options.undo_on_device)) \
                or getattr(opt, "found_inf", None) is not None or getattr(opt, "grad_scale", None) is not None:
            return None
        grads = [p.grad for _, p in self.named_parameters if p.grad is not None]
        if not grads or grads[0].device.type not in checks.DEVICE_TYPES:
            return None
        plan = None
        if not amp:  # (decided before the check runs: where the undo declines, the host reads it alone)
            plan = self._undo.plan(opt, grads[0].device)
            if plan is None:
                return None
        found = nonfinite_on_device(grads)
        if found is None or (plan is not None and not self._copy_for_undo(plan, found)):
            return None
        self._undo_plan = plan
        if self._flag is not None:
            handle, _ = self._flag  # drained, not read: the exact check decides
            self._flag = None
            self.transport.synchronize(handle)
        return found

    def _copy_for_undo(self, plan, found: torch.Tensor) -> bool:
        """The step undo's copy; False where the device has no memory for it (then, with a warning, the
        check is read on the host from this step on)."""
        try:
            self._undo.copy(plan, found)
            return True
        except torch.OutOfMemoryError as error:
            self.options.undo_on_device = False
            logger.warning("ssgd: no device memory for the copy that undoes a non-finite step (%s); the "
                           "check is read on the host from step %d on (undo_on_device=False says so up front)",
                           str(error).splitlines()[0][:120], self.steps)
            return False

    def _step_skipping_on_device(self, found: torch.Tensor):
        """The wrapped optimizer's step, skipped where ``found`` is 1 with no host read: by its own kernel
        where it takes torch.amp's found_inf (grad_scale None: nothing to unscale), else undone after it
        on the device (``StepUndo``)."""
        opt = self.optimizer
        if self._undo_plan is not None:
            result = opt.step()
            self._undo.undo(opt, self._undo_plan, found)
            self._undo_plan = None
        else:
            opt.found_inf, opt.grad_scale = found, None  # type: ignore[attr-defined]  # dynamic; torch's step reads
            try:
                result = opt.step()
            finally:
                del opt.found_inf, opt.grad_scale  # type: ignore[attr-defined]  # dynamic, as above
        if self._skipped_on_device is None:
            self._skipped_on_device = found
        else:
            self._skipped_on_device.add_(found)
        if self.steps % 100 == 0:
            self._read_device_skips()
        return result

    def _read_device_skips(self) -> None:
        """Fold the skips counted on the device into the count (one host read), with the warning."""
        counted, self._skipped_on_device = self._skipped_on_device, None
        newly = 0 if counted is None else int(counted.item())
        if newly:
            self._skipped += newly
            logger.warning("ssgd: the averaged gradient held NaN or infinity at %d step(s) up to step %d; "
                           "those optimizer steps were skipped (%d skipped so far)",
                           newly, self.steps, self._skipped)

    @property
    def skipped_nonfinite(self) -> int:
        """Optimizer steps skipped because the averaged gradient held NaN or infinity."""
        self._read_device_skips()
        return self._skipped

    @skipped_nonfinite.setter
    def skipped_nonfinite(self, value: int) -> None:
        self._read_device_skips()
        self._skipped = int(value)

    def _reduced_grads_finite(self) -> bool:
        flagged = self._flagged()
        if not (flagged or self._exact_check):
            return True
        grads = [p.grad for _, p in self.named_parameters if p.grad is not None]
        return all_finite(grads)

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


class SSGDAlgorithm(Algorithm):
    """ssgd's declaration: Horovod's collectives."""

    Options: ClassVar[type] = SSGDOptions  # a subclass declares its own
    strategy: ClassVar[type] = SSGD
    fused_sgd = True  # torch's fused SGD skips a non-finite step itself: the guard reads nothing on the host

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        """Horovod's collectives, over ``options.process_set``'s workers where one is given."""
        return comms.collectives(options.process_set)

"""Skipping an optimizer's step on a flag that stays on the GPU, for optimizers that cannot take torch.amp's
``found_inf`` (torch's unfused SGD, or Adam with ``capturable=True``): the step runs, and what it changed
is set back where the flag is set.

Before the step (the flag is known by then) the parameters it may change (those with a gradient) and
their optimizer state are copied, times the flag: their values where it is set, zeros where it is not.
After it, each takes ``x * (1 - found) + copy``. Both are computed on the bit patterns (integer views), so
a NaN or infinity the step wrote leaves no trace and a kept step is kept bit for bit. They run as
multi-tensor launches (a few per dtype), never a host read; the copy lives for the step only. The cost is
memory traffic: about seven passes over the parameters and their state per step.

Where the device cannot undo the step alone (a state tensor elsewhere, a number in the state, or a
parameter whose state the step creates or replaces) it says so: ``plan()`` returns None before the step
(the caller reads the flag on the host instead, and runs no device check), or ``undo()`` reads the
flag once after it.
"""
from typing import Dict, List, Optional, Tuple, Union

import torch

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Plan:
    """One step's tensors: per parameter, its state's entries as they were; after ``StepUndo.copy``, per
    integer view dtype, 1 - flag and the copies times the flag."""

    def __init__(self, entries: Dict[torch.Tensor, dict]):
        self.entries = entries
        self.kept: Dict[torch.dtype, Tuple[torch.Tensor, Union[Tuple[torch.Tensor, ...], List[torch.Tensor]]]] = {}


class StepUndo:
    """The undo, with the integer views of the last step's tensors (made again when they change)."""

    def __init__(self):
        self._key = None  # ((id, data_ptr) of each tensor the last plan covered)
        self._views: Dict[torch.dtype, List[torch.Tensor]] = {}

    def plan(self, optimizer, device: torch.device) -> Optional[Plan]:
        """What the step may change (parameters with a gradient and their state, all on ``device``, where
        the step runs); None where the device cannot undo it alone. Host work only: nothing launched."""
        targets, entries = [], {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = optimizer.state.get(p, {})
                values = [v for v in state.values() if v is not None]
                if p.device != device or not all(torch.is_tensor(v) and v.device == device for v in values):
                    return None
                targets.append(p)
                targets.extend(values)
                entries[p] = dict(state)
        key = tuple((id(t), t.data_ptr()) for t in targets)
        if key != self._key:
            self._views = {}
            for t in targets:
                bits, view = _bit_view(t)
                self._views.setdefault(bits, []).append(view)
            self._key = key
        return Plan(entries)

    def copy(self, plan: Plan, found: torch.Tensor) -> None:
        """Before the step: copy the planned tensors times ``found`` (0-dim, 0.0 or 1.0, on their device)."""
        flag = found.reshape(())
        with torch.no_grad():
            for bits, views in self._views.items():
                taken = flag.to(bits)
                plan.kept[bits] = (1 - taken, torch._foreach_mul(views, taken))

    def undo(self, optimizer, plan: Plan, found: torch.Tensor) -> None:
        """After the step: every planned tensor back to its copy where ``found`` is 1, as it is where 0."""
        with torch.no_grad():
            for bits, (keep, copies) in plan.kept.items():
                torch._foreach_mul_(self._views[bits], keep)
                torch._foreach_add_(self._views[bits], copies)
        changed = [p for p, before in plan.entries.items() if _changed(optimizer.state.get(p, {}), before)]
        if changed and bool(found):  # the step made or replaced state: one host read decides
            for p in changed:
                optimizer.state[p] = plan.entries[p]


def _bit_view(t: torch.Tensor):
    """(integer dtype, ``t``'s bits as a view of that dtype); a 16-byte complex (complex128) as pairs of
    int64, its real and imaginary parts."""
    t = t.detach()
    if t.element_size() == 16 and t.is_complex():
        t = torch.view_as_real(t)
    bits = _BITS[t.element_size()]
    return bits, t.view(bits)


def _changed(state: dict, before: dict) -> bool:
    return state.keys() != before.keys() or any(state[k] is not v for k, v in before.items())

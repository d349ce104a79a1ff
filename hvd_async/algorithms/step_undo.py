"""Skipping an optimizer's step on a flag that stays on the GPU, for optimizers that cannot take torch.amp's
``found_inf`` (torch's unfused SGD, or Adam with ``capturable=True``): the step runs, and what it changed
is set back where the flag is set.

Before the step, the parameters it may change (those with a gradient) and their optimizer state are
copied on the device; after it, each takes ``x * (1 - found) + copy * found``, computed on the bit
patterns (integer views), so a NaN or infinity the step wrote leaves no trace and a kept step is kept
bit for bit. Both run as multi-tensor launches (a few per dtype), never a host read, at the cost of one
copy of the parameters and their state in device memory, kept between steps.

Where the device cannot undo the step alone (a state tensor elsewhere, a number in the state, or a
parameter whose state the step creates or replaces) it says so: ``plan()`` returns None before the step
(the caller reads the flag on the host instead), or ``undo()`` reads the flag once after it.
"""
from typing import Dict, List, Optional

import torch

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Plan:
    """One step's tensors to copy and, per parameter, its state's entries as they were."""

    def __init__(self, targets: List[torch.Tensor], entries: Dict[torch.Tensor, dict]):
        self.targets, self.entries = targets, entries


class StepUndo:
    """The copies kept between steps (one per tensor a step may change), and the undo."""

    def __init__(self):
        self._copies: Dict[int, tuple] = {}  # id(tensor) -> (tensor, its copy)

    def plan(self, optimizer, device: torch.device) -> Optional[Plan]:
        """What the step may change, copied now; None where the device cannot undo it alone."""
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
        copies = {}
        for t in targets:
            kept = self._copies.get(id(t))
            if kept is None or kept[0] is not t:
                kept = (t, torch.empty_like(t))
            copies[id(t)] = kept
        self._copies = copies  # (copies of tensors no longer stepped are let go)
        with torch.no_grad():
            torch._foreach_copy_([copies[id(t)][1] for t in targets], targets)
        return Plan(targets, entries)

    def undo(self, optimizer, plan: Plan, found: torch.Tensor) -> None:
        """Set every planned tensor back to its copy where ``found`` (0-dim, 0.0 or 1.0) is 1."""
        groups = {}
        for t in plan.targets:
            view = _BITS[t.element_size()]
            tensors, copies = groups.setdefault(view, ([], []))
            tensors.append(t.detach().view(view))
            copies.append(self._copies[id(t)][1].view(view))
        flag = found.reshape(())
        with torch.no_grad():
            for view, (tensors, copies) in groups.items():
                taken = flag.to(view)
                torch._foreach_mul_(tensors, 1 - taken)
                torch._foreach_mul_(copies, taken)
                torch._foreach_add_(tensors, copies)
        changed = [p for p, before in plan.entries.items() if _changed(optimizer.state.get(p, {}), before)]
        if changed and bool(found):  # the step made or replaced state: one host read decides
            for p in changed:
                optimizer.state[p] = plan.entries[p]


def _changed(state: dict, before: dict) -> bool:
    return state.keys() != before.keys() or any(state[k] is not v for k, v in before.items())

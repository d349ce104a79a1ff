"""What one parameter-server shard holds, counted from the code itself.

A shard's memory is its windows (the weights; in mailbox mode the inbox slots and, where the
algorithm keeps one, the outbox: sized from the :class:`~hvd_async.transport.window.WindowSpec` the
strategy would open) and the tensors its server program keeps (momentum buffers, sums, scratch, the
look-ahead's total): the program is built on a simulated shard and served one push from every
worker, with SGD's momentum and weight decay so that every buffer it keeps is made, and then every
tensor reachable from it is counted once. Counted at two shard sizes, the difference is what grows
with the model (a predictor's small network does not); divided by a copy's 4 bytes an element, it
is how many copies of the shard the server holds: ``copies(workers)``, linear in the workers.

    >>> shard_copies("dc-asgd", 4, {"inbox_slots": 0})["total"]  # doctest: +SKIP
"""
from typing import Any, Dict, Optional

import numpy as np
import torch

from .. import registry
from ..algorithms.base import parse_options
from ..transport import window
from .windows import SimShardHost

SIZES = (2048, 4096)  # shard elements of the two counts (their difference is what scales)


def _held_bytes(obj: Any, windows: set, seen: set, storages: Dict[int, int]) -> None:
    """Add every tensor reachable from ``obj`` (attributes of hvd_async objects, containers) to
    ``storages`` (storage address -> bytes), skipping the windows' memory."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() not in windows:
            storages[storage.data_ptr()] = storage.nbytes()
    elif isinstance(obj, torch.nn.Module):
        for tensor in list(obj.parameters()) + list(obj.buffers()):
            _held_bytes(tensor, windows, seen, storages)
    elif isinstance(obj, dict):
        for value in obj.values():
            _held_bytes(value, windows, seen, storages)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            _held_bytes(value, windows, seen, storages)
    elif type(obj).__module__.startswith("hvd_async") and not isinstance(obj, window.ShardHost) \
            and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            _held_bytes(value, windows, seen, storages)


def _program_bytes(cls, spec: window.WindowSpec) -> int:
    """Bytes of tensors the server program (and the host's fp16 widening) keeps after one push from
    every worker."""
    host = SimShardHost(spec, 0, cls.server_program)  # the slots as the real host has them (fp16: read widened)
    slots = []
    if spec.mode == "mailbox":
        slots = list(host.inbox_raw) + list(host.outbox or [])
        program = host.program
        gen = torch.Generator().manual_seed(0)
        payload = program.Payload(lr=0.01, momentum=0.9, weight_decay=1e-4).encode()
        header = np.zeros(window.H_LEN, dtype=np.float64)
        for worker in range(spec.workers):
            slot = worker % spec.inbox_slots  # (a pool of fewer slots than workers: taken in turn)
            host.inbox_raw[slot].copy_(torch.randn(spec.numel, generator=gen))
            window.encode_request(header, window.Kind.PUSH, payload, slot if spec.pooled else None)
            program.on_request(worker, window.Request.decode(header, 0, worker))
    windows = {t.untyped_storage().data_ptr() for t in [host.weights] + slots}
    storages: Dict[int, int] = {}
    seen: set = set()
    _held_bytes(host.program, windows, seen, storages)
    _held_bytes(getattr(host, "inbox", None), windows, seen, storages)  # (fp16: the widening buffer)
    return sum(storages.values())


def window_copies(spec: window.WindowSpec) -> float:
    """Copies of the shard (4 bytes an element) in its windows: weights, inbox slots, outbox (shard 0's,
    whose size the others' are within an element of)."""
    sizes = spec.sizes(0)
    wire = np.dtype(spec.wire_dtype).itemsize / 4
    return 1.0 + wire * (sizes.inbox + sizes.outbox) / max(1, sizes.weights)


def shard_copies(algo: str, workers: int, options: Optional[Dict[str, Any]] = None) -> Dict[str, float]:
    """Copies of its shard one server holds under ``algo`` at ``workers`` workers: ``windows``,
    ``program`` (what its server program keeps) and ``total``."""
    cls = registry.algorithm(algo)
    opts = parse_options(cls.Options, algo, dict(options or {}))
    cls.resolve_options(opts, workers)
    specs = [cls.window_spec(opts, n, 1, workers) for n in SIZES]
    grown = _program_bytes(cls, specs[1]) - _program_bytes(cls, specs[0])
    program = grown / (4.0 * (SIZES[1] - SIZES[0]))
    windows = window_copies(specs[0])
    return {"windows": windows, "program": round(program, 3), "total": round(windows + program, 3)}

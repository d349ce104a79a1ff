"""push_bandwidth: each server program's time per push against what its memory traffic allows.

A server program's push is a few passes over the shard (read the gradient, the weights, a backup, a
momentum buffer; write the weights, the buffer, the answer), so its floor is the bytes it moves divided
by the memory bandwidth. This benchmark, in one process with no MPI (only the programs' arithmetic):

- counts the bytes each program reads and writes per push, from the code: every tensor operation of a
  push is intercepted (``TorchDispatchMode``) and its tensor inputs counted as read, its outputs as
  written (views move nothing; the target of ``copy_``/``zero_``/``fill_`` is written, not read);
- measures the bandwidth of this machine's memory as the fastest of ``torch.add(a, b, out=c)`` (3
  passes) and ``c.copy_(a)`` (2 passes) over shard-sized tensors;
- times each program's pushes (the workers in turn; SGD momentum 0.9 and weight decay, so every buffer
  is in use) and prints ``time per push / (bytes per push / bandwidth)``: 1 is the memory's speed.
  The target: at most 2.

torch runs one thread, as a server rank beside busy workers does; ``--threads`` changes that.

    python benchmarks/push_bandwidth.py
    python benchmarks/push_bandwidth.py --size 4MB --pushes 8 --out /tmp/p.json
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from common import HERE, ROOT, parse_size, spread, write_record

if ROOT not in sys.path:
    sys.path.append(ROOT)

from hvd_async import registry  # noqa: E402
from hvd_async.algorithms.base import parse_options  # noqa: E402
from hvd_async.sim.windows import SimShardHost  # noqa: E402
from hvd_async.transport import window as W  # noqa: E402

PROGRAMS = {"dc-asgd": {}, "lc-asgd": {}, "softsync": {}, "backup-sgd": {}, "od-sgd": {"exchange": "window"}}
WORKERS = 4
TARGET = 2.0
ONLY_WRITTEN = ("copy_", "zero_", "fill_")  # in-place ops that write their target without reading it


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Traffic(TorchDispatchMode):
    """Bytes read and written by the tensor operations run under it."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
            return out  # a view: no data moves
        name = func.__name__.split(".")[0]
        if name.startswith("empty") or name in ("_local_scalar_dense",):
            return out  # allocation, or reading back a scalar already counted
        inputs = _tensors(args)
        if name in ONLY_WRITTEN:
            inputs = inputs[1:]
        inputs += _tensors({k: v for k, v in kwargs.items() if k != "out"})
        self.read += _bytes(inputs)
        self.written += _bytes(_tensors(out))
        return out


def make_program(algo: str, numel: int):
    cls = registry.strategy_class(algo)
    options = parse_options(cls.Options, algo, dict(PROGRAMS[algo]))
    cls.resolve_options(options, WORKERS)
    host = SimShardHost(cls.window_spec(options, numel, 1, WORKERS), 0, cls.server_program)
    gen = torch.Generator().manual_seed(0)
    host.weights.copy_(torch.randn(numel, generator=gen))
    for slot in host.inbox_raw:
        slot.copy_(torch.randn(numel, generator=gen) * 1e-3)
    header = np.zeros(W.H_LEN, dtype=np.float64)
    W.encode_request(header, W.Kind.PUSH, host.program.Payload(lr=0.01, momentum=0.9, weight_decay=1e-4).encode())
    requests = [W.Request.decode(header, 0, m) for m in range(WORKERS)]
    return host.program, requests


def pushes(program, requests, count: int) -> None:
    for i in range(count):
        program.on_request(i % WORKERS, requests[i % WORKERS])


def bandwidth(numel: int, reps: int) -> float:
    """Bytes per second of the fastest of a 3-pass add and a 2-pass copy over ``numel`` floats."""
    a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    best = 0.0
    for _ in range(reps):
        for run, passes in ((lambda: torch.add(a, b, out=c), 3), (lambda: c.copy_(a), 2)):
            start = time.perf_counter()
            run()
            best = max(best, passes * 4 * numel / (time.perf_counter() - start))
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", default="64MB", help="shard size (fp32 bytes)")
    p.add_argument("--algos", default=",".join(PROGRAMS), help="comma-separated, of " + ", ".join(PROGRAMS))
    p.add_argument("--pushes", type=int, default=16, help="timed pushes per block")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per program (the median is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--out", default=os.path.join(HERE, "results", "push_bandwidth.json"))
    args = p.parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    unknown = [a for a in algos if a not in PROGRAMS]
    if unknown or args.pushes < WORKERS or args.blocks < 1 or args.threads < 1:
        p.error(f"--algos from {', '.join(PROGRAMS)} (got {', '.join(unknown) or 'them'}); --pushes >= {WORKERS}, "
                "--blocks and --threads >= 1")
    torch.set_num_threads(args.threads)
    numel = parse_size(args.size) // 4
    rate = bandwidth(numel, 5)
    print(f"memory bandwidth (best of add and copy, {args.threads} thread(s)): {rate / 1e9:.2f} GB/s", flush=True)
    results = {}
    for algo in algos:
        program, requests = make_program(algo, numel)
        pushes(program, requests, 2 * WORKERS)  # every buffer made, the first-touch faults paid
        with Traffic() as traffic:
            pushes(program, requests, WORKERS)
        moved = (traffic.read + traffic.written) / WORKERS
        times = []
        for _ in range(args.blocks):
            start = time.perf_counter()
            pushes(program, requests, args.pushes)
            times.append((time.perf_counter() - start) / args.pushes)
        per_push = statistics.median(times)
        floor = moved / rate
        results[algo] = {"bytes_read_per_push": traffic.read / WORKERS,
                         "bytes_written_per_push": traffic.written / WORKERS,
                         "shard_passes": round(moved / (4 * numel), 2), "ms_per_push": round(1e3 * per_push, 3),
                         "ms_per_push_spread": spread(1e3 * t for t in times), "floor_ms": round(1e3 * floor, 3),
                         "ratio": round(per_push / floor, 2), "meets_target": per_push / floor <= TARGET}
        r = results[algo]
        print(f"{algo:>10}: {r['shard_passes']:5.1f} shard passes a push, {r['ms_per_push']:8.2f} ms a push, floor "
              f"{r['floor_ms']:7.2f} ms: ratio {r['ratio']:.2f} ({'meets' if r['meets_target'] else 'misses'} "
              f"{TARGET:g})", flush=True)
        del program, requests
    write_record({"benchmark": "push_bandwidth", "shard_bytes": 4 * numel, "workers": WORKERS,
                  "threads": args.threads,
                  "bandwidth_bytes_per_second": rate, "target_ratio": TARGET, "options": PROGRAMS,
                  "programs": results}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""push_bandwidth: each server program's time per push, its passes over the shard, and its cost against
asgd's ``Accumulate`` of the same bytes, measured in the same run (the servers' capacity).

A server program's push is a few passes over the shard (read the gradient, the weights, a backup, a
momentum buffer; write the weights, the buffer, the answer), so its floor is the bytes it moves divided
by the memory bandwidth. This benchmark, in one process with no MPI launcher (only the programs'
arithmetic, and one MPI window of its own for asgd's push):

- counts the bytes each program reads and writes per push, from the code: every tensor operation of a
  push is intercepted (``TorchDispatchMode``) and its tensor inputs counted as read, its outputs as
  written (views move nothing; the target of ``copy_``/``zero_``/``fill_`` is written, not read). The
  **passes per push** are those bytes over the shard's bytes: an operation reading two shard-sized
  tensors and writing one counts 3, a norm 1 (a tensor read twice by one operation counts twice);
- measures the bandwidth of this machine's memory as the fastest of ``torch.add(a, b, out=c)`` (3
  passes) and ``c.copy_(a)`` (2 passes) over shard-sized tensors;
- times asgd's push as the server sees it, an MPI ``Accumulate`` (sum) of the shard's bytes into a window
  on this process (``MPI.COMM_SELF``, under a lock: read the window and the data, write the window),
  before each timed block of every program, so that a block's ratio compares the two on the same
  minutes of a machine whose speed drifts;
- times each program's pushes (the workers in turn; SGD momentum 0.9 and weight decay, so every buffer
  is in use) and prints, per shard size: ms per push, passes per push, the ratio to the Accumulate
  (the median over the blocks of each block's ratio)
  (issue 58's targets at 64 MiB: dc-asgd and lc-asgd at most 3, softsync and backup-sgd at most 2),
  and ``time per push / (bytes per push / bandwidth)`` (1 is the memory's speed).

torch runs one thread, as a server rank beside busy workers does; ``--threads`` changes that.

    python benchmarks/speed/push_bandwidth.py                        # 1, 16 and 64 MiB shards
    python benchmarks/speed/push_bandwidth.py --sizes 4MB --pushes 8 --out /tmp/p.json
    python benchmarks/speed/push_bandwidth.py --quick --out /tmp/p.json   # bench-check's form: 1 and 16 MiB
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, ROOT, parse_size, spread, write_record

if ROOT not in sys.path:
    sys.path.append(ROOT)

from hvd_async import registry  # noqa: E402
from hvd_async.algorithms.base import parse_options  # noqa: E402
from hvd_async.sim.windows import SimShardHost  # noqa: E402
from hvd_async.transport import window as W  # noqa: E402

# name[:label] -> options; the eager rows are dc-asgd's, lc-asgd's, softsync's and backup-sgd's push as a chain of torch operations,
# beside the default (auto: one compiled loop from 2**20 elements on, hvd_async/rules/fused.py)
PROGRAMS = {"dc-asgd": {}, "dc-asgd:eager": {"server_kernel": "eager"}, "lc-asgd": {},
            "lc-asgd:eager": {"server_kernel": "eager"}, "softsync": {}, "softsync:eager": {"server_kernel": "eager"},
            "backup-sgd": {}, "backup-sgd:eager": {"server_kernel": "eager"}, "od-sgd": {"exchange": "window"}}
WORKERS = 4
TARGET = 2.0  # time over the memory-bandwidth floor
ACCUMULATE_TARGETS = {"dc-asgd": 3.0, "lc-asgd": 3.0, "softsync": 2.0, "backup-sgd": 2.0}  # at 64 MiB (issue 58)
SIZES, QUICK_SIZES = "1MB,16MB,64MB", "1MB,16MB"
ACCUMULATE_REPS = 3  # Accumulates timed before each block of pushes (their median is the block's yardstick)
ONLY_WRITTEN = ("copy_", "zero_", "fill_")  # in-place ops that write their target without reading it


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Traffic(TorchDispatchMode):
    """Bytes read and written by the tensor operations run under it. A compiled push (``program.fused``,
    which cannot run under a dispatch mode) is run outside it and counted by what it declares it moves
    (:meth:`hvd_async.rules.fused.FusedPush.traffic`, and ``round_traffic`` for backup-sgd's round: each
    array it touches once)."""

    def __init__(self, program=None):
        super().__init__()
        self.read = self.written = 0
        self.fused = getattr(program, "fused", None)

    def __enter__(self):
        fused = self.fused
        if fused is not None:  # (this instance's, until __exit__)
            fused._call = self._counted(type(fused)._call, lambda variant, weights, *rest:
                                        fused.traffic(variant, weights.numel()))
            fused._call_round = self._counted(type(fused)._call_round, lambda weights, buf, grads, slots, *rest:
                                              fused.round_traffic(len(grads), len(slots), rest[-1], weights.numel()))
        return super().__enter__()

    def _counted(self, call, traffic):
        """``call`` run outside this mode, its bytes counted by ``traffic`` (on the same arguments)."""
        def counted(*args):
            with _disable_current_modes():
                found = call(*args)
            read, written = traffic(*args)
            self.read, self.written = self.read + read, self.written + written
            return found
        return counted

    def __exit__(self, *exc):
        if self.fused is not None:
            del self.fused._call, self.fused._call_round
        return super().__exit__(*exc)

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
    name = algo.split(":")[0]
    cls = registry.algorithm(name)
    options = parse_options(cls.Options, name, dict(PROGRAMS[algo]))
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


class Accumulate:
    """asgd's push on the server's memory: ``Accumulate`` (MPI.SUM) of ``numel`` floats into a window on
    this process, under an exclusive lock. One window for a shard size, timed between the programs'
    blocks, so that each block's ratio is to an Accumulate of the same minutes of this machine."""

    def __init__(self, numel: int):
        from mpi4py import MPI

        self.MPI = MPI
        self.win = MPI.Win.Allocate(4 * numel, 4, comm=MPI.COMM_SELF)
        np.frombuffer(self.win.tomemory(), dtype=np.float32)[:] = 0.0
        self.data = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
        self.times: list = []  # every timed one, for the record
        self._one()  # the first, which faults the pages in, is not kept

    def _one(self) -> float:
        start = time.perf_counter()
        self.win.Lock(0)
        self.win.Accumulate(self.data, 0, op=self.MPI.SUM)
        self.win.Unlock(0)
        return time.perf_counter() - start

    def seconds(self, reps: int) -> float:
        """The median of ``reps`` timed Accumulates."""
        times = [self._one() for _ in range(reps)]
        self.times.extend(times)
        return statistics.median(times)

    def close(self) -> None:
        self.win.Free()


def measure(algo: str, numel: int, args, rate: float, accumulate: Accumulate) -> dict:
    """One program at one shard size: bytes and passes per push, ms per push, the ratios (each timed
    block beside an Accumulate timed just before it; the medians over the blocks)."""
    program, requests = make_program(algo, numel)
    pushes(program, requests, 2 * WORKERS)  # every buffer made, the first-touch faults paid
    with Traffic(program) as traffic:
        pushes(program, requests, WORKERS)
    moved = (traffic.read + traffic.written) / WORKERS
    times, ratios = [], []
    for _ in range(args.blocks):
        acc = accumulate.seconds(ACCUMULATE_REPS)
        start = time.perf_counter()
        pushes(program, requests, args.pushes)
        times.append((time.perf_counter() - start) / args.pushes)
        ratios.append(times[-1] / acc)
    per_push, ratio = statistics.median(times), statistics.median(ratios)
    floor = moved / rate
    return {"bytes_read_per_push": traffic.read / WORKERS, "bytes_written_per_push": traffic.written / WORKERS,
            "shard_passes": round(moved / (4 * numel), 2), "ms_per_push": round(1e3 * per_push, 3),
            "ms_per_push_spread": spread(1e3 * t for t in times), "floor_ms": round(1e3 * floor, 3),
            "ratio": round(per_push / floor, 2), "meets_target": per_push / floor <= TARGET,
            "ratio_to_accumulate": round(ratio, 2), "ratio_to_accumulate_spread": spread(ratios),
            "compiled": getattr(program, "fused", None) is not None,
            "compile_seconds": round(getattr(getattr(program, "fused", None), "compile_seconds", 0.0), 2),
            # the form bench_check compares (higher is better): the Accumulate's time over this program's
            "accumulate_over_push": round(1.0 / ratio, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default=None, help=f"comma-separated shard sizes (fp32 bytes; default {SIZES}, "
                   f"with --quick {QUICK_SIZES})")
    p.add_argument("--size", default=None, help="one shard size (the old flag: --sizes SIZE)")
    p.add_argument("--algos", default=",".join(PROGRAMS), help="comma-separated, of " + ", ".join(PROGRAMS))
    p.add_argument("--pushes", type=int, default=16, help="timed pushes per block")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per program (the median is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--quick", action="store_true", help="bench-check's form: 1 and 16 MiB, 8 pushes, 3 blocks")
    p.add_argument("--out", default=os.path.join(HERE, "results", "push_bandwidth.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.pushes, args.blocks = 8, 3
    try:
        sizes = [parse_size(x) for x in (args.size or args.sizes or (QUICK_SIZES if args.quick else SIZES)).split(",")
                 if x]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    algos = [a for a in args.algos.split(",") if a]
    unknown = [a for a in algos if a not in PROGRAMS]
    if unknown or args.pushes < WORKERS or args.blocks < 1 or args.threads < 1:
        p.error(f"--algos from {', '.join(PROGRAMS)} (got {', '.join(unknown) or 'them'}); --pushes >= {WORKERS}, "
                "--blocks and --threads >= 1")
    torch.set_num_threads(args.threads)
    rows = []
    for size in sizes:
        numel = size // 4
        rate = bandwidth(numel, 5)
        accumulate = Accumulate(numel)
        try:
            acc_s = accumulate.seconds(max(5, args.blocks))
            print(f"shard {size / 2**20:g} MiB: memory bandwidth {rate / 1e9:.2f} GB/s ({args.threads} thread(s)); "
                  f"asgd's Accumulate {1e3 * acc_s:.2f} ms", flush=True)
            row = {"shard_bytes": 4 * numel, "bandwidth_bytes_per_second": rate, "programs": {}}
            for algo in algos:
                r = row["programs"][algo] = measure(algo, numel, args, rate, accumulate)
                target = ACCUMULATE_TARGETS.get(algo)
                print(f"  {algo:>10}: {r['ms_per_push']:8.2f} ms a push, {r['shard_passes']:5.1f} passes a push, "
                      f"{r['ratio_to_accumulate']:6.2f}x the Accumulate" + (f" (target <= {target:g} at 64 MiB)"
                                                                              if target else "")
                      + f"; {r['ratio']:.2f}x the memory floor", flush=True)
            row["accumulate_ms"] = round(1e3 * statistics.median(accumulate.times), 3)
            row["accumulate_ms_spread"] = spread(1e3 * t for t in accumulate.times)
        finally:
            accumulate.close()
        rows.append(row)
    write_record({"benchmark": "push_bandwidth", "workers": WORKERS, "threads": args.threads, "quick": args.quick,
                  "target_ratio": TARGET, "accumulate_targets": ACCUMULATE_TARGETS, "options": PROGRAMS,
                  "sizes": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

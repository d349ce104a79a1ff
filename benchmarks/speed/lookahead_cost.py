"""lookahead_cost: what the look-ahead adds to a server's work per push (the server loop is a hot path).

dc-asgd's and softsync's server programs, driven in this process on an in-memory shard (no MPI: only
the program's arithmetic is timed), 4 workers pushing in turn, with ``lookahead=True`` and ``False``
in alternating blocks so that drift hits both alike. Printed per size: the median microseconds per
push of each and their ratio (look-ahead over plain), with the spread of the per-block ratios.
torch runs single-threaded, as a server rank beside busy workers effectively does. ``--wire fp16``
gives the shard fp16 inbox and outbox slots, as ``compression=hvd.Compression.fp16`` does (the
gradients widened into fp32 for the arithmetic, the answers rounded to fp16).

    python benchmarks/speed/lookahead_cost.py
    python benchmarks/speed/lookahead_cost.py --sizes 1MB --blocks 3 --out /tmp/c.json
    python benchmarks/speed/lookahead_cost.py --wire fp16 --out /tmp/c16.json
"""
import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, ROOT, parse_size, spread, write_record

if ROOT not in sys.path:
    sys.path.append(ROOT)

from hvd_async.algorithms.dcasgd import DCASGDOptions, DCProgram  # noqa: E402
from hvd_async.algorithms.payload import SGDPayload  # noqa: E402
from hvd_async.algorithms.softsync import SoftSyncOptions, SoftSyncProgram  # noqa: E402
from hvd_async.transport import window as W  # noqa: E402
from hvd_async.transport.window.host import WidenedSlots  # noqa: E402

WORKERS = 4


class _Shard:
    """What a server program reads and calls on its shard host, in memory."""

    def __init__(self, numel: int, wire: str = "fp32"):
        self.spec = SimpleNamespace(workers=WORKERS, outbox=True)
        dtype = torch.float16 if wire == "fp16" else torch.float32
        self.weights = torch.randn(numel)
        self.inbox = [(torch.randn(numel) * 1e-3).to(dtype) for _ in range(WORKERS)]
        self.outbox = [torch.zeros(numel, dtype=dtype) for _ in range(WORKERS)]
        if wire == "fp16":  # as ShardHost: the programs read each gradient widened to fp32
            self.inbox = WidenedSlots(self.inbox)
        self.version, self.shard, self.skipped_nonfinite = 0, 0, 0

    def bump(self, staleness, pushes=1):
        self.version += 1

    def answer(self, worker, staleness, status):
        pass

    def add_sums(self, *values):
        pass


def make(algo: str, numel: int, lookahead: bool, wire: str = "fp32"):
    host = _Shard(numel, wire)
    if algo == "dc-asgd":
        return DCProgram(host, DCASGDOptions(lam=2.0, adaptive=True, ms_momentum=0.95, lookahead=lookahead,
                                             push_clip=0.0))
    return SoftSyncProgram(host, SoftSyncOptions(n=WORKERS, staleness_lr=False, server_momentum="per-worker",
                                                 push_rate="average", lookahead=lookahead))


def request(worker: int):
    """A push of ``worker``'s, its gradient in the worker's own inbox slot."""
    header = np.zeros(W.H_LEN, dtype=np.float64)
    W.encode_request(header, W.Kind.PUSH, SGDPayload(lr=0.1 / WORKERS, momentum=0.9).encode())
    return W.Request.decode(header, 0, worker)


def block(program, pushes: int) -> float:
    """Microseconds per push over ``pushes`` pushes, the workers in turn."""
    requests = [request(m) for m in range(WORKERS)]
    start = time.perf_counter()
    for i in range(pushes):
        program.on_request(i % WORKERS, requests[i % WORKERS])
    return 1e6 * (time.perf_counter() - start) / pushes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="1MB,4MB,16MB", help="comma-separated model sizes (fp32 bytes)")
    p.add_argument("--algos", default="dc-asgd,softsync", help="comma-separated")
    p.add_argument("--blocks", type=int, default=7, help="alternating blocks of each")
    p.add_argument("--pushes", type=int, default=40, help="pushes per block")
    p.add_argument("--wire", choices=("fp32", "fp16"), default="fp32",
                   help="the inbox and outbox slots' format (fp16: as under fp16 compression)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "lookahead_cost.json"), help="JSON path")
    args = p.parse_args(argv)
    try:
        sizes = {size: parse_size(size) for size in args.sizes.split(",")}
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    torch.set_num_threads(1)
    rows = []
    for algo in args.algos.split(","):
        for size, size_bytes in sizes.items():
            numel = size_bytes // 4
            programs = {flag: make(algo, numel, flag, args.wire) for flag in (False, True)}
            for program in programs.values():
                block(program, 2 * WORKERS)  # warm: every worker's buffers exist
            times = {False: [], True: []}
            for _ in range(args.blocks):
                for flag in (False, True):
                    times[flag].append(block(programs[flag], args.pushes))
            ratios = [a / b for a, b in zip(times[True], times[False])]
            row = {"algo": algo, "bytes": numel * 4, "plain_us_per_push": statistics.median(times[False]),
                   "lookahead_us_per_push": statistics.median(times[True]), "ratio": statistics.median(ratios),
                   "ratio_per_block": spread(ratios)}
            rows.append(row)
            print(f"{algo:9s} {size:>5s}: plain {row['plain_us_per_push']:9.0f} us/push  look-ahead "
                  f"{row['lookahead_us_per_push']:9.0f} us/push  ratio {row['ratio']:.3f} "
                  f"[{row['ratio_per_block']['min']:.3f}-{row['ratio_per_block']['max']:.3f}]", flush=True)
    write_record({"benchmark": "lookahead_cost", "wire": args.wire, "workers": WORKERS, "blocks": args.blocks,
                  "pushes": args.pushes, "torch_threads": 1, "rows": rows}, args.out)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

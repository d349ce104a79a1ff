"""rma_bandwidth: push + pull of a parameter buffer through hvd_async's window transport against raw
mpi4py ``Accumulate`` + ``Get`` of the same bytes, in the same MPI job.

One server rank and ``--np - 1`` workers. Before serving, every rank creates one raw window per
size on the server (as ENVIRONMENT.md's raw table: shared lock held, ``Accumulate(SUM)`` then
``Get``, each completed by ``Flush``); then the server runs :func:`hvd_async.serve`, whose loop keeps
MPI progressing for both kinds of windows alike (one call into MPI every ``--poll-us``). For each
size the workers open an asgd transport (``accumulate`` of a delta, which also bumps the shard's
version and staleness counters, then ``pull``) and alternate blocks of raw and transport round
trips, so drift hits both alike. Printed per size: median round trip of each, and the ratio raw
time / transport time (1.0: no overhead; target >= 0.95 from 1 MB up, issue 19), with the spread of the
per-block ratios (each raw block over the transport block beside it, every worker's). Writes JSON
and a plot to benchmarks/results/.

    python benchmarks/speed/rma_bandwidth.py --mode shm      # one node, windows in shared memory
    python benchmarks/speed/rma_bandwidth.py --mode no-shm   # one node, TCP only (how nodes talk)
    python benchmarks/speed/rma_bandwidth.py --mode netns    # 3 hosts of ../shared/tools/netns-cluster
    python benchmarks/speed/rma_bandwidth.py --quick --out /tmp/r.json  # bench_check's form (~15 s)
    python benchmarks/speed/rma_bandwidth.py --mode no-shm --atomic-reads  # what an accumulate-family read costs
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, MODES, MODES_HELP, apply_quick, mpi_main, parse_size, quick_help, save, spread

SIZES = ["1KB", "16KB", "256KB", "1MB", "4MB", "16MB", "64MB"]
QUICK = {"sizes": "1KB,1MB,4MB", "seconds": 0.1}  # --quick: the sizes the targets name, shorter blocks


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="shm", help=MODES_HELP)
    p.add_argument("--np", type=int, default=3, help="MPI ranks: 1 server + np-1 workers")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated buffer sizes")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks (raw, ours) per size")
    p.add_argument("--seconds", type=float, default=0.25, help="target time of one block")
    p.add_argument("--poll-us", type=float, default=100.0,
                   help="the server's sleep between MPI progress calls, microseconds")
    p.add_argument("--atomic-reads", action="store_true",
                   help="also time a third kind of block, raw Accumulate + Get_accumulate(NO_OP) (the read MPI "
                        "defines beside concurrent accumulates), and report its time over raw Get's per size "
                        "(default --out: results/rma_atomic_reads_<mode>.json)")
    p.add_argument("--quick", action="store_true", help=quick_help(QUICK))
    p.add_argument("--out", default=None, help="JSON path (default: results/rma_bandwidth_<mode>.json)")
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    try:
        args.size_bytes = [parse_size(s) for s in args.sizes.split(",")]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.np < 2:
        p.error(f"--np must be >= 2 (one server and at least one worker), got {args.np}")
    if args.blocks < 1 or not args.seconds > 0:
        p.error("--blocks must be >= 1 and --seconds > 0")
    name = "rma_atomic_reads" if args.atomic_reads else "rma_bandwidth"
    args.out = args.out or os.path.join(HERE, "results", f"{name}_{args.mode}.json")
    return args


def bench(args) -> int:
    import numpy as np
    import torch
    from mpi4py import MPI

    import hvd_async as ha
    from hvd_async.transport.window import WindowTransport

    ha.init(servers=1)
    world = MPI.COMM_WORLD
    server = ha.is_server()
    raw = {}
    for size in args.size_bytes:  # collective over every rank; the server holds the memory
        raw[size] = MPI.Win.Allocate(size if server else 0, 4, comm=world)
    if server:
        # One progress policy for both kinds of windows: the loop only sees the transport's activity
        # (it would spin for ours and sleep through raw blocks), so here it never spins and calls
        # into MPI every --poll-us. (Spinning measured worse on 2 cores: it starves the workers and
        # the TCP stack.)
        ha.serve(poll_interval=args.poll_us * 1e-6, spin_seconds=0.0)
        for win in raw.values():
            win.Free()
        return 0

    workers = ha.worker_comm()
    rows = []
    for size in args.size_bytes:
        n = size // 4
        win = raw[size]
        win.Lock_all()
        buf, out = np.full(n, 1e-6, dtype=np.float32), np.empty(n, dtype=np.float32)
        no_op = [np.empty(0, dtype=np.float32), MPI.FLOAT]  # NO_OP ignores it; mpi4py wants one
        delta, flat = torch.full((n,), 1e-6), torch.zeros(n)
        transport = WindowTransport(n, comms=ha.runtime.comms(), algorithm="asgd", mode="accumulate")
        transport.publish_(flat)

        def raw_round():
            win.Accumulate([buf, MPI.FLOAT], 0, target=(0, n, MPI.FLOAT), op=MPI.SUM)
            win.Flush(0)
            win.Get([out, MPI.FLOAT], 0, target=(0, n, MPI.FLOAT))
            win.Flush(0)

        def atomic_round():  # the same, read with the accumulate-family read
            win.Accumulate([buf, MPI.FLOAT], 0, target=(0, n, MPI.FLOAT), op=MPI.SUM)
            win.Flush(0)
            win.Get_accumulate(no_op, [out, MPI.FLOAT], 0, target=(0, n, MPI.FLOAT), op=MPI.NO_OP)
            win.Flush(0)

        def our_round():  # what asgd's step does (accumulate(delta), then pull(flat, after_push=True))
            transport.accumulate_and_pull(delta, flat)

        for _ in range(3):  # warm up (first touches of the buffers), then size the blocks
            raw_round()
            our_round()
        t0 = time.perf_counter()
        for _ in range(3):
            raw_round()
            our_round()
        reps = max(5, min(5000, int(args.seconds / max(1e-6, (time.perf_counter() - t0) / 6))))
        reps = workers.allreduce(reps, op=MPI.MIN)
        rounds = {"raw": raw_round, "ours": our_round}
        if args.atomic_reads:
            rounds["atomic"] = atomic_round
        times = {kind: [] for kind in rounds}
        for block in range(args.blocks):
            kinds = list(rounds)
            for kind in (kinds if block % 2 == 0 else kinds[::-1]):
                fn = rounds[kind]
                workers.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[kind].append((time.perf_counter() - start) / reps)
        transport.close()
        win.Unlock_all()
        everyone = workers.gather(times, root=0)
        if ha.rank() == 0:
            rows.append(size_row(size, reps, everyone))
    ha.shutdown()
    for win in raw.values():
        win.Free()
    if ha.rank() == 0:
        big = [r["ratio"] for r in rows if r["bytes"] >= 1024 ** 2]
        summary = {"benchmark": "rma_bandwidth", "quick": args.quick, "mode": args.mode, "np": world.size,
                   "workers": workers.size, "servers": 1, "blocks": args.blocks, "seconds_per_block": args.seconds,
                   "poll_us": args.poll_us, "target": 0.95, "atomic_reads": args.atomic_reads,
                   "min_ratio_from_1MB": min(big) if big else None, "rows": rows}
        print(f"mode {args.mode}, {workers.size} workers + 1 server: ratio raw/ours from 1 MB up: "
              f"min {summary['min_ratio_from_1MB']:.3f}; target >= 0.95" if big else "no size >= 1 MB",
              flush=True)
        save(summary, args.out, plot)
    return 0


def size_row(size: int, reps: int, everyone) -> dict:
    """One size's figures from every worker's block times (``{"raw": [...], "ours": [...]}``): the
    median over workers of each worker's median, their ratio, and the spread of the block ratios."""
    raw_s = statistics.median(statistics.median(e["raw"]) for e in everyone)
    our_s = statistics.median(statistics.median(e["ours"]) for e in everyone)
    s = spread(r / o for e in everyone for r, o in zip(e["raw"], e["ours"]))
    row = {"bytes": size, "reps_per_block": reps, "raw_seconds": raw_s, "ours_seconds": our_s,
           "raw_GBps": size * 2 / raw_s / 1e9, "ours_GBps": size * 2 / our_s / 1e9, "ratio": raw_s / our_s,
           "ratio_min": s["min"], "ratio_q1": s["q1"], "ratio_q3": s["q3"], "ratio_max": s["max"],
           "ratio_blocks": s["n"], "raw_seconds_blocks": [e["raw"] for e in everyone],
           "ours_seconds_blocks": [e["ours"] for e in everyone]}
    print(f"{_fmt(size):>6}: raw {raw_s * 1e6:10.1f} us  ours {our_s * 1e6:10.1f} us  ratio {row['ratio']:.3f} "
          f"(blocks {s['min']:.3f}..{s['max']:.3f}, IQR {s['q1']:.3f}..{s['q3']:.3f})  "
          f"({row['ours_GBps']:.2f} GB/s push+pull per worker)", flush=True)
    if "atomic" in everyone[0]:  # --atomic-reads: raw Get_accumulate's time over raw Get's
        atomic_s = statistics.median(statistics.median(e["atomic"]) for e in everyone)
        a = spread(t / r for e in everyone for t, r in zip(e["atomic"], e["raw"]))
        row.update({"atomic_seconds": atomic_s, "atomic_over_raw": atomic_s / raw_s, "atomic_over_raw_min": a["min"],
                    "atomic_over_raw_max": a["max"], "atomic_seconds_blocks": [e["atomic"] for e in everyone]})
        print(f"        raw with Get_accumulate(NO_OP) {atomic_s * 1e6:10.1f} us: {atomic_s / raw_s:.3f} x raw Get's "
              f"(blocks {a['min']:.3f}..{a['max']:.3f})", flush=True)
    return row


def _fmt(size: int) -> str:
    return f"{size // 1024 ** 2}MB" if size >= 1024 ** 2 else f"{size // 1024}KB"


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    sizes = [r["bytes"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.loglog(sizes, [r["raw_GBps"] for r in rows], "o-", label="raw mpi4py Accumulate+Get")
    a.loglog(sizes, [r["ours_GBps"] for r in rows], "s-", label="hvd_async accumulate+pull")
    a.set_xlabel("bytes"), a.set_ylabel("GB/s per worker"), a.legend(fontsize=8)
    b.semilogx(sizes, [r["ratio"] for r in rows], "o-")
    b.axhline(summary["target"], color="r", ls="--", label="target 0.9 (from 1 MB)")
    b.set_xlabel("bytes"), b.set_ylabel("raw time / our time"), b.legend(fontsize=8)
    fig.suptitle(f"rma_bandwidth ({summary['mode']}, {summary['workers']} workers, 1 server)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    return mpi_main(__file__, parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())

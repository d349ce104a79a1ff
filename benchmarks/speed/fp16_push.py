"""fp16_push: a dc-asgd push (gradient up, new weights back) through the windows with fp32 on the wire
against fp16 (``compression=hvd.Compression.fp16``), in the same MPI job.

One server rank and ``--np - 1`` workers. For each size both transports are open side by side (the
same server program, the same SGD step on fp32 weights); every worker alternates blocks of fp32 and
fp16 pushes, so drift hits both alike. Printed per size: the median push time of each and the ratio
fp16 time / fp32 time (0.5 would be the bytes alone; the server's step and the conversions do not
halve), with the spread of the per-block ratios. Beside it, the worker's check before a push (a
strategy skips a push its gradient cannot make: fp32 ``all_finite``, fp16 ``finite_in_fp16``, which
also refuses what rounds to infinity in fp16), timed in alternating blocks too. Writes JSON and a
plot to benchmarks/results/.

    python benchmarks/speed/fp16_push.py --mode shm      # one node, windows in shared memory
    python benchmarks/speed/fp16_push.py --mode no-shm   # one node, TCP only (how nodes talk)
    python benchmarks/speed/fp16_push.py --mode netns    # 3 hosts of ../shared/tools/netns-cluster: bytes cost
    python benchmarks/speed/fp16_push.py --mode netns --link-mbit 1000   # their links as 1 Gbit/s Ethernet
    python benchmarks/speed/fp16_push.py --mode netns --slots 1 --link-mbit 1000   # every rank on a host of its own

``--poll-us`` / ``--spin-ms`` / ``--spin-yield`` set the server's progress policy (``ha.serve``'s
``poll_interval``, ``spin_seconds`` and ``spin_yield``); the default is ``ha.serve()``'s own.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import (HERE, MODES, MODES_HELP, SPIN_YIELD, add_slots, add_spin_yield, dc_pushes, launch_mode,
                    parse_size, pyplot, save, spread, under_mpirun, use_slots)

SIZES = ["1MB", "4MB", "16MB"]
CHECK_REPS = 20  # checks per timed block


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="shm", help=MODES_HELP)
    p.add_argument("--np", type=int, default=3, help="MPI ranks: 1 server + np-1 workers")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated fp32 buffer sizes")
    p.add_argument("--blocks", type=int, default=8, help="alternating blocks (fp32, fp16) per size")
    p.add_argument("--seconds", type=float, default=0.3, help="target time of one block")
    p.add_argument("--poll-us", type=float, default=None,
                   help="the server's sleep per idle turn, microseconds (default: ha.serve()'s)")
    p.add_argument("--spin-ms", type=float, default=None,
                   help="how long the server turns without sleeping after a request, ms (default: ha.serve()'s)")
    add_spin_yield(p)
    add_slots(p)
    p.add_argument("--link-mbit", type=float, default=None,
                   help="--mode netns: limit each host's link to this many Mbit/s (tc tbf), as a slower network")
    p.add_argument("--out", default=None, help="JSON path (default: results/fp16_push_<mode>.json)")
    args = p.parse_args(argv)
    try:
        args.size_bytes = [parse_size(s) for s in args.sizes.split(",")]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.np < 2:
        p.error(f"--np must be >= 2 (one server and at least one worker), got {args.np}")
    if args.link_mbit is not None and not (args.mode == "netns" and args.link_mbit > 0):
        p.error(f"--link-mbit {args.link_mbit:g}: give a rate > 0, with --mode netns (the links it limits)")
    if args.slots < 1:
        p.error(f"--slots must be >= 1, got {args.slots}")
    if args.blocks < 1 or not args.seconds > 0:
        p.error(f"--blocks must be >= 1 and --seconds > 0, got {args.blocks} and {args.seconds}")
    args.out = args.out or os.path.join(HERE, "results", f"fp16_push_{args.mode}.json")
    return args


def bench(args) -> int:
    import hvd_async as ha
    from hvd_async.checks import all_finite, finite_in_fp16

    ha.init(servers=1)
    if ha.is_server():
        policy = {"poll_interval": None if args.poll_us is None else args.poll_us * 1e-6,
                  "spin_seconds": None if args.spin_ms is None else args.spin_ms * 1e-3,
                  "spin_yield": SPIN_YIELD[args.spin_yield]}
        ha.serve(**{k: v for k, v in policy.items() if v is not None})
        return 0
    workers = ha.worker_comm()
    rows = []
    for size in args.size_bytes:
        grad, out, header, transports = dc_pushes(size // 4)
        start = time.perf_counter()
        transports["fp32"].push(grad, out, header)
        reps = max(2, int(args.seconds / max(1e-6, time.perf_counter() - start)))
        times = {"fp32": [], "fp16": []}
        for block in range(args.blocks):
            for wire in (("fp32", "fp16") if block % 2 == 0 else ("fp16", "fp32")):
                start = time.perf_counter()
                for _ in range(reps):
                    transports[wire].push(grad, out, header)
                times[wire].append((time.perf_counter() - start) / reps)
        checks = {"check_fp32": lambda: all_finite([grad]), "check_fp16": lambda: finite_in_fp16(grad)}
        for block in range(args.blocks):
            for name in sorted(checks, reverse=block % 2 == 1):
                start = time.perf_counter()
                for _ in range(CHECK_REPS):
                    checks[name]()
                times.setdefault(name, []).append((time.perf_counter() - start) / CHECK_REPS)
        workers.Barrier()
        for t in transports.values():
            t.close()
        everyone = workers.gather(times, root=0)
        if ha.rank() == 0:
            rows.append(size_row(size, reps, everyone))
            r = rows[-1]
            check = r["worker_check_us"]
            print(f"{_fmt(size):>6}: fp32 {r['fp32_us_median']:9.1f} us  fp16 "
                  f"{r['fp16_us_median']:9.1f} us  fp16/fp32 {r['ratio_median']:.3f} "
                  f"(blocks {r['ratio']['min']:.3f}..{r['ratio']['max']:.3f});  worker's check fp32 "
                  f"{check['fp32 all_finite']['median']:.0f} us, fp16 {check['fp16 finite_in_fp16']['median']:.0f} us "
                  f"({r['check_fp16_over_push_fp16']:.1%} of an fp16 push)", flush=True)
    if ha.rank() == 0:
        summary = {"benchmark": "fp16_push", "mode": args.mode, "np": workers.size + 1, "algorithm": "dc-asgd",
                   "target": "fp16/fp32 <= 0.55 from 4 MB up (issue 19)", "server_poll_us": args.poll_us,
                   "server_spin_ms": args.spin_ms, "server_spin_yield": args.spin_yield,
                   "link_mbit": args.link_mbit, "slots_per_host": args.slots if args.mode == "netns" else None,
                   "rows": rows}
        save(summary, args.out, plot)
    return 0


def size_row(size: int, reps: int, everyone) -> dict:
    """One size's figures over every worker's blocks (ratio: each fp16 block over the fp32 one beside it)."""
    fp32 = [t for times in everyone for t in times["fp32"]]
    fp16 = [t for times in everyone for t in times["fp16"]]
    ratios = [b / a for times in everyone for a, b in zip(times["fp32"], times["fp16"])]
    checks = {name: [1e6 * t for times in everyone for t in times[name]] for name in ("check_fp32", "check_fp16")}
    return {"bytes_fp32": size, "bytes_fp16": size // 2, "pushes_per_block": reps,
            "fp32_us_median": 1e6 * statistics.median(fp32), "fp16_us_median": 1e6 * statistics.median(fp16),
            "ratio_median": statistics.median(ratios), "ratio": spread(ratios),
            "worker_check_us": {"fp32 all_finite": spread(checks["check_fp32"]),
                                "fp16 finite_in_fp16": spread(checks["check_fp16"])},
            "check_fp16_over_push_fp16": statistics.median(checks["check_fp16"]) / (1e6 * statistics.median(fp16))}


def _fmt(size: int) -> str:
    return f"{size // 1024 ** 2}MB" if size >= 1024 ** 2 else f"{size // 1024}KB"


def plot(summary, path):
    plt = pyplot()
    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [_fmt(r["bytes_fp32"]) for r in rows]
    ax.plot(xs, [r["ratio_median"] for r in rows], "o-", label="fp16 / fp32 push time (median)")
    ax.fill_between(xs, [r["ratio"]["min"] for r in rows], [r["ratio"]["max"] for r in rows], alpha=0.2)
    ax.axhline(0.55, color="r", ls="--", label="target 0.55 (from 4 MB)")
    ax.axhline(0.5, color="grey", ls=":", label="bytes alone")
    ax.set_xlabel("gradient size (fp32)"), ax.set_ylabel("time ratio"), ax.legend(fontsize=8)
    link = f", links {summary['link_mbit']:g} Mbit/s" if summary.get("link_mbit") else ""
    fig.suptitle(f"dc-asgd push, fp16 against fp32 on the wire ({summary['mode']}{link})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not under_mpirun():
        use_slots(args)
        return launch_mode(__file__, args.np, args.mode, link_mbit=args.link_mbit)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

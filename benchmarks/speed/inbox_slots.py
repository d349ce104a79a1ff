"""inbox_slots: what a pool of inbox slots smaller than the workers costs a push, against one slot per
worker, in the same MPI job.

One server rank and ``--np - 1`` workers, every worker pushing dc-asgd gradients (plain SGD on the
server, no compensation) as fast as it can, so that the pushes queue at the server and fight over
the slots. For each size two transports are open side by side: one slot per worker (``slots=0``)
and a pool of ``--inbox-slots``; every worker alternates blocks of each, so drift hits both alike.
Printed per size: the median push time of each, the ratio pool / own slots with the spread of the
per-block ratios, and how many pushes found every slot taken. Writes JSON to benchmarks/results/.

    python benchmarks/speed/inbox_slots.py --mode shm --np 5 --inbox-slots 1
    python benchmarks/speed/inbox_slots.py --mode no-shm --np 5 --inbox-slots 2
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, MODES, MODES_HELP, launch_mode, parse_size, spread, under_mpirun, write_record

SIZES = ["1MB", "4MB"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=[m for m in MODES if m != "netns"], default="shm", help=MODES_HELP)
    p.add_argument("--np", type=int, default=5, help="MPI ranks: 1 server + np-1 workers")
    p.add_argument("--inbox-slots", type=int, default=1, help="slots of the pool (fewer than the workers)")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated fp32 buffer sizes")
    p.add_argument("--blocks", type=int, default=8, help="alternating blocks (own slots, pool) per size")
    p.add_argument("--pushes", type=int, default=10, help="pushes per block")
    p.add_argument("--out", default=None, help="JSON path (default: results/inbox_slots_<mode>.json)")
    args = p.parse_args(argv)
    try:
        args.size_bytes = [parse_size(s) for s in args.sizes.split(",")]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.np < 3 or not 1 <= args.inbox_slots < args.np - 1:
        p.error(f"need --np >= 3 and 1 <= --inbox-slots < the workers (np - 1), got --np {args.np} "
                f"--inbox-slots {args.inbox_slots}")
    if args.blocks < 1 or args.pushes < 1:
        p.error(f"--blocks and --pushes must be >= 1, got {args.blocks} and {args.pushes}")
    args.out = args.out or os.path.join(HERE, "results", f"inbox_slots_{args.mode}.json")
    return args


def bench(args) -> int:
    import torch

    import hvd_async as ha
    from hvd_async.algorithms.payload import SGDPayload
    from hvd_async.transport import window as W

    ha.init(servers=1)
    if ha.is_server():
        ha.serve()
        return 0
    workers = ha.worker_comm()
    options = {"lam": 0.0, "adaptive": False, "ms_momentum": 0.95, "lookahead": False, "push_clip": 0.0}
    header = SGDPayload(lr=1e-3).encode()
    rows = []
    for size in args.size_bytes:
        numel = size // 4
        grad, out = torch.full((numel,), 1e-3), torch.zeros(numel)
        transports = {}
        for name, slots in (("own", 0), ("pool", args.inbox_slots)):
            t = transports[name] = W.WindowTransport(numel, comms=ha.runtime.comms(), algorithm="dc-asgd",
                                                     mode="mailbox", options=options, slots=slots)
            t.publish_(out)
            t.push(grad, out, header)  # warm
        times = {"own": [], "pool": []}
        for block in range(args.blocks):
            for name in (("own", "pool") if block % 2 == 0 else ("pool", "own")):
                workers.Barrier()  # every worker pushes in the same block: the pool is fought over
                start = time.perf_counter()
                for _ in range(args.pushes):
                    transports[name].push(grad, out, header)
                times[name].append((time.perf_counter() - start) / args.pushes)
        waits = workers.allreduce(transports["pool"].slot_waits)
        workers.Barrier()
        for t in transports.values():
            t.close()
        everyone = workers.gather(times, root=0)
        if ha.rank() == 0:
            own = [t for times in everyone for t in times["own"]]
            pool = [t for times in everyone for t in times["pool"]]
            ratios = [b / a for times in everyone for a, b in zip(times["own"], times["pool"])]
            rows.append({"bytes": size, "pushes_per_block": args.pushes,
                         "own_us_median": 1e6 * statistics.median(own),
                         "pool_us_median": 1e6 * statistics.median(pool),
                         "ratio_median": statistics.median(ratios), "ratio": spread(ratios),
                         "pool_pushes": workers.size * args.pushes * (args.blocks + 1),
                         "pool_pushes_that_waited": waits})
            r = rows[-1]
            print(f"{size // 1024:>6} KB: own slots {r['own_us_median']:9.1f} us  pool of {args.inbox_slots} "
                  f"{r['pool_us_median']:9.1f} us  pool/own {r['ratio_median']:.3f} "
                  f"(blocks {r['ratio']['min']:.3f}..{r['ratio']['max']:.3f}); {waits} of {r['pool_pushes']} "
                  f"pool pushes waited for a slot", flush=True)
    if ha.rank() == 0:
        write_record({"benchmark": "inbox_slots", "mode": args.mode, "np": workers.size + 1,
                      "workers": workers.size, "inbox_slots": args.inbox_slots, "algorithm": "dc-asgd",
                      "rows": rows}, args.out)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    ARGS = parse_args()
    sys.exit(bench(ARGS) if under_mpirun() else launch_mode(__file__, ARGS.np, ARGS.mode))

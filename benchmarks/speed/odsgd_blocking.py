"""odsgd_blocking: how much of od-sgd's exchange a step hides behind compute, for both exchanges.

One server rank (the window exchange's) and ``--np - 1`` workers, a 32 MB model. For each exchange,
first the exchange's own time: with no compute between steps, what a step blocks for (the window
exchange is also timed on its comm thread, and the larger is taken). Then ``--compute-factor`` times
that as compute (a sleep, which leaves the cores to the exchange) between steps, and what a step
blocks for then. Printed per exchange: both times, means over the workers of medians over steps,
and their ratio (blocked behind compute over the exchange's own: 0 is fully hidden, 1 not at all),
with each repeat's ratio. The target is a ratio under 0.5.

    python benchmarks/speed/odsgd_blocking.py                 # 4 ranks, windows in shared memory
    python benchmarks/speed/odsgd_blocking.py --mode no-shm --repeats 5
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, MODES, MODES_HELP, ROOT, mpi_main, spread, write_record

if ROOT not in sys.path:
    sys.path.append(ROOT)

NUMEL = 1 << 23  # 32 MB of float32: an exchange whose time can be measured
TARGET = 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="shm", help=MODES_HELP)
    p.add_argument("--np", type=int, default=4, help="MPI ranks: 1 server + np-1 workers")
    p.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements behind compute, per exchange")
    p.add_argument("--compute-factor", type=float, default=5.0,
                   help="compute between steps, in multiples of the exchange's own time")
    p.add_argument("--out", default=os.path.join(HERE, "results", "odsgd_blocking.json"), help="JSON path")
    args = p.parse_args(argv)
    if args.np < 2 or args.steps < 1 or args.repeats < 1 or args.compute_factor <= 0:
        p.error(f"--np must be at least 2, --steps and --repeats at least 1 and --compute-factor above 0; "
                f"got {args.np}, {args.steps}, {args.repeats}, {args.compute_factor}")
    return args


def blocked_per_step(exchange: str, compute_s: float, steps: int):
    """(median seconds a step waited for the exchange in flight, median seconds the exchange took on
    its comm thread: window exchange only, None for the allreduce, which Horovod's thread runs)."""
    import torch

    import hvd_async as ha

    w = torch.nn.Parameter(torch.zeros(NUMEL))
    opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=0.01), [("w", w)], algorithm="od-sgd",
                                  exchange=exchange)
    own = []
    if exchange == "window":
        side = opt.strategy.exchange
        untimed = side._exchange

        def timed(header):
            began = time.perf_counter()
            answers = untimed(header)
            own.append(time.perf_counter() - began)
            return answers

        side._exchange = timed
    w.grad = torch.full_like(w, 1e-3)
    opt.step()  # begins the exchange; this step had nothing in flight to wait for
    waits = []
    for _ in range(steps):
        time.sleep(compute_s)
        before = opt.stats()["exchange_wait_seconds"]
        opt.step()
        waits.append(opt.stats()["exchange_wait_seconds"] - before)
    opt.load_global_model()
    opt.close()
    return statistics.median(waits), (statistics.median(own) if own else None)


def bench(args) -> int:
    from mpi4py import MPI

    import hvd_async as ha
    from hvd_async.job.job_process import exit_process

    ha.init(servers=1)
    if ha.is_server():
        ha.serve()
        exit_process(0)
    comm = ha.worker_comm()
    rows = []
    for exchange in ("window", "allreduce"):
        bare, own = blocked_per_step(exchange, 0.0, args.steps)
        own = comm.allreduce(max(bare, own or 0.0)) / comm.size
        # one compute time for every worker: one that computed less would wait in the allreduce for the
        # others' longer compute, not for the exchange
        compute = args.compute_factor * comm.allreduce(own, op=MPI.MAX)
        ratios, hidden_all = [], []
        for _ in range(args.repeats):
            hidden, _ = blocked_per_step(exchange, compute, args.steps)
            hidden = comm.allreduce(hidden) / comm.size
            hidden_all.append(hidden)
            ratios.append(hidden / own)
        row = {"exchange": exchange, "own_ms": 1e3 * own, "compute_ms": 1e3 * compute,
               "blocked_ms": [1e3 * h for h in hidden_all], "ratio_median": statistics.median(ratios),
               "ratio": spread(ratios)}
        rows.append(row)
        if ha.rank() == 0:
            print(f"{exchange:9s}: exchange {row['own_ms']:7.2f} ms; behind {row['compute_ms']:.0f} ms of compute "
                  f"a step blocked {statistics.median(row['blocked_ms']):7.2f} ms; ratio {row['ratio_median']:.3f} "
                  f"[{row['ratio']['min']:.3f}-{row['ratio']['max']:.3f}] (target < {TARGET})", flush=True)
    if ha.rank() == 0:
        write_record({"benchmark": "odsgd_blocking", "mode": args.mode, "np": args.np, "numel": NUMEL,
              "steps": args.steps, "repeats": args.repeats, "compute_factor": args.compute_factor,
              "target": f"blocked behind compute / the exchange's own time < {TARGET}", "rows": rows}, args.out)
        print(f"written {args.out}")
    ha.shutdown()
    exit_process(0)


def main(argv=None) -> int:
    return mpi_main(__file__, parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())

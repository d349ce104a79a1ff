"""shard_bandwidth: push + pull throughput of the workers together with 1, 2 and 4 server shards
(``--servers``), the same buffer split across the shards.

One MPI job per shard count: ``--workers`` workers and K server ranks (``hvd_async.init(servers=K)``,
the servers' default loop). Every worker opens an asgd transport of ``--size`` bytes (each shard
holds 1/K of it) and runs blocks of round trips (``accumulate`` of a delta, then ``pull``: what an
asgd step sends and receives), all workers at once, each block started at a barrier. A block's
throughput is the bytes the workers moved together (2 x size per round trip per worker) over the
slowest worker's time. Beside each figure, the share of the machine's CPU time that was busy during
the blocks (from /proc/stat): near 100%, the cores, not the shards, set the limit, and the line
says so. Writes JSON and a plot to benchmarks/results/.

    python benchmarks/speed/shard_bandwidth.py                  # 4 workers, 64 MB, 1/2/4 shards, shared memory
    python benchmarks/speed/shard_bandwidth.py --mode no-shm    # the same over TCP only (how nodes talk)
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, NO_SHM_MPI_ARGS, ROOT, parse_size, program, pyplot, save, spread, under_mpirun

CPU_BOUND = 0.9  # busy share of the machine's CPU time from which the cores are named the limit
GROWS = 1.1  # a shard count "adds bandwidth" from this times the first's median (and blocks apart: limit())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=("shm", "no-shm"), default="shm",
                   help="shm: windows in shared memory; no-shm: TCP only")
    p.add_argument("--workers", type=int, default=4, help="worker ranks (every job has these plus K servers)")
    p.add_argument("--servers", default="1,2,4", help="comma-separated shard counts, one job each")
    p.add_argument("--size", type=parse_size, default="64MB", help="the buffer each worker pushes and pulls")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per shard count")
    p.add_argument("--seconds", type=float, default=1.0, help="target time of one block")
    p.add_argument("--out", default=None, help="JSON path (default: results/shard_bandwidth_<mode>.json)")
    p.add_argument("--part-out", default=None, help=argparse.SUPPRESS)  # (a job's result file, set by the launcher)
    args = p.parse_args(argv)
    try:
        args.server_counts = [int(k) for k in args.servers.split(",")]
    except ValueError:
        p.error(f"--servers must be comma-separated integers such as 1,2,4, got {args.servers!r}")
    if min(args.server_counts) < 1 or args.workers < 1:
        p.error(f"--servers and --workers need counts of at least 1, got --servers {args.servers} "
                f"--workers {args.workers}")
    if args.blocks < 1 or not args.seconds > 0:
        p.error("--blocks must be >= 1 and --seconds > 0")
    args.out = args.out or os.path.join(HERE, "results", f"shard_bandwidth_{args.mode}.json")
    return args


def cpu_counters():
    """(busy, total) jiffies of the whole machine from /proc/stat; (0, 0) where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def launch(args) -> int:
    """One mpirun per shard count; gather the jobs' results, print the table, write the record."""
    sys.path.insert(0, ROOT)
    from hvd_async.job.launcher import mpirun_command, run

    mpi_args = NO_SHM_MPI_ARGS if args.mode == "no-shm" else ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.server_counts:
            part = os.path.join(tmp, f"k{k}.json")
            np = args.workers + k
            print(f"== {k} server shard(s): {np} ranks on {cores} cores", flush=True)
            code = run(mpirun_command(np, program(__file__) + ["--part-out", part, "--servers", str(k)],
                                      mpi_args=mpi_args)).code
            if code != 0:
                print(f"shard_bandwidth: error: the job with {k} shard(s) failed (exit status {code})",
                      file=sys.stderr)
                return code
            with open(part) as f:
                rows.append(shard_row(json.load(f), args, cores))
    one = rows[0]["GBps"]["median"]
    for row in rows:
        row["over_first"] = row["GBps"]["median"] / one
        row["limit"] = limit(row, rows[0])
        print(f"{row['servers']} shard(s): {row['GBps']['median']:.2f} GB/s (blocks {row['GBps']['min']:.2f}.."
              f"{row['GBps']['max']:.2f}), {row['over_first']:.2f} x {rows[0]['servers']} shard(s); CPU busy "
              f"{100 * row['cpu_busy']:.0f}%; limit: {row['limit']}", flush=True)
    summary = {"benchmark": "shard_bandwidth", "mode": args.mode, "workers": args.workers, "bytes": args.size,
               "blocks": args.blocks, "seconds_per_block": args.seconds, "cores": cores,
               "cpu_bound_from": CPU_BOUND, "grows_from": GROWS,
               "target": "push+pull throughput grows with the shards where the cores allow (issue 19)",
               "rows": rows}
    save(summary, args.out, plot)
    return 0


def shard_row(part: dict, args, cores: int) -> dict:
    """One shard count's figures from its job's block times (``part``: per block, each worker's time)."""
    moved = 2 * args.size * args.workers * part["reps"]  # bytes moved by all workers in one block
    per_block = [moved / max(times) / 1e9 for times in part["blocks"]]
    return {"servers": part["servers"], "ranks": args.workers + part["servers"], "cores": cores,
            "reps_per_block": part["reps"],
            "GBps": spread(per_block), "GBps_blocks": per_block, "cpu_busy": part["cpu_busy"],
            "block_seconds": part["blocks"]}


def limit(row: dict, first: dict) -> str:
    """What the figures say of this shard count against the first: whether it adds bandwidth (its
    median GROWS times the first's, and its blocks' interquartile range above the first's) and what
    limits it."""
    busy = row["cpu_busy"] >= CPU_BOUND
    cores = f"the cores are all busy ({row['ranks']} ranks on {row['cores']})"
    if row is first:
        return cores if busy else "the reference"
    if row["over_first"] >= GROWS and row["GBps"]["q1"] > first["GBps"]["q3"]:
        return "adds bandwidth" + (f"; {cores}, which caps what more shards can add" if busy else "")
    if busy:
        return f"adds no bandwidth beyond the spread: {cores}, so another server only takes CPU time from the workers"
    return "adds no bandwidth beyond the spread, with cores to spare: the memory or network path is the limit"


def bench(args) -> int:
    import torch
    from mpi4py import MPI

    import hvd_async as ha
    from hvd_async.job.job_process import exit_process
    from hvd_async.transport.window import WindowTransport

    servers = args.server_counts[0]
    ha.init(servers=servers)
    if ha.is_server():
        ha.serve()
        exit_process(0)
    workers = ha.worker_comm()
    n = args.size // 4
    delta, flat = torch.full((n,), 1e-6), torch.zeros(n)
    transport = WindowTransport(n, comms=ha.runtime.comms(), algorithm="asgd", mode="accumulate")
    transport.publish_(flat)

    def round_trip():  # what asgd's step does
        transport.accumulate_and_pull(delta, flat)  # accumulate(delta), then pull(flat, after_push=True)

    for _ in range(2):  # first touches of the buffers
        round_trip()
    workers.Barrier()
    t0 = time.perf_counter()
    for _ in range(2):
        round_trip()
    reps = workers.allreduce(max(1, int(args.seconds / max(1e-6, (time.perf_counter() - t0) / 2))), op=MPI.MIN)
    blocks = []
    busy0, total0 = cpu_counters()
    for _ in range(args.blocks):
        workers.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            round_trip()
        blocks.append(workers.allgather(time.perf_counter() - start))
    busy1, total1 = cpu_counters()
    transport.close()
    ha.shutdown()
    if ha.rank() == 0:
        with open(args.part_out, "w") as f:
            json.dump({"servers": servers, "reps": reps, "blocks": blocks,
                       "cpu_busy": (busy1 - busy0) / max(1, total1 - total0)}, f)
    exit_process(0)


def plot(summary, path):
    plt = pyplot()
    rows = summary["rows"]
    ks = [r["servers"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar(ks, [r["GBps"]["median"] for r in rows],
                yerr=[[r["GBps"]["median"] - r["GBps"]["min"] for r in rows],
                      [r["GBps"]["max"] - r["GBps"]["median"] for r in rows]], fmt="o-", capsize=3)
    for r in rows:
        ax.annotate(f"CPU {100 * r['cpu_busy']:.0f}%", (r["servers"], r["GBps"]["median"]), fontsize=8,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xticks(ks)
    ax.set_xlabel("server shards"), ax.set_ylabel("GB/s, all workers' push+pull")
    ax.set_title(f"{summary['workers']} workers, {summary['bytes'] // 1024 ** 2} MB each ({summary['mode']}, "
                 f"{summary['cores']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not under_mpirun():
        return launch(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

"""answer_reads: how often a mailbox worker's wait for its answer's weights never ends, across the
ranks of separate hosts (shared memory off: Open MPI's UCX one-sided component over TCP).

Runs ``tests/mpi/answer_read_job.py`` (2 servers, ``--workers`` workers, ``--rounds`` rounds of 1 to 3
pushes and a ``load_global_model()``) ``--runs`` times per algorithm, each under mpirun in its own process
group, and counts the runs in which a worker made no progress for ``--stall`` seconds (the job
prints where each worker was, and ends). ``--package-root`` tests the package of another checkout
(the record names its commit), for a before/after of a change.

    python benchmarks/faults/answer_reads.py --runs 20 --out benchmarks/results/answer_reads/after.json
    python benchmarks/faults/answer_reads.py --package-root /tmp/base --out benchmarks/results/answer_reads/before.json
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
import common  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import _run_job  # noqa: E402  (a job in its own process group, under mpirun)

JOB = os.path.join(common.ROOT, "tests", "mpi", "answer_read_job.py")
SERVERS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algos", default="softsync,dc-asgd", help="comma-separated mailbox algorithms, run in turn")
    p.add_argument("--runs", type=int, default=10, help="runs of each algorithm")
    p.add_argument("--rounds", type=int, default=3000, help="rounds of pushes and a snapshot per run")
    p.add_argument("--workers", type=int, default=3, help="worker ranks (besides the 2 servers)")
    p.add_argument("--stall", type=float, default=15.0, help="seconds without progress that count as a stall")
    p.add_argument("--package-root", default="", help="the checkout whose hvd_async is tested (default: this one)")
    p.add_argument("--out", default=os.path.join(common.HERE, "results", "answer_reads.json"), help="JSON record")
    args = p.parse_args(argv)
    if args.runs < 1 or args.rounds < 1 or args.workers < 1 or args.stall <= 0:
        p.error(f"--runs, --rounds and --workers must be >= 1 and --stall > 0, got {args.runs}, {args.rounds}, "
                f"{args.workers}, {args.stall}")
    args.algos = [a for a in args.algos.split(",") if a]
    args.package_root = os.path.abspath(args.package_root) if args.package_root else common.ROOT
    return args


def run_once(algo: str, args) -> dict:
    env = {"ALGO": algo, "ROUNDS": str(args.rounds), "STALL": str(args.stall)}
    hang = args.stall + 120 + args.rounds * 0.2  # the job's own watch ends a stall long before this
    out, status, end, start, left, _, _ = _run_job(JOB, env, SERVERS + args.workers, False, hang,
                                                   args.package_root)
    run = {"algorithm": algo, "exit_status": status, "seconds": round(end - start, 1),
           "completed": f"ROUNDS DONE {args.rounds}" in out, "stalled": "STALL on worker" in out,
           "left_processes": left}
    if run["stalled"]:  # where each stalled worker's main thread was: the innermost hvd_async frames
        frames = re.findall(r'File "[^"]*/(hvd_async/[^"]+)", line (\d+) in (\w+)', out)
        run["hvd_async_frames"] = [f"{path}:{line} {name}" for path, line, name in frames][:24]
    if not run["completed"]:
        run["output_tail"] = out[-4000:]
    return run


def main() -> int:
    args = parse_args()
    runs = []
    for i in range(args.runs):
        for algo in args.algos:
            run = run_once(algo, args)
            runs.append(run)
            print(f"run {i + 1}/{args.runs} {algo}: exit {run['exit_status']} in {run['seconds']} s"
                  f"{'  STALLED' if run['stalled'] else ''}", flush=True)
    per_algo = {algo: {"runs": sum(r["algorithm"] == algo for r in runs),
                       "stalled": sum(r["stalled"] for r in runs if r["algorithm"] == algo),
                       "completed": sum(r["completed"] for r in runs if r["algorithm"] == algo)}
                for algo in args.algos}
    summary = {"what": "mailbox pushes and snapshots, 2 servers, shared memory off: runs in which a worker stalled",
               "package_commit": common.git("-C", args.package_root, "rev-parse", "HEAD"),
               "workers": args.workers, "servers": SERVERS, "rounds": args.rounds, "stall_seconds": args.stall,
               "runs": len(runs), "stalled": sum(r["stalled"] for r in runs),
               "completed": sum(r["completed"] for r in runs), "per_algorithm": per_algo,
               "each": runs}
    common.write_record(summary, args.out)
    print(f"{summary['stalled']} of {summary['runs']} runs stalled; {summary['completed']} completed "
          f"(package at {summary['package_commit'][:10]}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

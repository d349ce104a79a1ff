"""The fault matrix (issue 43): every algorithm family x every way one rank can fail x shared memory
on and off. Each cell runs tests/mpi/fault_job.py under mpirun (3 workers, plus a server where the
algorithm has them) in its own process group, and passes when:

- the job ends within ``--limit`` seconds of the fault (the moment the fault is injected; for a
  killed server, its start plus the 3 s timer) and its exit status is not 0;
- a line of its output names the failing rank (see ``NAMES``);
- no process of the job's own process group is left (checked by process group, never by name).

A cell still running ``--hang`` seconds after the start is killed and recorded as a hang (failed).
Cells that cannot apply (a server fault where the algorithm has no server) are listed with why.

    python benchmarks/faults/faults.py                      # the whole matrix -> benchmarks/results/faults.json
    python benchmarks/faults/faults.py --algos asgd,gossip --faults exit0,close --shm on
    python benchmarks/faults/faults.py --package-root ../old --out benchmarks/results/faults_before.json
        (the same cells against the package of another checkout: the record names its commit)
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
import common  # noqa: E402

sys.path.insert(0, os.path.join(common.ROOT, "tests"))
sys.path.insert(0, os.path.join(common.ROOT, "tests", "unit"))
from procs import _group_alive, wait_ended  # noqa: E402  (a job's process group: alive? its end)

ROOT = common.ROOT
JOB = os.path.join(ROOT, "tests", "mpi", "fault_job.py")
ORDER_JOB = os.path.join(ROOT, "tests", "mpi", "leave_order_job.py")
FAMILIES = {"ssgd": 0, "asgd": 1, "dc-asgd": 1, "softsync": 1, "od-sgd": 1, "hpsgd": 0, "gossip": 0, "easgd": 1,
            "backup-sgd": 1, "lb-sgd": 0}
FAULTS = ("raise", "data-error", "exit0", "close", "server", "kill-worker", "kill-server")
WORKERS, LEAVER = 3, 1
# Orders of leaving from the set the leave protocol's checker explores (tests/leave_orders.py), one
# per worker: issue 56's early close among late ones, its late sibling, early and late closes
# together, an exit, an uncaught error beside an early close, and every worker finishing.
ORDERS = ("finish,close-early,finish", "finish,close-late,finish", "close-early,finish,close-late",
          "exit@1,finish,finish", "raise@2,close-early,finish", "finish,finish,finish")
ORDER_LIMIT = 45.0  # seconds an order cell may take from its first fault (from its start where none fails)
NO_SHM = "--mca btl self,tcp --mca osc ^sm"

# What names the failing rank, per fault (LEAVER is worker 1; the killed or failing server is world rank 0).
NAMES = {
    "raise": rf"injected error in worker {LEAVER}'s step code",
    "data-error": rf"worker {LEAVER}: image \d+ of worker {LEAVER}'s share is not a readable image",
    "exit0": rf"worker\(s\) {LEAVER} left the job|worker {LEAVER} (left|exited)",
    "close": rf"worker\(s\) {LEAVER} left the job",
    "server": r"server 0 \(world rank 0\) failed",
    "kill-worker": r"process rank {world} with PID \d+ on node \S+ exited on signal 9",
    "kill-server": r"process rank 0 with PID \d+ on node \S+ exited on signal 9",
}


def not_applicable(algo: str, fault: str) -> str:
    if fault in ("server", "kill-server") and FAMILIES[algo] == 0:
        return f"{algo} has no parameter server"
    return ""


def _run_job(job: str, env: dict, np: int, shm: bool, hang: float, package_root: str):
    """Run ``job`` under mpirun in its own process group: (output, exit status or None if it hung,
    seconds from its start to its end, the start, whether processes were left, what was alive at a hang,
    the ranks' statuses where mpirun was stopped as stuck after every rank had exited, else None).

    mpirun stuck in its own teardown after all its ranks have exited (Debian's Open MPI can deadlock
    there after an MPI_Abort: tests/procs.py) is stopped ``STUCK_AFTER_RANKS_SECONDS`` later, as the
    tests' harness and ``hvd-async train`` do; the status is then what it would have reported, and the
    job's end is the moment it was stopped."""
    from hvd_async.job.launcher import mpirun_command

    names, env = list(env), dict(os.environ, PYTHONUNBUFFERED="1", **env)  # (mpirun passes ``names`` on)
    if package_root:  # the hvd_async under test comes from there
        env["PYTHONPATH"] = os.path.abspath(package_root)
    cmd = mpirun_command(np, [sys.executable, job], mpi_args="" if shm else NO_SHM,
                         env=names + (["PYTHONPATH"] if package_root else []))
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    ended = wait_ended(proc, hang)  # (at a hang, ``where``: what was alive, who held the job up)
    out, status, stuck, alive = ended.out, ended.code, ended.stuck, ended.where or []
    end = time.time()
    deadline = time.time() + 10
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    left = _group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    return out, status, end, start, left, alive, stuck


def run_cell(algo: str, fault: str, shm: bool, hang: float, limit: float, package_root: str = "") -> dict:
    servers = FAMILIES[algo]
    env = {"ALGO": algo, "FAULT": fault, "SERVERS": str(servers), "LEAVER": str(LEAVER)}
    out, status, end, start, left, alive, stuck = _run_job(JOB, env, WORKERS + servers, shm, hang, package_root)
    hung = status is None
    mark = re.search(r"FAULT \S+ on \w+ \d+ at step \d+ t=([\d.]+)", out)
    fault_at = float(mark.group(1)) if mark else start  # (no mark: from the start, an upper bound)
    pattern = NAMES[fault].format(world=servers + LEAVER)
    named = next((line.strip() for line in out.splitlines() if re.search(pattern, line)), "")
    seconds = round(end - fault_at, 1)
    cell = {"algorithm": algo, "fault": fault, "shm": shm, "exit_status": status,
            "hang": hung, "seconds_after_fault": seconds, "named": named[:300], "left_processes": left}
    if stuck is not None:  # mpirun stopped, stuck after its ranks had exited with these statuses
        cell["mpirun_stuck_after_ranks"] = stuck
    cell["passed"] = (not hung and status != 0 and seconds <= limit and bool(named) and not left)
    if not cell["passed"]:
        cell["output_tail"] = out[-2500:]
    if hung:
        cell["alive_at_hang"] = alive
    return cell


def run_order_cell(algo: str, order: str, shm: bool, hang: float, limit: float, package_root: str = "") -> dict:
    """One order of leaving (tests/leave_orders.py; one per worker, e.g. ``finish,close-early,finish``)
    under tests/mpi/leave_order_job.py. Passes when the job ends within ``limit`` seconds of its first
    fault (of its start where every worker finishes), leaves no process, and ends as the leave
    protocol's checker says it can: exit 0 with every worker done, or a non-zero status with a line
    naming a worker that left."""
    from leave_orders import Leave
    from test_leave_protocol import check

    servers = FAMILIES[algo]
    leaves = [Leave.parse(name) for name in order.split(",")]
    env = {"ALGO": algo, "SERVERS": str(servers), "LEAVES": order}
    out, status, end, start, left, alive, stuck = _run_job(ORDER_JOB, env, len(leaves) + servers, shm, hang,
                                                           package_root)
    hung = status is None
    marks = [float(t) for t in re.findall(r"FAULT \S+ on worker \d+ at step \d+ t=([\d.]+)", out)]
    seconds = round(end - (min(marks) if marks else start), 1)
    ends = check(leaves, servers)[2]
    if status == 0:
        named = "" if out.count(" DONE ") == len(leaves) else None
        as_checked = "finished" in ends and named == ""
    else:
        named = next((line.strip() for line in out.splitlines()
                      if re.search(r"left the job|injected error in worker \d+", line)), None)
        as_checked = not hung and "aborted" in ends and named is not None
    cell = {"algorithm": algo, "fault": f"order {order}", "shm": shm, "exit_status": status, "hang": hung,
            "seconds_after_fault": seconds, "named": (named or "")[:300], "left_processes": left,
            "checker_ends": sorted(ends)}
    if stuck is not None:
        cell["mpirun_stuck_after_ranks"] = stuck
    cell["passed"] = bool(as_checked and seconds <= limit and not left)
    if not cell["passed"]:
        cell["output_tail"] = out[-2500:]
    if hung:
        cell["alive_at_hang"] = alive
    return cell


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--algos", default=",".join(FAMILIES), help="comma-separated algorithm families")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
    p.add_argument("--orders", default=",".join(o.replace(",", "+") for o in ORDERS),
                   help="comma-separated orders of leaving, each worker's joined by '+' "
                        "(e.g. finish+close-early+finish); 'none' for no order cells")
    p.add_argument("--shm", choices=("on", "off", "both"), default="both", help="shared memory (default both)")
    p.add_argument("--limit", type=float, default=30.0, help="seconds from the fault to the job's end (default 30)")
    p.add_argument("--hang", type=float, default=120.0, help="seconds after which a cell counts as a hang (120)")
    p.add_argument("--package-root", default="", metavar="DIR",
                   help="test the hvd_async package of the checkout DIR (e.g. a worktree of an older commit)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "faults.json"))
    args = p.parse_args()
    algos, faults = args.algos.split(","), args.faults.split(",")
    for name in algos:
        if name not in FAMILIES:
            p.error(f"--algos: unknown family {name!r}; one of {', '.join(FAMILIES)}")
    for name in faults:
        if name not in FAULTS:
            p.error(f"--faults: unknown fault {name!r}; one of {', '.join(FAULTS)}")
    orders = [] if args.orders == "none" else [o.replace("+", ",") for o in args.orders.split(",")]
    from leave_orders import Leave

    for order in orders:
        try:
            [Leave.parse(name) for name in order.split(",")]
        except ValueError as exc:
            p.error(f"--orders: {exc}")
    shms = {"on": [True], "off": [False], "both": [True, False]}[args.shm]
    cells, skipped = [], []
    for algo in algos:
        runs = [(fault, run_cell) for fault in faults] + [(order, run_order_cell) for order in orders]
        for fault, runner in runs:
            why = not_applicable(algo, fault)
            if why:
                skipped.append({"algorithm": algo, "fault": fault, "why": why})
                continue
            for shm in shms:
                limit = args.limit if runner is run_cell else max(args.limit, ORDER_LIMIT)
                cell = runner(algo, fault, shm, args.hang, limit, args.package_root)
                cells.append(cell)
                done = "HANG" if cell["hang"] else f"{cell['seconds_after_fault']} s"
                print(f"[{len(cells)}] {algo:9s} {cell['fault']:12s} shm={'on ' if shm else 'off'} "
                      f"{'PASS' if cell['passed'] else 'FAIL'} exit={cell['exit_status']} {done}", flush=True)
    summary = {"workers": WORKERS, "leaver": LEAVER, "limit_seconds": args.limit,
               "order_limit_seconds": max(args.limit, ORDER_LIMIT), "hang_seconds": args.hang,
               "criterion": "ends within limit_seconds of the fault, exit status non-zero, the failing rank "
                            "named in a line of the output, no process of the job's process group left; "
                            "an order cell: ends within limit_seconds of its first fault, no process left, "
                            "and as the leave protocol's checker says it can (exit 0 with every worker done, "
                            "or non-zero with a line naming a worker that left)",
               "package_commit": (common.git("-C", os.path.abspath(args.package_root), "rev-parse", "HEAD")
                                  if args.package_root else "the record's own commit"),
               "cells": cells, "not_applicable": skipped,
               "passed": sum(c["passed"] for c in cells), "failed": sum(not c["passed"] for c in cells)}
    common.write_record(summary, args.out)
    print(f"{summary['passed']} passed, {summary['failed']} failed ({len(skipped)} cells not applicable) -> {args.out}")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

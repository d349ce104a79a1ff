"""The fault matrix (issue 43): every algorithm family x every way one rank can fail x shared memory
on and off. Each cell runs tests/mpi/fault_job.py under mpirun (3 workers, plus a server where the
algorithm has them) in its own process group, and passes when:

- the job ends within ``--limit`` seconds of the fault (the moment the fault is injected; for a
  killed server, its start plus the 3 s timer) and its exit status is not 0;
- a line of its output names the failing rank (see ``NAMES``);
- no process of the job's own process group is left (checked by process group, never by name).

A cell still running ``--hang`` seconds after the start is killed and recorded as a hang (failed).
Cells that cannot apply (a server fault where the algorithm has no server) are listed with why.

    python benchmarks/faults.py                      # the whole matrix -> benchmarks/results/faults.json
    python benchmarks/faults.py --algos asgd,gossip --faults exit0,close --shm on
    python benchmarks/faults.py --package-root ../old --out benchmarks/results/faults_before.json
        (the same cells against the package of another checkout: the record names its commit)
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

sys.path.insert(0, os.path.join(common.ROOT, "tests"))
from procs import _group_alive  # noqa: E402  (whether a job's process group still has a process)

ROOT = common.ROOT
JOB = os.path.join(ROOT, "tests", "mpi", "fault_job.py")
FAMILIES = {"ssgd": 0, "asgd": 1, "dc-asgd": 1, "softsync": 1, "od-sgd": 1, "hpsgd": 0, "gossip": 0, "easgd": 1,
            "backup-sgd": 1}
FAULTS = ("raise", "data-error", "exit0", "close", "server", "kill-worker", "kill-server")
WORKERS, LEAVER = 3, 1
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


def run_cell(algo: str, fault: str, shm: bool, hang: float, limit: float, package_root: str = "") -> dict:
    servers = FAMILIES[algo]
    from hvd_async.launcher import mpirun_command

    env = dict(os.environ, ALGO=algo, FAULT=fault, SERVERS=str(servers), LEAVER=str(LEAVER), PYTHONUNBUFFERED="1")
    if package_root:  # the hvd_async under test comes from there
        env["PYTHONPATH"] = os.path.abspath(package_root)
    cmd = mpirun_command(WORKERS + servers, [sys.executable, JOB], mpi_args="" if shm else NO_SHM,
                         env=["ALGO", "FAULT", "SERVERS", "LEAVER"] + (["PYTHONPATH"] if package_root else []))
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    hung = False
    try:
        out, _ = proc.communicate(timeout=hang)
    except subprocess.TimeoutExpired:
        hung = True
        alive = _group_processes(proc.pid)  # what was still there: who holds the job up
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    end = time.time()
    deadline = time.time() + 10
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    left = _group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    mark = re.search(r"FAULT \S+ on \w+ \d+ at step \d+ t=([\d.]+)", out)
    fault_at = float(mark.group(1)) if mark else start  # (no mark: from the start, an upper bound)
    pattern = NAMES[fault].format(world=servers + LEAVER)
    named = next((line.strip() for line in out.splitlines() if re.search(pattern, line)), "")
    seconds = round(end - fault_at, 1)
    cell = {"algorithm": algo, "fault": fault, "shm": shm, "exit_status": None if hung else proc.returncode,
            "hang": hung, "seconds_after_fault": seconds, "named": named[:300], "left_processes": left}
    cell["passed"] = (not hung and proc.returncode != 0 and seconds <= limit and bool(named) and not left)
    if not cell["passed"]:
        cell["output_tail"] = out[-2500:]
    if hung:
        cell["alive_at_hang"] = alive
    return cell


def _group_processes(pgid: int) -> list:
    """``pid state wchan command`` of every process in the process group ``pgid`` (ps's view)."""
    done = subprocess.run(["ps", "-o", "pid=,stat=,wchan:20=,args=", "-g", str(pgid)], capture_output=True,
                          text=True)
    return [line.strip()[:200] for line in done.stdout.splitlines() if line.strip()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--algos", default=",".join(FAMILIES), help="comma-separated algorithm families")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
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
    shms = {"on": [True], "off": [False], "both": [True, False]}[args.shm]
    cells, skipped = [], []
    for algo in algos:
        for fault in faults:
            why = not_applicable(algo, fault)
            if why:
                skipped.append({"algorithm": algo, "fault": fault, "why": why})
                continue
            for shm in shms:
                cell = run_cell(algo, fault, shm, args.hang, args.limit, args.package_root)
                cells.append(cell)
                done = "HANG" if cell["hang"] else f"{cell['seconds_after_fault']} s"
                print(f"[{len(cells)}] {algo:9s} {fault:12s} shm={'on ' if shm else 'off'} "
                      f"{'PASS' if cell['passed'] else 'FAIL'} exit={cell['exit_status']} {done}", flush=True)
    summary = {"workers": WORKERS, "leaver": LEAVER, "limit_seconds": args.limit, "hang_seconds": args.hang,
               "criterion": "ends within limit_seconds of the fault, exit status non-zero, the failing rank "
                            "named in a line of the output, no process of the job's process group left",
               "package_commit": (common.git("-C", os.path.abspath(args.package_root), "rev-parse", "HEAD")
                                  if args.package_root else "the record's own commit"),
               "cells": cells, "not_applicable": skipped,
               "passed": sum(c["passed"] for c in cells), "failed": sum(not c["passed"] for c in cells)}
    common.write_record(summary, args.out)
    print(f"{summary['passed']} passed, {summary['failed']} failed ({len(skipped)} cells not applicable) -> {args.out}")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

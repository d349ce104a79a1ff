"""bench_check: the quick forms of the ratio benchmarks, against their targets and the committed results.

A tool for whoever changes a hot path (issue 19): run it before submitting such a change and say
so in the closing note. It is not a timed test: these machines are shared and noisy, so it exits 0
whatever the figures (1 only when a benchmark crashed, or on a flag with ``--strict``).

Runs the ``--quick`` form of each check (``ssgd``: ssgd_overhead.py, 8 pairs of 30 steps;
``rma-shm`` and ``rma-no-shm``: rma_bandwidth.py at 1 KB, 1 MB and 4 MB; ``straggler``, run only
when named: straggler_throughput.py, asgd against ssgd once, samples/s and time to target, about
40 s), writes the quick results to ``--outdir`` (runs/bench-check/, ignored by git: never over
benchmarks/results/), and prints one row per ratio: its target, the quick figure, the last
committed figure (the record in benchmarks/results/ as of ``git show HEAD:``) with its spread, and
a flag. The quick forms are shorter than the committed runs, so their spread is wider.

The flag rule (:func:`flag`): a ratio is FLAGGED when its quick figure is below the lowest repeat
of the committed record (its ``min``: for ssgd the lowest of the alternating pairs, for the RMA sizes
the lowest block ratio): it fell by more than the whole measured spread. A committed record with no
spread (one figure, written before records carried one) flags below its figure times
``1 - --tolerance``. "low" marks a quick figure below the committed lower quartile but not below its
min (noise, most of the time). Below the target is shown apart ("miss"): a target can be missed
without any regression.

    make bench-check                                   # ssgd, rma-shm, rma-no-shm, server (about 2-3 minutes)
    python benchmarks/speed/bench_check.py --checks ssgd --strict
    python benchmarks/speed/bench_check.py --compare-only    # the table again from the last quick results
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT, git, provenance

OUTDIR = os.path.join(ROOT, "runs", "bench-check")
RESULTS = "benchmarks/results"
SIZES = {1024: "1KB", 1024 ** 2: "1MB", 4 * 1024 ** 2: "4MB"}
# issue 19's goals: ours/plain Horovod >= 0.98; window push+pull >= 0.95 of raw MPI from 1 MB up and at
# 1 KB no more than 3x raw; asgd/ssgd samples/s with a 3x straggler >= 1.5
RMA_TARGETS = {1024: 1 / 3, 1024 ** 2: 0.95, 4 * 1024 ** 2: 0.95}


class Figure(NamedTuple):
    """One ratio of a record: its headline ``value`` and, when the record has repeats, their spread."""
    value: Optional[float]
    min: Optional[float] = None
    q1: Optional[float] = None
    max: Optional[float] = None


class Check(NamedTuple):
    script: str  # its path in benchmarks/
    argv: tuple
    record: str  # file name, the same in --outdir and in benchmarks/results/
    figures: object  # record -> {ratio label: Figure}
    targets: Dict[str, float]


def ssgd_figures(record) -> Dict[str, Figure]:
    return {"ssgd ours/horovod": Figure(record["ratio_median"], record.get("ratio_min"), record.get("ratio_q1"),
                                        record.get("ratio_max"))}


def rma_figures(record) -> Dict[str, Figure]:
    return {f"rma {record['mode']} {SIZES[row['bytes']]} raw/ours":
            Figure(row["ratio"], row.get("ratio_min"), row.get("ratio_q1"), row.get("ratio_max"))
            for row in record["rows"] if row["bytes"] in SIZES}


def straggler_figures(record) -> Dict[str, Figure]:
    """asgd against ssgd: samples/s, and (records since the time-to-target) ssgd's time / asgd's."""
    out = {}
    for label, value_key, spread_key in (("samples/s", "ratio_to_ssgd", "ratio_to_ssgd_per_repeat"),
                                         ("time to target", "time_to_target_speedup",
                                          "time_to_target_speedup_per_repeat")):
        if value_key in record:
            s = record.get(spread_key, {}).get("asgd", {})
            out[f"straggler asgd/ssgd {label}"] = Figure(record[value_key].get("asgd"), s.get("min"), s.get("q1"),
                                                         s.get("max"))
    return out


SERVER_SIZE = 16 * 1024 ** 2  # the quick form's largest shard (issue 58's targets are set at 64 MiB)
SERVER_TARGETS = {"dc-asgd": 1 / 3, "lc-asgd": 1 / 3, "softsync": 1 / 2, "backup-sgd": 1 / 2}


def server_figures(record) -> Dict[str, Figure]:
    """Each server program's push against asgd's Accumulate of the same bytes (the Accumulate's time over
    the push's: higher is better), at 16 MiB (records before the sizes were measured: none)."""
    rows = [row for row in record.get("sizes", ()) if row["shard_bytes"] == SERVER_SIZE]
    return {f"server {algo} 16MB accumulate/push": Figure(r["accumulate_over_push"])
            for row in rows for algo, r in row["programs"].items()}


def rma_check(mode) -> Check:
    return Check("speed/rma_bandwidth.py", ("--mode", mode, "--quick"), f"rma_bandwidth_{mode}.json", rma_figures,
                 {f"rma {mode} {SIZES[b]} raw/ours": t for b, t in RMA_TARGETS.items()})


CHECKS = {
    "ssgd": Check("speed/ssgd_overhead.py", ("--quick",), "ssgd_overhead.json", ssgd_figures,
                  {"ssgd ours/horovod": 0.98}),
    "rma-shm": rma_check("shm"),
    "rma-no-shm": rma_check("no-shm"),
    "server": Check("speed/push_bandwidth.py", ("--quick",), "push_bandwidth.json", server_figures,
                    {f"server {algo} 16MB accumulate/push": t for algo, t in SERVER_TARGETS.items()}),
    "straggler": Check("speed/straggler_throughput.py", ("--quick",), "straggler_throughput.json", straggler_figures,
                       {"straggler asgd/ssgd samples/s": 1.5, "straggler asgd/ssgd time to target": 1.5}),
}
DEFAULT_CHECKS = ("ssgd", "rma-shm", "rma-no-shm", "server")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=FLAG_RULE,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checks", default=",".join(DEFAULT_CHECKS),
                   help=f"comma-separated checks to run, of: {', '.join(CHECKS)}")
    p.add_argument("--outdir", default=OUTDIR, help="where the quick results go (not benchmarks/results/)")
    p.add_argument("--compare-only", action="store_true",
                   help="run nothing: print the table from the quick results already in --outdir")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="for a committed record without spread: flag below its figure times (1 - this)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any ratio is flagged")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one quick benchmark may take")
    p.add_argument("--verbose", action="store_true", help="show the benchmarks' own output as they run")
    args = p.parse_args(argv)
    args.check_list = [c for c in args.checks.split(",") if c]
    unknown = [c for c in args.check_list if c not in CHECKS]
    if unknown or not args.check_list:
        p.error(f"--checks: unknown {unknown}; choose from {', '.join(CHECKS)}")
    if os.path.abspath(args.outdir) == os.path.join(ROOT, RESULTS):
        p.error("--outdir must not be benchmarks/results/: the quick results never replace the committed ones")
    if not 0 <= args.tolerance < 1:
        p.error(f"--tolerance must be in [0, 1), got {args.tolerance}")
    return args


# --- the rule -----------------------------------------------------------------------------------------

FLAG_RULE = ("flag rule: FLAG when the quick figure is below the committed record's lowest repeat (its min); "
             "a committed record without spread: below its figure x (1 - tolerance). 'low': below the "
             "committed lower quartile, not below its min. 'miss': below the target.")


def flag(quick: Optional[float], committed: Optional[Figure], tolerance: float = 0.10) -> str:
    """"FLAG", "low" or "" for a quick figure against the committed one (:data:`FLAG_RULE`)."""
    if quick is None or committed is None or committed.value is None:
        return ""
    floor = committed.min if committed.min is not None else committed.value * (1 - tolerance)
    if quick < floor:
        return "FLAG"
    return "low" if committed.q1 is not None and quick < committed.q1 else ""


# --- running and reading --------------------------------------------------------------------------------

def run_check(name: str, args) -> Optional[str]:
    """Run one quick benchmark into --outdir; returns None, or why it failed (with its output's tail)."""
    check = CHECKS[name]
    out = os.path.join(args.outdir, check.record)
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", check.script), *check.argv, "--out", out]
    if os.path.exists(out):  # a run that writes nothing must not show the last one's figures
        os.remove(out)
    started = time.monotonic()
    print(f"== {name}: python {' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in cmd[1:])}",
          flush=True)
    # its own session, so that a timeout ends mpirun and the ranks too, not only the script
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, start_new_session=True,
                            stdout=None if args.verbose else subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        return f"timed out after {args.timeout:.0f} s"
    except KeyboardInterrupt:  # the group does not see the terminal's Ctrl-C: end it here
        _end(proc)
        raise
    print(f"   {time.monotonic() - started:.0f} s, exit status {proc.returncode}", flush=True)
    if proc.returncode != 0:
        return f"exit status {proc.returncode}\n{(output or '')[-3000:]}"
    return None


def _end(proc) -> None:
    """Kill a benchmark's whole process group (the script, mpirun, the ranks) and reap the script."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def committed_record(name: str) -> Optional[dict]:
    """The check's record as of the last commit (``git show HEAD:benchmarks/results/...``), or None."""
    text = git("show", f"HEAD:{RESULTS}/{CHECKS[name].record}")
    return json.loads(text) if text else None


def quick_record(name: str, outdir: str) -> Optional[dict]:
    path = os.path.join(outdir, CHECKS[name].record)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def origin(record: Optional[dict]) -> str:
    """Which commit a committed record names: its provenance's, or 'legacy' (it predates provenance)."""
    if record is None:
        return "-"
    prov = record.get("provenance")
    if not prov:
        return "legacy"
    return (prov.get("commit") or "?")[:8] + ("" if prov.get("tree_clean") else " dirty")


# --- the table -------------------------------------------------------------------------------------------

def rows_for(name: str, quick: Optional[dict], committed: Optional[dict], tolerance: float) -> list:
    """One row per ratio of a check: label, target, quick, committed (with spread), origin, marks."""
    check = CHECKS[name]
    mine = check.figures(quick) if quick else {}
    theirs = check.figures(committed) if committed else {}
    rows = []
    for label, target in check.targets.items():
        q, c = mine.get(label), theirs.get(label)
        value = q.value if q else None
        marks = [m for m in (flag(value, c, tolerance),
                             "miss" if value is not None and value < target else "") if m]
        rows.append({"check": name, "ratio": label, "target": target, "quick": value,
                     "quick_spread": _span(q), "committed": c.value if c else None, "committed_spread": _span(c),
                     "committed_at": origin(committed) if c else "no committed figure", "marks": marks})
    return rows


def _span(fig: Optional[Figure]) -> str:
    if fig is None or fig.min is None:
        return ""
    return f"{fig.min:.3f}..{fig.max:.3f}" if fig.max is not None else f"min {fig.min:.3f}"


def _shown(path: str) -> str:
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) + "/" if path.startswith(ROOT + os.sep) else path + "/"


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(rows: list) -> None:
    head = ("ratio", "target", "quick", "(spread)", "committed", "(spread)", "at", "")
    lines = [head] + [(r["ratio"], f">= {r['target']:.3f}", _num(r["quick"]), r["quick_spread"], _num(r["committed"]),
                       r["committed_spread"], r["committed_at"], " ".join(r["marks"])) for r in rows]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip(), flush=True)
    print(FLAG_RULE, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    os.makedirs(args.outdir, exist_ok=True)
    tree = provenance()
    if not tree["tree_clean"]:
        print(f"note: uncommitted changes ({', '.join(tree['dirty_files'][:6])}"
              f"{' ...' if len(tree['dirty_files']) > 6 else ''}): the quick figures measure the working tree",
              flush=True)
    crashed = {}
    if not args.compare_only:
        for name in args.check_list:
            why = run_check(name, args)
            if why:
                crashed[name] = why
                print(f"!! {name} failed: {why}", file=sys.stderr, flush=True)
    rows = [row for name in args.check_list
            for row in rows_for(name, None if name in crashed else quick_record(name, args.outdir),
                                committed_record(name), args.tolerance)]
    seconds = time.monotonic() - started
    print_table(rows)
    flagged = [r["ratio"] for r in rows if "FLAG" in r["marks"]]
    print(f"bench-check: {len(rows)} ratios, {len(flagged)} flagged{': ' + ', '.join(flagged) if flagged else ''}, "
          f"{len(crashed)} crashed; {seconds:.0f} s; quick results in {_shown(args.outdir)}",
          flush=True)
    with open(os.path.join(args.outdir, "bench_check.json"), "w") as f:  # no dirty-tree banner: expected here
        json.dump({"benchmark": "bench_check", "checks": args.check_list, "rule": FLAG_RULE,
                   "tolerance": args.tolerance, "seconds": round(seconds, 1), "rows": rows, "crashed": crashed,
                   "provenance": tree}, f, indent=2)
    return 1 if crashed or (args.strict and flagged) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench-check: interrupted (the running benchmark was ended)", file=sys.stderr)
        sys.exit(130)

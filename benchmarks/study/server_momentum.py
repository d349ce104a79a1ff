"""server_momentum: one momentum buffer shared by every push against one per worker, on the validation split.

The servers of dc-asgd, lc-asgd and softsync keep, by default, a momentum buffer per worker: a copy of
the shard per worker. ``--server-momentum shared`` (softsync's was ``--softsync-momentum shared`` before it took the
same name) keeps one. This benchmark trains each algorithm both ways with the reference job on
Fashion-MNIST (``--dataset fashion-mnist``: LeNet, ssgd's lr from the validation sweep, momentum 0.9,
batch 32 per worker, one server) and scores the validation split (``--eval-on val``: the test split is
never read), at 4 and 8 workers, seeds 1-3 (seeds 11-20 and from 100 on are kept for scoring, and
refused here).

The criterion, fixed before the runs: in each cell (algorithm, workers), the shared buffer's mean final
validation accuracy over the seeds is at least the per-worker buffers' mean minus 1 point (the margin of
every check in this project), and no shared run diverged (final accuracy below 0.5 or loss not finite).
A cell that fails says the shared buffer costs accuracy there; a change of default would need a new
protocol (benchmarks/protocol.md) and fresh seeds, not this record alone.

The record is written after every run (a rerun with the same ``--out`` skips the runs in it, and the
record's cells cover every run it holds); each run notes the commit it ran at. ``--summarize`` rewrites
the cells from the runs already in ``--out`` and runs nothing.

    python benchmarks/study/server_momentum.py                    # 36 runs, about 40 minutes here
    python benchmarks/study/server_momentum.py --algos dc-asgd --workers 4 --seeds 1 --epochs 1 --out /tmp/m.json
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, provenance, train_job, write_record

RESERVED = "seeds 11-20 and >= 100 are kept for the final tables (issue 47)"
FLAG = {"dc-asgd": "--server-momentum", "lc-asgd": "--server-momentum", "softsync": "--server-momentum"}
VARIANTS = ("per-worker", "shared")
MARGIN = 0.01  # one point of accuracy
DIVERGED_BELOW = 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algos", default="dc-asgd,lc-asgd,softsync", help="comma-separated, of " + ", ".join(FLAG))
    p.add_argument("--workers", default="8,4", help="comma-separated worker counts")
    p.add_argument("--seeds", default="1,2,3", help=f"comma-separated run seeds ({RESERVED}: refused)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of every run")
    p.add_argument("--out", default=os.path.join(HERE, "results", "server_momentum_val.json"))
    p.add_argument("--summarize", action="store_true", help="rewrite the record's cells from its runs; run nothing")
    p.add_argument("--note", default=None, help="a line the record keeps (where its runs came from)")
    args = p.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    args.workers = [int(v) for v in args.workers.split(",") if v]
    args.seeds = [int(v) for v in args.seeds.split(",") if v]
    unknown = [a for a in args.algos if a not in FLAG]
    if unknown:
        p.error(f"--algos {','.join(unknown)}: not one of {', '.join(FLAG)}")
    bad = [s for s in args.seeds if 11 <= s <= 20 or s >= 100]
    if bad:
        p.error(f"--seeds {','.join(map(str, bad))}: {RESERVED}")
    if not args.seeds or not args.workers or min(args.workers) < 2 or args.epochs < 1:
        p.error("--seeds and --workers need at least one value, workers >= 2, --epochs >= 1")
    return args


def diverged(run) -> bool:
    return run["val_accuracy"] < DIVERGED_BELOW or not math.isfinite(run["train_loss"])


def verdicts(runs) -> dict:
    """Per cell ``algo/workers`` of the runs: each variant's accuracies, mean and spread, and the criterion's
    verdict where both variants ran on the same seeds."""
    cells = {}
    for algo in sorted({r["algo"] for r in runs}):
        for workers in sorted({r["workers"] for r in runs if r["algo"] == algo}):
            cell = {}
            for variant in VARIANTS:
                mine = [r for r in runs if (r["algo"], r["workers"], r["momentum"]) == (algo, workers, variant)]
                accs = [r["val_accuracy"] for r in mine]
                cell[variant] = {"val_accuracy": accs, "seeds": [r["seed"] for r in mine],
                                 "mean": round(statistics.mean(accs), 4) if accs else None,
                                 "min": min(accs, default=None), "max": max(accs, default=None),
                                 "diverged": sum(diverged(r) for r in mine)}
            if cell["shared"]["seeds"] and sorted(cell["shared"]["seeds"]) == sorted(cell["per-worker"]["seeds"]):
                gap = cell["shared"]["mean"] - cell["per-worker"]["mean"]
                cell["gap_points"] = round(100 * gap, 2)
                cell["passes"] = gap >= -MARGIN and cell["shared"]["diverged"] == 0
            cells[f"{algo}/{workers}"] = cell
    return cells


def main(argv=None):
    args = parse_args(argv)
    runs = []
    if os.path.isfile(args.out):
        with open(args.out) as f:
            runs = json.load(f).get("runs", [])
    plan = [(w, s, a, v) for w in args.workers for s in args.seeds for a in args.algos for v in VARIANTS]
    note = args.note
    if note is None and os.path.isfile(args.out):
        with open(args.out) as f:
            note = json.load(f).get("note")
    commit = provenance()["commit"]

    def save():
        write_record({"what": "the servers' momentum, one buffer shared by every push against one per worker, "
                              "scored on Fashion-MNIST's validation split only",
                      "criterion": f"per cell: shared's mean final validation accuracy >= per-worker's mean - "
                                   f"{MARGIN:g}, and no shared run below {DIVERGED_BELOW} or with a non-finite loss",
                      "settings": {"dataset": "fashion-mnist", "model": "lenet (the dataset's default)",
                                   "servers": 1, "epochs": args.epochs, "evaluated_on": "val"},
                      "note": note, "runs": runs, "cells": verdicts(runs)}, args.out)

    if args.summarize:
        save()
        plan = []
    for i, (workers, seed, algo, variant) in enumerate(plan):
        if any((r["algo"], r["workers"], r["seed"], r["momentum"]) == (algo, workers, seed, variant) for r in runs):
            continue
        record = train_job(["--algo", algo, "--dataset", "fashion-mnist", "--eval-on", "val", "--np", workers + 1,
                            "--servers", 1, "--epochs", args.epochs, "--seed", seed, FLAG[algo], variant])
        assert record["evaluated_on"] == "val", record.get("evaluated_on")
        runs.append({"algo": algo, "workers": workers, "seed": seed, "momentum": variant, "commit": commit,
                     "val_accuracy": record["final_test_accuracy"], "train_loss": record["final_train_loss"],
                     "wall_seconds": record["wall_seconds"],
                     "val_accuracy_by_epoch": [h["test_accuracy"] for h in record["history"]]})
        save()
        print(f"[{i + 1}/{len(plan)}] {algo} {workers} workers seed {seed} momentum {variant}: "
              f"val accuracy {runs[-1]['val_accuracy']:.4f} ({runs[-1]['wall_seconds']:.0f} s)", flush=True)
    for name, cell in verdicts(runs).items():
        if "passes" in cell:
            print(f"{name}: per-worker {cell['per-worker']['mean']:.4f} [{cell['per-worker']['min']:.4f}-"
                  f"{cell['per-worker']['max']:.4f}], shared {cell['shared']['mean']:.4f} "
                  f"[{cell['shared']['min']:.4f}-{cell['shared']['max']:.4f}]: {cell['gap_points']:+.2f} points, "
                  f"{'passes' if cell['passes'] else 'FAILS'}", flush=True)


if __name__ == "__main__":
    main()

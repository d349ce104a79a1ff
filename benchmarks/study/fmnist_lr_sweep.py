"""fmnist_lr_sweep: ssgd's learning rate on Fashion-MNIST, chosen on the validation split only.

Each run is the reference job, ``hvd-async train --algo ssgd --dataset fashion-mnist --model lenet
--eval-on val`` at ``--np`` workers (momentum 0.9, batch 32 per worker: the job's defaults) with
one ``--lr`` and one ``--seed``: it trains on the 55,000 training images less the validation split
and scores the 5,000 of it (the test split is never read). The record holds every run's final
validation accuracy and train loss, each lr's mean and spread over the seeds, and the lr chosen:
the highest mean validation accuracy among the lrs where no run diverged (final loss not finite
or accuracy below 0.5). ``hvd-async train --dataset fashion-mnist`` uses it (config.DATASET_DEFAULTS).

Seeds 11-20 and from 100 on are kept for scoring (issue 47) and refused here. The record is written
after every run (a rerun with the same ``--out`` skips the runs already in it; ``--fresh`` starts over).

    python benchmarks/study/fmnist_lr_sweep.py                       # 4 lrs x 2 seeds x 3 epochs, about 20 min here
    python benchmarks/study/fmnist_lr_sweep.py --lrs 0.05 --seeds 1 --epochs 1 --out /tmp/s.json
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, train_job, write_record

RESERVED = "seeds 11-20 and >= 100 are kept for the final tables (issue 47)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--lrs", default="0.01,0.02,0.05,0.1", help="comma-separated learning rates")
    p.add_argument("--seeds", default="1,2", help=f"comma-separated run seeds ({RESERVED}: refused)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of every run")
    p.add_argument("--np", type=int, default=4, help="workers")
    p.add_argument("--model", default="lenet", help="the model")
    p.add_argument("--diverged-below", type=float, default=0.5, help="a run below this accuracy diverged")
    p.add_argument("--out", default=os.path.join(HERE, "results", "fmnist_lr_sweep.json"))
    p.add_argument("--fresh", action="store_true", help="ignore the runs already in --out")
    args = p.parse_args(argv)
    args.lrs = [float(v) for v in args.lrs.split(",")]
    args.seeds = [int(v) for v in args.seeds.split(",")]
    bad = [s for s in args.seeds if 11 <= s <= 20 or s >= 100]
    if bad:
        p.error(f"--seeds {','.join(map(str, bad))}: {RESERVED}")
    return args


def summarize(runs, lrs, diverged_below):
    """Per lr: the seeds' final validation accuracies, mean, spread (min-max) and whether any diverged;
    the lr chosen (the best mean among those that never diverged; None when all did)."""
    table = {}
    for lr in lrs:
        accs = [r["val_accuracy"] for r in runs if r["lr"] == lr]
        if not accs:
            continue
        diverged = any(r["val_accuracy"] < diverged_below or not math.isfinite(r["train_loss"])
                       for r in runs if r["lr"] == lr)
        table[str(lr)] = {"val_accuracy": accs, "mean": round(statistics.mean(accs), 4),
                          "min": min(accs), "max": max(accs), "diverged": diverged}
    stable = {lr: row for lr, row in table.items() if not row["diverged"]}
    chosen = max(stable, key=lambda lr: stable[lr]["mean"]) if stable else None
    return table, None if chosen is None else float(chosen)


def main(argv=None):
    args = parse_args(argv)
    runs = []
    if not args.fresh and os.path.isfile(args.out):
        with open(args.out) as f:
            runs = json.load(f).get("runs", [])
    for lr in args.lrs:
        for seed in args.seeds:
            if any(r["lr"] == lr and r["seed"] == seed for r in runs):
                continue
            record = train_job(["--algo", "ssgd", "--dataset", "fashion-mnist", "--model", args.model,
                                "--eval-on", "val", "--np", args.np, "--epochs", args.epochs,
                                "--lr", lr, "--seed", seed])
            assert record["evaluated_on"] == "val", record.get("evaluated_on")
            runs.append({"lr": lr, "seed": seed, "val_accuracy": record["final_test_accuracy"],
                         "train_loss": record["final_train_loss"], "wall_seconds": record["wall_seconds"],
                         "samples_per_second": round(record["samples_per_second"], 1),
                         "val_accuracy_by_epoch": [h["test_accuracy"] for h in record["history"]]})
            table, chosen = summarize(runs, args.lrs, args.diverged_below)
            write_record({"what": "ssgd's lr on Fashion-MNIST, scored on the validation split only",
                          "settings": {"algorithm": "ssgd", "dataset": "fashion-mnist", "model": args.model,
                                       "workers": args.np, "epochs": args.epochs, "batch_size": 32,
                                       "momentum": 0.9, "evaluated_on": "val", "lrs": args.lrs,
                                       "seeds": args.seeds},
                          "runs": runs, "by_lr": table, "chosen_lr": chosen}, args.out)
            print(f"lr {lr} seed {seed}: val accuracy {runs[-1]['val_accuracy']:.4f} "
                  f"({runs[-1]['wall_seconds']:.0f} s); chosen so far: {chosen}", flush=True)


if __name__ == "__main__":
    main()

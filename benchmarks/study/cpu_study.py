"""cpu_study: ssgd, asgd, od-sgd (both exchanges) and hpsgd on real cores: samples/s and time to ssgd's accuracy.

Issue 21's study for a machine with enough cores that the exchange does not compete with compute
(the device machine: 16 cores). For each model (resnet18 on synthetic images, the digits CNN), each
worker count (4 and 8, servers on top for the parameter-server variants) and each repeat (the seed),
every variant runs ``hvd-async train`` with no injected sleeps, in an order that alternates from one
repeat to the next. Per run: samples/s, the final test accuracy and the accuracy over wall-clock
seconds. Per (model, workers): median samples/s, the ratio to ssgd's, and the time each variant
needs to reach the final test accuracy of ssgd's run with the same seed (the first epoch at or above
it; also within 1 point of it).

The JSON (``--out``) is rewritten after every run, with the machine, the driver and the commit; with
``--resume`` the runs already in it are not run again, so a study cut off by a time limit goes on
where it stopped (``--budget-s`` stops starting new runs in time).

    python benchmarks/study/cpu_study.py                                   # the whole study (16 cores)
    python benchmarks/study/cpu_study.py --models cnn --workers 4 --repeats 1 --out /tmp/s.json
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, pyplot, train_job

MODELS = {
    # name: (train flags, od-sgd's local lr)
    "resnet18": (["--dataset", "synthetic", "--model", "resnet18"], 0.01),
    "cnn": (["--dataset", "digits", "--model", "cnn"], 0.05),
}
VARIANTS = ("ssgd", "asgd", "od-sgd-window", "od-sgd-allreduce", "hpsgd")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default="resnet18,cnn", help=f"comma-separated, of: {', '.join(MODELS)}")
    p.add_argument("--workers", default="4,8", help="comma-separated worker counts")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--repeats", type=int, default=3, help="runs of each variant (seeds 0..repeats-1)")
    p.add_argument("--servers", type=int, default=None,
                   help="parameter-server ranks for asgd and od-sgd (window) (default: workers // 4, at least 1)")
    p.add_argument("--resnet18-epochs", type=int, default=3)
    p.add_argument("--resnet18-lr", type=float, default=0.01)
    p.add_argument("--cnn-epochs", type=int, default=10)
    p.add_argument("--cnn-lr", type=float, default=0.1)
    p.add_argument("--image-size", type=int, default=32, help="resnet18: synthetic image side")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step on each worker")
    p.add_argument("--window", type=int, default=4, help="hpsgd's window")
    p.add_argument("--out", default=os.path.join(HERE, "results", "cpu_study.json"))
    p.add_argument("--resume", action="store_true", help="keep the runs already in --out and run the rest")
    p.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--timeout", type=float, default=900, help="seconds one training job may take")
    args = p.parse_args(argv)
    args.model_list = [m for m in args.models.split(",") if m]
    args.worker_list = [int(w) for w in args.workers.split(",") if w]
    args.variant_list = [v for v in args.variants.split(",") if v]
    bad = [m for m in args.model_list if m not in MODELS] + [v for v in args.variant_list if v not in VARIANTS]
    if bad or not args.model_list or not args.variant_list or not args.worker_list:
        p.error(f"unknown or empty --models/--variants: {bad}")
    if min(args.worker_list) < 1 or args.repeats < 1:
        p.error("--workers and --repeats must be >= 1")
    return args


def flags(args, model: str, variant: str, workers: int, seed: int):
    base, local_lr = MODELS[model]
    epochs, lr = getattr(args, f"{model}_epochs"), getattr(args, f"{model}_lr")
    servers = args.servers if args.servers is not None else max(1, workers // 4)
    algo = {"ssgd": ["--algo", "ssgd"], "asgd": ["--algo", "asgd"],
            "od-sgd-window": ["--algo", "od-sgd", "--od-exchange", "window", "--local-lr", local_lr],
            "od-sgd-allreduce": ["--algo", "od-sgd", "--od-exchange", "allreduce", "--local-lr", local_lr],
            "hpsgd": ["--algo", "hpsgd", "--window", args.window]}[variant]
    servers = servers if variant in ("asgd", "od-sgd-window") else 0
    extra = ["--image-size", args.image_size] if model == "resnet18" else []
    return [*algo, *base, *extra, "--np", workers + servers, "--servers", servers, "--epochs", epochs,
            "--lr", lr, "--batch-size", args.batch_size, "--seed", seed], servers


def key(run) -> tuple:
    return run["model"], run["workers"], run["variant"], run["seed"]


def time_to(history, target: float):
    for entry in history:
        if entry["test_accuracy"] >= target - 1e-12:
            return entry["wall_seconds"]
    return None


def summarize(runs) -> dict:
    """Per model and worker count: medians, ratios to ssgd, times to ssgd's accuracy (same seed)."""
    out = {}
    for model, workers in sorted({(r["model"], r["workers"]) for r in runs}):
        group = [r for r in runs if (r["model"], r["workers"]) == (model, workers)]
        ssgd = {r["seed"]: r for r in group if r["variant"] == "ssgd"}
        table = {}
        for variant in VARIANTS:
            mine = [r for r in group if r["variant"] == variant]
            if not mine:
                continue
            row = {"runs": len(mine),
                   "samples_per_second_median": statistics.median(r["samples_per_second"] for r in mine),
                   "samples_per_second": [r["samples_per_second"] for r in mine],
                   "final_test_accuracy_median": statistics.median(r["final_test_accuracy"] for r in mine)}
            reach, reach_1pt = [], []
            for r in mine:
                if r["seed"] in ssgd:
                    target = ssgd[r["seed"]]["final_test_accuracy"]
                    reach.append(time_to(r["history"], target))
                    reach_1pt.append(time_to(r["history"], target - 0.01))
            row["seconds_to_ssgd_accuracy"] = reach
            row["seconds_to_ssgd_accuracy_within_1pt"] = reach_1pt
            done = [s for s in reach if s is not None]
            row["seconds_to_ssgd_accuracy_median"] = statistics.median(done) if len(done) == len(reach) and done else None
            table[variant] = row
        if "ssgd" in table:
            for row in table.values():
                row["ratio_to_ssgd"] = row["samples_per_second_median"] / table["ssgd"]["samples_per_second_median"]
        out[f"{model} {workers}w"] = table
    return out


def write(args, record) -> None:
    record["summary"] = summarize(record["runs"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, args.out)


def plot(record, path) -> None:
    plt = pyplot()
    groups = list(record["summary"])
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(4 * max(1, len(groups)), 3.5), squeeze=False)
    for ax, group in zip(axes[0], groups):
        table = record["summary"][group]
        names = list(table)
        ax.bar(range(len(names)), [table[v]["samples_per_second_median"] for v in names], color="tab:blue")
        for i, v in enumerate(names):
            ax.plot([i] * len(table[v]["samples_per_second"]), table[v]["samples_per_second"], "k.", ms=4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(group, fontsize=9)
        ax.set_ylabel("samples/s (median; dots: runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "device"))  # device_info: the device benchmarks' environment block
    from common import provenance
    from device_info import environment

    record = {"benchmark": "cpu_study", "settings": {k: v for k, v in vars(args).items() if not k.endswith("_list")},
              "environment": environment(), "provenance": provenance(), "runs": []}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            record["runs"] = json.load(f).get("runs", [])
        print(f"resuming: {len(record['runs'])} run(s) already in {args.out}", flush=True)
    done = {key(r) for r in record["runs"]}
    began = time.monotonic()
    for model in args.model_list:
        for workers in args.worker_list:
            for seed in range(args.repeats):
                order = args.variant_list if seed % 2 == 0 else args.variant_list[::-1]
                for variant in order:
                    if (model, workers, variant, seed) in done:
                        continue
                    if args.budget_s is not None and time.monotonic() - began > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s spent: stopping (rerun with --resume)", flush=True)
                        write(args, record)
                        return 0
                    train_flags, servers = flags(args, model, variant, workers, seed)
                    start = time.monotonic()
                    rec = train_job(train_flags, timeout=args.timeout)
                    run = {"model": model, "workers": workers, "servers": servers, "variant": variant, "seed": seed,
                           "samples_per_second": rec["samples_per_second"],
                           "final_test_accuracy": rec["final_test_accuracy"], "train_seconds": rec.get("train_seconds"),
                           "job_seconds": time.monotonic() - start,
                           "step_wait_ms_mean": rec.get("step_wait_ms_mean"),
                           "history": [{"epoch": e["epoch"], "wall_seconds": e["wall_seconds"],
                                        "test_accuracy": e["test_accuracy"]} for e in rec["history"]],
                           "flags": [str(f) for f in train_flags]}
                    record["runs"].append(run)
                    print(f"{model} {workers}w seed {seed} {variant:>16}: {run['samples_per_second']:8.1f} samples/s, "
                          f"test accuracy {run['final_test_accuracy']:.4f}, job {run['job_seconds']:.1f} s", flush=True)
                    write(args, record)
    write(args, record)
    for group, table in record["summary"].items():
        for variant, row in table.items():
            print(f"{group:>12} {variant:>16}: median {row['samples_per_second_median']:8.1f} samples/s "
                  f"({row.get('ratio_to_ssgd', float('nan')):.2f} x ssgd), time to ssgd's accuracy "
                  f"{row['seconds_to_ssgd_accuracy']}", flush=True)
    try:
        plot(record, os.path.splitext(args.out)[0] + ".png")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""overlap_claims: the od-sgd and hpsgd papers' claims, measured side by side with the training job.

Three parts (``--part``, default all), each alternating the algorithms within a repeat so drift on a
shared machine hits all alike, printing the figures and writing JSON + a plot to benchmarks/results/:

- ``accuracy``: od-sgd (both exchanges) against ssgd on digits, equal epochs, several seeds. The
  claim: similar or slightly better test accuracy (checked here: within 1 point of ssgd's mean).
- ``throughput``: resnet18 (11 M parameters) on synthetic data, where the exchange costs about as
  much as the compute: ssgd runs first with no injected compute and its measured exchange wait per
  step becomes ``--compute-ms`` for every run. Samples/s of ssgd, asgd and od-sgd; the claim:
  od-sgd above ssgd and not below asgd.
- ``budget``: hpsgd against ssgd under the same injected compute and straggler: test accuracy at a
  fixed wall-clock budget (the time the faster of the two needed for all its epochs; the slower one
  is scored by the last epoch it finished within it). The claim: hpsgd ahead.

    python benchmarks/study/overlap_claims.py                    # all three (about 25 minutes on 2 cores)
    python benchmarks/study/overlap_claims.py --part accuracy --seeds 0,1
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, pyplot, run_parts, spread, train_job

PARTS = ("accuracy", "throughput", "budget")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=PARTS + ("all",), default="all")
    p.add_argument("--workers", type=int, default=4, help="workers (servers come on top)")
    p.add_argument("--seeds", default="0,1,2,3,4", help="accuracy: seeds (comma-separated)")
    p.add_argument("--epochs", type=int, default=10, help="accuracy and budget: epochs per run")
    p.add_argument("--local-lr", type=float, default=0.05, help="od-sgd's local rate (global: the job's --lr)")
    p.add_argument("--resnet-image-size", type=int, default=8,
                   help="throughput: synthetic image side (small, so 2 shared cores keep up)")
    p.add_argument("--resnet-batch", type=int, default=8, help="throughput: batch per worker")
    p.add_argument("--repeats", type=int, default=5, help="throughput and budget: runs of each algorithm")
    p.add_argument("--compute-ms", type=float, default=20.0, help="budget: injected compute per step")
    p.add_argument("--straggler", default="2=2", metavar="WORKER=FACTOR", help="budget: the slow worker")
    p.add_argument("--window", type=int, default=4, help="budget: hpsgd's window")
    p.add_argument("--outdir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",") if s]
    if args.workers < 2 or args.epochs < 1 or args.repeats < 1 or not args.seed_list:
        p.error("--workers must be >= 2, --epochs and --repeats >= 1, --seeds not empty")
    return args


def job(algo, args, *extra):
    servers = {"asgd": 1, "od-sgd": 1}.get(algo, 0)
    if "allreduce" in extra:
        servers = 0
    return train_job(["--algo", algo, "--np", args.workers + servers, "--servers", servers, *extra])


def _print(label, record):
    print(f"{label:>28}: test accuracy {record['final_test_accuracy']:.4f}  "
          f"{record['samples_per_second']:8.1f} samples/s  train {record['train_seconds']:.1f} s  "
          f"wait {record['step_wait_ms_mean']:.1f} ms/step", flush=True)


# --- accuracy: od-sgd within 1 point of ssgd at equal epochs ----------------------------------------

VARIANTS = {"ssgd": ("ssgd",), "od-sgd window": ("od-sgd", "--od-exchange", "window"),
            "od-sgd allreduce": ("od-sgd", "--od-exchange", "allreduce")}


def accuracy(args) -> dict:
    runs = []
    for i, seed in enumerate(args.seed_list):
        names = list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]
        for name in names:
            algo, *extra = VARIANTS[name]
            if algo == "od-sgd":
                extra += ["--local-lr", args.local_lr]
            record = job(algo, args, "--epochs", args.epochs, "--seed", seed, *extra)
            _print(f"seed {seed} {name}", record)
            runs.append({"variant": name, "seed": seed, "final_test_accuracy": record["final_test_accuracy"],
                         "history": [e["test_accuracy"] for e in record["history"]]})
    mean = {v: statistics.mean(r["final_test_accuracy"] for r in runs if r["variant"] == v) for v in VARIANTS}
    gap = {v: 100.0 * (mean[v] - mean["ssgd"]) for v in VARIANTS if v != "ssgd"}
    for v, points in gap.items():
        print(f"{v} - ssgd mean test accuracy: {points:+.2f} points (claim: within 1 point or better)", flush=True)
    return {"benchmark": "overlap_accuracy", "dataset": "digits", "epochs": args.epochs, "workers": args.workers,
            "seeds": args.seed_list, "local_lr": args.local_lr, "mean_test_accuracy": mean,
            "spread_test_accuracy": {v: spread(r["final_test_accuracy"] for r in runs if r["variant"] == v)
                                     for v in VARIANTS},
            "gap_points_to_ssgd": gap, "runs": runs}


def plot_accuracy(summary, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    colors = dict(zip(VARIANTS, ("tab:blue", "tab:orange", "tab:green")))
    for run in summary["runs"]:
        ax.plot(range(1, len(run["history"]) + 1), run["history"], color=colors[run["variant"]], alpha=0.7,
                label=run["variant"] if run["seed"] == summary["seeds"][0] else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (digits)")
    ax.set_ylim(0.5, 1.0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- throughput: exchange about as long as compute ---------------------------------------------------

def throughput(args) -> dict:
    model = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", args.resnet_image_size,
             "--batch-size", args.resnet_batch, "--epochs", 1, "--lr", 0.01]
    probe = job("ssgd", args, *model)
    compute_ms = round(probe["step_wait_ms_mean"], 1)
    print(f"ssgd's exchange wait per step with no injected compute: {compute_ms} ms -> --compute-ms {compute_ms}",
          flush=True)
    variants = {"ssgd": ("ssgd",), "asgd": ("asgd",),
                "od-sgd window": ("od-sgd", "--od-exchange", "window", "--local-lr", 0.01),
                "od-sgd allreduce": ("od-sgd", "--od-exchange", "allreduce", "--local-lr", 0.01)}
    runs = []
    for r in range(args.repeats):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            algo, *extra = variants[name]
            record = job(algo, args, *model, "--compute-ms", compute_ms, *extra)
            _print(f"repeat {r} {name}", record)
            blocked = record.get("exchange_blocked_ms_mean")
            runs.append({"variant": name, "repeat": r, "samples_per_second": record["samples_per_second"],
                         "step_wait_ms_mean": record["step_wait_ms_mean"], "exchange_blocked_ms_mean": blocked,
                         "compute_ms_per_step": statistics.mean(e["compute_ms_per_step"] for e in record["history"])})
    median = {v: statistics.median(x["samples_per_second"] for x in runs if x["variant"] == v) for v in variants}
    ratios = {v: median[v] / median["ssgd"] for v in variants}
    for v in variants:
        print(f"{v:>17}: median {median[v]:.1f} samples/s, {ratios[v]:.2f} x ssgd", flush=True)
    for v in ("od-sgd window", "od-sgd allreduce"):
        print(f"{v} / asgd: {median[v] / median['asgd']:.2f} (claim: > 1/ssgd's and >= asgd's)", flush=True)
    return {"benchmark": "overlap_throughput", "model": "resnet18", "parameters": 11173962,
            "image_size": args.resnet_image_size, "batch_size": args.resnet_batch, "workers": args.workers,
            "probe_ssgd_exchange_wait_ms": compute_ms, "compute_ms": compute_ms,
            "median_samples_per_second": median, "ratio_to_ssgd": ratios,
            "spread_samples_per_second": {v: spread(x["samples_per_second"] for x in runs if x["variant"] == v)
                                          for v in variants},
            "runs": runs}


def plot_throughput(summary, path):
    plt = pyplot()
    names = list(summary["median_samples_per_second"])
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    ax.bar(names, [summary["median_samples_per_second"][v] for v in names], color="tab:blue")
    for run in summary["runs"]:
        ax.plot(names.index(run["variant"]), run["samples_per_second"], "k.", ms=4)
    ax.set_ylabel("samples/s (median; dots: runs)")
    ax.set_title(f"resnet18, {summary['workers']} workers, +{summary['compute_ms']} ms compute/step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- budget: hpsgd against ssgd at a fixed wall-clock budget ----------------------------------------

def _accuracy_within(record, budget):
    reached = [e["test_accuracy"] for e in record["history"] if e["wall_seconds"] <= budget + 1e-9]
    return reached[-1] if reached else None


def budget(args) -> dict:
    common = ["--epochs", args.epochs, "--compute-ms", args.compute_ms, "--straggler", args.straggler]
    variants = {"ssgd": ("ssgd",), f"hpsgd k={args.window}": ("hpsgd", "--window", args.window)}
    runs = []
    for r in range(args.repeats):
        pair = {}
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            algo, *extra = variants[name]
            pair[name] = job(algo, args, *common, "--seed", r, *extra)
            _print(f"repeat {r} {name}", pair[name])
        limit = min(rec["history"][-1]["wall_seconds"] for rec in pair.values())
        for name, rec in pair.items():
            acc = _accuracy_within(rec, limit)
            print(f"repeat {r} {name:>10}: test accuracy within {limit:.1f} s: {acc}", flush=True)
            runs.append({"variant": name, "repeat": r, "budget_seconds": limit, "accuracy_at_budget": acc,
                         "curve": [(e["wall_seconds"], e["test_accuracy"]) for e in rec["history"]],
                         "samples_per_second": rec["samples_per_second"]})
    scores = {v: statistics.mean((x["accuracy_at_budget"] or 0.0) for x in runs if x["variant"] == v) for v in variants}
    names = list(variants)
    print("mean test accuracy at the budget: " + ", ".join(f"{v} {scores[v]:.4f}" for v in names)
          + f"  (claim: {names[1]} ahead)", flush=True)
    return {"benchmark": "overlap_budget", "dataset": "digits", "epochs": args.epochs, "workers": args.workers,
            "compute_ms": args.compute_ms, "straggler": args.straggler, "window": args.window,
            "mean_accuracy_at_budget": scores,
            "spread_accuracy_at_budget": {v: spread((x["accuracy_at_budget"] or 0.0) for x in runs if x["variant"] == v)
                                          for v in variants},
            "runs": runs}


def plot_budget(summary, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    colors = {}
    for run in summary["runs"]:
        color = colors.setdefault(run["variant"], f"C{len(colors)}")
        t, acc = zip(*run["curve"])
        ax.plot(t, acc, ".-", color=color, label=run["variant"] if run["repeat"] == 0 else None)
        ax.axvline(run["budget_seconds"], color="grey", lw=0.5)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("test accuracy (digits)")
    ax.set_title(f"+{summary['compute_ms']} ms compute, straggler {summary['straggler']} (lines: budgets)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    return run_parts(parse_args(argv), {"accuracy": (accuracy, plot_accuracy), "throughput": (throughput, plot_throughput),
                                "budget": (budget, plot_budget)}, "overlap")


if __name__ == "__main__":
    sys.exit(main())

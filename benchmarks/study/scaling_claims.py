"""scaling_claims: Jin et al.'s claim, measured: asynchronous averaging (easgd, gossip) against ssgd and
asgd as the workers grow.

The training job on digits at 2, 4 and 8 workers for each of ssgd, asgd, easgd and gossip, once per
seed (``--seeds``: five by default, so that a time to target has a spread), with injected compute per step (``--compute-ms``, sleep) so that the two cores of a small machine do not
decide the outcome; records test accuracy against wall time after every epoch. The claim: the
asynchronous methods converge faster (in time) at few nodes, synchronous SGD scales better at many.
Prints, per worker count, the time each algorithm needed to reach ``--target`` test accuracy and its
final accuracy; writes JSON and a plot (accuracy against wall time, one panel per worker count) to
benchmarks/results/.

    python benchmarks/study/scaling_claims.py                       # about 20 minutes on 2 cores
    python benchmarks/study/scaling_claims.py --workers-list 2,4 --epochs 5 --seeds 0
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, pyplot, run_parts, spread, train_job

ALGOS = ("ssgd", "asgd", "easgd", "gossip")
SERVERS = {"asgd": 1, "easgd": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=("scaling", "all"), default="all")
    p.add_argument("--workers-list", default="2,4,8")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--compute-ms", type=float, default=10.0, help="injected compute per step")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy whose time-to-reach is printed")
    p.add_argument("--seeds", default="0,1,2,3,4", help="seeds (comma-separated): each a full set of runs")
    p.add_argument("--outdir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.worker_counts = [int(w) for w in args.workers_list.split(",") if w]
    args.seed_list = [int(s) for s in args.seeds.split(",") if s]
    if not args.worker_counts or min(args.worker_counts) < 2 or args.epochs < 1 or not args.seed_list:
        p.error("--workers-list needs counts >= 2, --epochs >= 1, --seeds at least one seed")
    return args


def _time_to(curve, target):
    return next((t for t, acc in curve if acc >= target), None)


def scaling(args) -> dict:
    runs = []
    for i, (seed, workers) in enumerate((s, w) for s in args.seed_list for w in args.worker_counts):
        for algo in (ALGOS if i % 2 == 0 else ALGOS[::-1]):  # alternate the order: no algorithm always runs first
            servers = SERVERS.get(algo, 0)
            record = train_job(["--algo", algo, "--np", workers + servers, "--servers", servers, "--seed", seed,
                                "--epochs", args.epochs, "--compute-ms", args.compute_ms])
            curve = [(e["wall_seconds"], e["test_accuracy"]) for e in record["history"]]
            reach = _time_to(curve, args.target)
            runs.append({"algo": algo, "workers": workers, "seed": seed, "curve": curve, "time_to_target": reach,
                         "final_test_accuracy": record["final_test_accuracy"],
                         "samples_per_second": record["samples_per_second"]})
            reached = f"{reach:.1f} s" if reach is not None else "not reached"
            print(f"seed {seed} {workers} workers {algo:>6}: final test accuracy {record['final_test_accuracy']:.4f}  "
                  f"{record['samples_per_second']:7.0f} samples/s  time to {args.target}: {reached}", flush=True)
    times = {}
    for workers in args.worker_counts:
        times[workers] = {}
        for algo in ALGOS:
            mine = [r["time_to_target"] for r in runs if r["workers"] == workers and r["algo"] == algo]
            times[workers][algo] = {"mean": statistics.mean(mine) if None not in mine else None,
                                    "spread": spread(t for t in mine if t is not None), "not_reached": mine.count(None)}
        order = sorted((a for a in ALGOS if times[workers][a]["mean"] is not None),
                       key=lambda a: times[workers][a]["mean"])
        print(f"{workers} workers, fastest to {args.target} (mean of {len(args.seed_list)} seeds): "
              + ", ".join(f"{a} {times[workers][a]['mean']:.1f} s" for a in order), flush=True)
    return {"benchmark": "scaling", "dataset": "digits", "epochs": args.epochs, "compute_ms": args.compute_ms,
            "worker_counts": args.worker_counts, "seeds": args.seed_list, "target": args.target,
            "time_to_target": {str(w): t for w, t in times.items()}, "runs": runs}


def plot_scaling(summary, path):
    plt = pyplot()
    counts = summary["worker_counts"]
    fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.5), sharey=True)
    axes = axes if len(counts) > 1 else [axes]
    for ax, workers in zip(axes, counts):
        for run in summary["runs"]:
            if run["workers"] == workers:
                t, acc = zip(*run["curve"])
                first = run.get("seed", 0) == summary.get("seeds", [0])[0]
                ax.plot(t, acc, ".-", color=f"C{ALGOS.index(run['algo'])}", alpha=0.7,
                        label=run["algo"] if first else None)
        ax.set_title(f"{workers} workers, +{summary['compute_ms']:.0f} ms/step")
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylim(0.5, 1.0)
        ax.legend()
    axes[0].set_ylabel("test accuracy (digits)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    return run_parts(parse_args(argv), {"scaling": (scaling, plot_scaling)}, "scaling")


if __name__ == "__main__":
    sys.exit(main())

"""scaling_claims: Jin et al.'s claim, measured: asynchronous averaging (easgd, gossip) against ssgd and
asgd as the workers grow.

The training job on digits at 2, 4 and 8 workers for each of ssgd, asgd, easgd and gossip, with
injected compute per step (``--compute-ms``, sleep) so that the two cores of a small machine do not
decide the outcome; records test accuracy against wall time after every epoch. The claim: the
asynchronous methods converge faster (in time) at few nodes, synchronous SGD scales better at many.
Prints, per worker count, the time each algorithm needed to reach ``--target`` test accuracy and its
final accuracy; writes JSON and a plot (accuracy against wall time, one panel per worker count) to
benchmarks/results/.

    python benchmarks/scaling_claims.py                       # about 15 minutes on 2 cores
    python benchmarks/scaling_claims.py --workers-list 2,4 --epochs 5
"""
import argparse
import os
import sys

from common import HERE, pyplot, run_parts, train_job

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
    p.add_argument("--outdir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.worker_counts = [int(w) for w in args.workers_list.split(",") if w]
    if not args.worker_counts or min(args.worker_counts) < 2 or args.epochs < 1:
        p.error("--workers-list needs counts >= 2 and --epochs >= 1")
    return args


def _time_to(curve, target):
    return next((t for t, acc in curve if acc >= target), None)


def scaling(args) -> dict:
    runs = []
    for i, workers in enumerate(args.worker_counts):
        for algo in (ALGOS if i % 2 == 0 else ALGOS[::-1]):
            servers = SERVERS.get(algo, 0)
            record = train_job(["--algo", algo, "--np", workers + servers, "--servers", servers,
                                "--epochs", args.epochs, "--compute-ms", args.compute_ms])
            curve = [(e["wall_seconds"], e["test_accuracy"]) for e in record["history"]]
            reach = _time_to(curve, args.target)
            runs.append({"algo": algo, "workers": workers, "curve": curve, "time_to_target": reach,
                         "final_test_accuracy": record["final_test_accuracy"],
                         "samples_per_second": record["samples_per_second"]})
            reached = f"{reach:.1f} s" if reach is not None else "not reached"
            print(f"{workers} workers {algo:>6}: final test accuracy {record['final_test_accuracy']:.4f}  "
                  f"{record['samples_per_second']:7.0f} samples/s  time to {args.target}: {reached}", flush=True)
    for workers in args.worker_counts:
        mine = [r for r in runs if r["workers"] == workers and r["time_to_target"] is not None]
        order = sorted(mine, key=lambda r: r["time_to_target"])
        print(f"{workers} workers, fastest to {args.target}: "
              + ", ".join(f"{r['algo']} {r['time_to_target']:.1f} s" for r in order), flush=True)
    return {"benchmark": "scaling", "dataset": "digits", "epochs": args.epochs, "compute_ms": args.compute_ms,
            "worker_counts": args.worker_counts, "target": args.target, "runs": runs}


def plot_scaling(summary, path):
    plt = pyplot()
    counts = summary["worker_counts"]
    fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.5), sharey=True)
    axes = axes if len(counts) > 1 else [axes]
    for ax, workers in zip(axes, counts):
        for run in summary["runs"]:
            if run["workers"] == workers:
                t, acc = zip(*run["curve"])
                ax.plot(t, acc, ".-", color=f"C{ALGOS.index(run['algo'])}", label=run["algo"])
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

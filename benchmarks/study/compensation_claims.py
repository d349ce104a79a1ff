"""compensation_claims: the lc-asgd and dbs-asgd papers' claims, measured with the training job.

Two parts (``--part``, default both), JSON + a plot each in benchmarks/results/:

- ``delay``: asgd, dc-asgd and lc-asgd on digits at 2, 4 and 8 workers (one server), equal epochs,
  with injected compute jitter so pushes interleave as on a real cluster; the staleness grows with
  the workers. Test accuracy and final training loss per algorithm and worker count, the mean
  staleness, and lc-asgd's server time per push. The claim: lc-asgd holds up at delays where
  dc-asgd degrades.
- ``hetero``: asgd, softsync and dbs-asgd on heterogeneous workers (``--straggler 1=2 --straggler
  2=4``): training loss, test accuracy, samples/s and the batch sizes dbs-asgd settled on against
  the inverse-speed proportions. The claim: markedly lower loss and higher accuracy, same speed.

    python benchmarks/study/compensation_claims.py               # both (about 15 minutes on 2 cores)
    python benchmarks/study/compensation_claims.py --part delay --workers-list 2,4
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, pyplot, run_parts, spread, train_job

PARTS = ("delay", "hetero")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=PARTS + ("all",), default="all")
    p.add_argument("--workers-list", default="2,4,8", help="delay: worker counts")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--compute-ms", type=float, default=10.0, help="injected compute per step")
    p.add_argument("--stragglers", default="1=2,2=4", help="hetero: WORKER=FACTOR list")
    p.add_argument("--hetero-workers", type=int, default=4)
    p.add_argument("--seeds", default="0,1,2,3,4", help="seeds (comma-separated), each a full set of runs")
    p.add_argument("--outdir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.worker_counts = [int(w) for w in args.workers_list.split(",") if w]
    args.seed_list = [int(s) for s in args.seeds.split(",") if s]
    args.straggler_list = [s for s in args.stragglers.split(",") if s]
    if not args.worker_counts or min(args.worker_counts) < 2 or args.epochs < 1 or not args.seed_list:
        p.error("--workers-list needs counts >= 2, --epochs >= 1, --seeds not empty")
    return args


def _job(algo, workers, args, seed, *extra):
    return train_job(["--algo", algo, "--np", workers + 1, "--servers", 1, "--epochs", args.epochs, "--lr", args.lr,
                      "--compute-ms", args.compute_ms, "--seed", seed, *extra])


def _row(record):
    return {"final_test_accuracy": record["final_test_accuracy"], "final_train_loss": record["final_train_loss"],
            "samples_per_second": record["samples_per_second"], "staleness_mean": record["staleness_mean"],
            "server_ms_per_push": record.get("server_ms_per_push"), "batch_sizes": record.get("batch_sizes"),
            "loss_curve": [e["train_loss"] for e in record["history"]]}


def _values(runs, key, **match):
    return [r[key] for r in runs if all(r[k] == v for k, v in match.items()) and r[key] is not None]


def _mean(runs, key, **match):
    values = _values(runs, key, **match)
    return statistics.mean(values) if values else None


def _spreads(runs, keys, **match) -> dict:
    """min / quartiles / median / max over the seeds of each of ``keys`` (:func:`common.spread`)."""
    return {key: spread(_values(runs, key, **match)) for key in keys}


# --- delay: asgd, dc-asgd, lc-asgd as the workers (and the staleness) grow -------------------------

DELAY_ALGOS = ("asgd", "dc-asgd", "lc-asgd")


def delay(args) -> dict:
    runs = []
    for seed in args.seed_list:
        for workers in args.worker_counts:
            # every other worker is 50% slower: pushes interleave unevenly, as across real nodes
            jitter = [arg for w in range(1, workers, 2) for arg in ("--straggler", f"{w}=1.5")]
            for algo in (DELAY_ALGOS if seed % 2 == 0 else DELAY_ALGOS[::-1]):
                record = _job(algo, workers, args, seed, *jitter)
                row = dict(_row(record), algo=algo, workers=workers, seed=seed)
                runs.append(row)
                server = f"  server {row['server_ms_per_push']:.3f} ms/push" if row["server_ms_per_push"] else ""
                print(f"seed {seed} {workers} workers {algo:>8}: test accuracy {row['final_test_accuracy']:.4f}  "
                      f"train loss {row['final_train_loss']:.4f}  staleness {row['staleness_mean']:.2f}{server}",
                      flush=True)
    table = {algo: {w: {"test_accuracy": _mean(runs, "final_test_accuracy", algo=algo, workers=w),
                        "train_loss": _mean(runs, "final_train_loss", algo=algo, workers=w),
                        "staleness_mean": _mean(runs, "staleness_mean", algo=algo, workers=w)}
                    for w in args.worker_counts} for algo in DELAY_ALGOS}
    for w in args.worker_counts:
        print(f"{w} workers (mean of {len(args.seed_list)} seeds): " + ", ".join(
            f"{a} {table[a][w]['test_accuracy']:.4f} / loss {table[a][w]['train_loss']:.4f}" for a in DELAY_ALGOS),
            flush=True)
    lc_cost = [r["server_ms_per_push"] for r in runs if r["algo"] == "lc-asgd" and r["workers"] == max(args.worker_counts)]
    return {"benchmark": "compensation_delay", "dataset": "digits", "epochs": args.epochs, "lr": args.lr,
            "compute_ms": args.compute_ms, "seeds": args.seed_list, "worker_counts": args.worker_counts,
            "mean": table, "spread": {algo: {w: _spreads(runs, ("final_test_accuracy", "final_train_loss"),
                                                          algo=algo, workers=w) for w in args.worker_counts}
                                      for algo in DELAY_ALGOS},
            "lc_server_ms_per_push_at_most_workers": lc_cost, "runs": runs}


def plot_delay(summary, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for algo in DELAY_ALGOS:
        ws = summary["worker_counts"]
        axes[0].plot(ws, [summary["mean"][algo][w]["test_accuracy"] for w in ws], "o-", label=algo)
        axes[1].plot(ws, [summary["mean"][algo][w]["train_loss"] for w in ws], "o-", label=algo)
    axes[0].set_ylabel("test accuracy")
    axes[1].set_ylabel("final train loss")
    for ax in axes:
        ax.set_xlabel("workers (staleness grows)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- hetero: dbs-asgd against asgd and softsync on uneven workers ----------------------------------

HETERO_ALGOS = ("asgd", "softsync", "dbs-asgd")


def hetero(args) -> dict:
    stragglers = [arg for s in args.straggler_list for arg in ("--straggler", s)]
    factors = [1.0] * args.hetero_workers
    for spec in args.straggler_list:
        worker, factor = spec.split("=")
        factors[int(worker)] = float(factor)
    inverse = [1 / f for f in factors]
    global_batch = 32 * args.hetero_workers
    expected = [global_batch * x / sum(inverse) for x in inverse]
    runs = []
    for seed in args.seed_list:
        for algo in (HETERO_ALGOS if seed % 2 == 0 else HETERO_ALGOS[::-1]):
            record = _job(algo, args.hetero_workers, args, seed, *stragglers)
            row = dict(_row(record), algo=algo, seed=seed)
            runs.append(row)
            sizes = f"  batch sizes {row['batch_sizes']}" if algo == "dbs-asgd" else ""
            print(f"seed {seed} {algo:>8}: test accuracy {row['final_test_accuracy']:.4f}  train loss "
                  f"{row['final_train_loss']:.4f}  {row['samples_per_second']:.0f} samples/s{sizes}", flush=True)
    mean = {a: {k: _mean(runs, k, algo=a) for k in ("final_test_accuracy", "final_train_loss", "samples_per_second")}
            for a in HETERO_ALGOS}
    dbs_sizes = [r["batch_sizes"] for r in runs if r["algo"] == "dbs-asgd"]
    errors = [max(abs(b - e) / e for b, e in zip(sizes, expected)) for sizes in dbs_sizes]
    for a in HETERO_ALGOS:
        print(f"{a:>8}: test accuracy {mean[a]['final_test_accuracy']:.4f}  train loss "
              f"{mean[a]['final_train_loss']:.4f}  {mean[a]['samples_per_second']:.0f} samples/s", flush=True)
    print(f"dbs-asgd batch sizes against inverse-speed proportions {[round(e, 1) for e in expected]}: "
          f"largest relative error per run {[round(e, 3) for e in errors]}", flush=True)
    return {"benchmark": "compensation_hetero", "dataset": "digits", "epochs": args.epochs, "lr": args.lr,
            "compute_ms": args.compute_ms, "workers": args.hetero_workers, "stragglers": args.straggler_list,
            "seeds": args.seed_list, "expected_batch_sizes": expected, "batch_size_errors": errors,
            "mean": mean,
            "spread": {a: _spreads(runs, ("final_test_accuracy", "final_train_loss", "samples_per_second"), algo=a)
                       for a in HETERO_ALGOS},
            "runs": runs}


def plot_hetero(summary, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, run in enumerate(summary["runs"]):
        color = f"C{HETERO_ALGOS.index(run['algo'])}"
        ax.plot(range(1, len(run["loss_curve"]) + 1), run["loss_curve"], color=color,
                label=run["algo"] if run["seed"] == summary["seeds"][0] else None)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss")
    ax.set_title(f"{summary['workers']} workers, stragglers {', '.join(summary['stragglers'])}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    return run_parts(parse_args(argv), {"delay": (delay, plot_delay), "hetero": (hetero, plot_hetero)}, "compensation")


if __name__ == "__main__":
    sys.exit(main())

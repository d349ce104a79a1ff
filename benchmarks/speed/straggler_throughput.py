"""straggler_throughput: samples/s and time to a target accuracy, parameter-server algorithms against ssgd
with one slow worker.

Runs the reference training job (``hvd-async train``) with injected compute (``--compute-ms``, sleep)
and a straggler (``--straggler 2=3``: worker 2's steps take three times as long), on the same data,
model, batch size and number of workers, alternating the algorithms in each repeat so that drift on
a shared machine hits all alike. ssgd waits for the straggler at every allreduce; asgd's workers do
not wait for each other, but their stale updates may need more epochs to reach the same accuracy.
So beside samples/s the yardstick is the time to a target test accuracy: ssgd's median final
accuracy after ``--epochs`` minus ``--target-drop`` (1 point), read from each run's per-epoch
history (wall seconds since the job started, at the first epoch whose test accuracy reached it;
the parameter-server algorithms run ``--max-epochs`` to leave them room). Prints per run and per
algorithm (min / median / max over the repeats) samples/s and time to target, and the ratios to
ssgd (asgd's targets: >= 1.5 for both), and writes JSON and a plot to benchmarks/results/.

    python benchmarks/speed/straggler_throughput.py
    python benchmarks/speed/straggler_throughput.py --algos asgd,dc-asgd,softsync --repeats 3
    python benchmarks/speed/straggler_throughput.py --quick --out /tmp/s.json   # a tiny form (about 40 s)
    python benchmarks/speed/straggler_throughput.py --epochs 1 --max-epochs 1 \
        --job-args "--dataset fashion-mnist --model lenet"      # another data set and model
    python benchmarks/speed/straggler_throughput.py --cpu-bound --compute-ms 1 --straggler 2=15 \
        --algos asgd,dc-asgd,lc-asgd,softsync,backup-sgd       # the CPU-bound setting (issue 58, item 4)

The CPU-bound setting: every process's real forward and backward on this machine's shared cores, the
device time (``--compute-ms``) small beside it, and the straggler's slowness that device time
stretched (it sleeps: its node's slowness is not on these cores). ``--cpu-bound`` labels the record
so; the straggler's factor is the caller's (issue 58's protocol sets it from a run without one).
Where asgd is among the algorithms, the ratios of the others' samples/s to asgd's are printed too.
"""
import argparse
import math
import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, apply_quick, quick_help, save, spread, train_job

TARGET_RATIO = 1.5  # asgd against ssgd, samples/s and time to target (issue 19)
QUICK = {"algos": "asgd", "epochs": 1, "max_epochs": 4, "repeats": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", type=int, default=4, help="workers (servers come on top)")
    p.add_argument("--algos", default="asgd,dc-asgd,softsync",
                   help="parameter-server algorithms compared with ssgd (comma-separated)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="injected compute per step")
    p.add_argument("--straggler", default="2=3", metavar="WORKER=FACTOR", help="the slow worker")
    p.add_argument("--epochs", type=int, default=3, help="ssgd's epochs (its final accuracy sets the target)")
    p.add_argument("--max-epochs", type=int, default=10,
                   help="the parameter-server algorithms' epochs: room to reach the target")
    p.add_argument("--target-drop", type=float, default=0.01,
                   help="target test accuracy: ssgd's median final accuracy minus this")
    p.add_argument("--repeats", type=int, default=3, help="runs of each algorithm, alternating")
    p.add_argument("--cpu-bound", action="store_true",
                   help="label the record CPU-bound: --compute-ms is small beside the real compute (see above)")
    p.add_argument("--quick", action="store_true", help=quick_help(QUICK))
    p.add_argument("--job-args", default="", metavar="FLAGS",
                   help="more flags for every job (e.g. \"--dataset fashion-mnist --model lenet\")")
    p.add_argument("--out", default=os.path.join(HERE, "results", "straggler_throughput.json"), help="JSON path")
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    if args.workers < 2 or args.epochs < 1 or args.max_epochs < 1 or args.repeats < 1:
        p.error("--workers must be >= 2, --epochs, --max-epochs and --repeats >= 1")
    args.algo_list = [a for a in args.algos.split(",") if a]
    return args


def run_job(algo, args) -> dict:
    servers = 0 if algo == "ssgd" else 1
    epochs = args.epochs if algo == "ssgd" else args.max_epochs
    return train_job(["--algo", algo, "--np", args.workers + servers, "--servers", servers,
                      "--epochs", epochs, "--compute-ms", args.compute_ms, "--straggler", args.straggler,
                      *shlex.split(args.job_args)],
                     timeout=900)


def run_row(repeat, algo, record) -> dict:
    """One run's figures, with its accuracy curve ``[wall seconds, test accuracy]`` per epoch."""
    row = {"repeat": repeat, "algo": algo, "epochs": len(record["history"]),
           "samples_per_second": record["samples_per_second"], "final_test_accuracy": record["final_test_accuracy"],
           "staleness_mean": record["staleness_mean"], "step_wait_ms_mean": record["step_wait_ms_mean"],
           "curve": [[e["wall_seconds"], e["test_accuracy"]] for e in record["history"]]}
    print(f"repeat {repeat} {algo:>9}: {row['samples_per_second']:8.0f} samples/s  test accuracy "
          f"{row['final_test_accuracy']:.3f} after {row['epochs']} epochs ({row['curve'][-1][0]:.1f} s)  "
          f"staleness mean {row['staleness_mean']:.2f}  wait {row['step_wait_ms_mean']:.1f} ms/step", flush=True)
    return row


def time_to(curve, target):
    """Wall seconds at the first epoch whose test accuracy reached ``target`` (None: never)."""
    return next((t for t, acc in curve if acc >= target), None)


def _median_time(times):
    """Median time to target, a run that never reached it counting as infinitely slow (None if so)."""
    value = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def per_algo(runs, algo) -> dict:
    """An algorithm's spreads over its repeats: samples/s, time to target, final accuracy."""
    mine = [r for r in runs if r["algo"] == algo]
    reached = [r["time_to_target"] for r in mine if r["time_to_target"] is not None]
    return {"samples_per_second": spread(r["samples_per_second"] for r in mine),
            "time_to_target": dict(spread(reached), median=_median_time(r["time_to_target"] for r in mine),
                                   reached=len(reached), runs=len(mine)),
            "final_test_accuracy": spread(r["final_test_accuracy"] for r in mine)}


def paired_ratios(runs, algo, key, *, invert=False, base="ssgd") -> dict:
    """``algo`` / ``base`` of ``key`` within each repeat (``base`` / algo with ``invert``: times), as a spread."""
    values = []
    for r in sorted({x["repeat"] for x in runs}):
        a, b = [next(x[key] for x in runs if x["repeat"] == r and x["algo"] == n) for n in (algo, base)]
        if a is not None and b is not None:
            values.append(b / a if invert else a / b)
    return spread(values)


def summarize(args, runs) -> dict:
    ssgd_final = statistics.median(r["final_test_accuracy"] for r in runs if r["algo"] == "ssgd")
    target = ssgd_final - args.target_drop
    for row in runs:
        row["time_to_target"] = time_to(row["curve"], target)
    algos = ["ssgd", *args.algo_list]
    table = {a: per_algo(runs, a) for a in algos}
    median = {a: table[a]["samples_per_second"]["median"] for a in algos}
    tta = {a: table[a]["time_to_target"]["median"] for a in algos}
    beside_asgd = [a for a in args.algo_list if a != "asgd"] if "asgd" in args.algo_list else []
    return {"benchmark": "straggler_throughput", "quick": args.quick, "workers": args.workers,
            "compute_ms": args.compute_ms, "straggler": args.straggler, "job_args": args.job_args,
            "compute_model": _compute_model(args), "epochs": args.epochs,
            "max_epochs": args.max_epochs, "repeats": args.repeats, "target_accuracy": target,
            "target_rule": f"ssgd's median final test accuracy after {args.epochs} epochs ({ssgd_final:.4f}) "
                           f"minus {args.target_drop}",
            "median_samples_per_second": median,
            "ratio_to_ssgd": {a: median[a] / median["ssgd"] for a in args.algo_list},
            "ratio_to_ssgd_per_repeat": {a: paired_ratios(runs, a, "samples_per_second") for a in args.algo_list},
            "median_time_to_target": tta,
            "time_to_target_speedup": {a: (tta["ssgd"] / tta[a] if tta[a] and tta["ssgd"] else None)
                                       for a in args.algo_list},
            "time_to_target_speedup_per_repeat": {a: paired_ratios(runs, a, "time_to_target", invert=True)
                                                  for a in args.algo_list},
            "ratio_to_asgd": {a: median[a] / median["asgd"] for a in beside_asgd},
            "ratio_to_asgd_per_repeat": {a: paired_ratios(runs, a, "samples_per_second", base="asgd")
                                         for a in beside_asgd},
            "per_algo": table, "target_asgd": TARGET_RATIO, "runs": runs}


def _compute_model(args) -> str:
    if args.cpu_bound:
        return (f"CPU-bound: the real forward and backward of every process on this machine's shared cores, "
                f"{args.compute_ms:g} ms of device time (sleep) a step beside it, the straggler's stretched")
    return (f"emulated: {args.compute_ms:g} ms of device time (sleep) a step, then the real forward and "
            f"backward on this machine's cores")


def report(summary) -> None:
    print(f"target test accuracy {summary['target_accuracy']:.4f} ({summary['target_rule']})", flush=True)
    for algo, row in summary["per_algo"].items():
        sps, tta = row["samples_per_second"], row["time_to_target"]
        reach = (f"time to target min/median/max {tta['min']:.1f}/{_secs(tta['median'])}/{tta['max']:.1f} s"
                 if tta["reached"] else "never reached the target") + f" ({tta['reached']}/{tta['runs']} runs)"
        print(f"{algo:>9}: samples/s min/median/max {sps['min']:.0f}/{sps['median']:.0f}/{sps['max']:.0f}  {reach}",
              flush=True)
    for algo, ratio in summary["ratio_to_ssgd"].items():
        speedup = summary["time_to_target_speedup"][algo]
        goal = f"  (targets >= {TARGET_RATIO})" if algo == "asgd" else ""
        print(f"{algo} against ssgd: samples/s x{ratio:.2f}, time to target x"
              + (f"{speedup:.2f} faster" if speedup else "? (median run never reached it)") + goal, flush=True)
    for algo, ratio in summary.get("ratio_to_asgd", {}).items():
        per = summary["ratio_to_asgd_per_repeat"][algo]
        print(f"{algo} against asgd: samples/s x{ratio:.2f} (repeats {per['min']:.2f}-{per['max']:.2f})", flush=True)


def _secs(value) -> str:
    return f"{value:.1f}" if value is not None else "never"


def main(argv=None) -> int:
    args = parse_args(argv)
    algos = ["ssgd", *args.algo_list]
    runs = []
    for r in range(args.repeats):
        for algo in (algos if r % 2 == 0 else algos[::-1]):
            runs.append(run_row(r, algo, run_job(algo, args)))
    summary = summarize(args, runs)
    report(summary)
    save(summary, args.out, plot)
    return 0


def plot(summary, path):
    """Left: samples/s per algorithm (median bar, a dot per run); right: test accuracy against wall
    time of every run, with the target."""
    from common import pyplot

    plt = pyplot()
    algos = list(summary["median_samples_per_second"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.bar(algos, [summary["median_samples_per_second"][x] for x in algos], color="tab:blue")
    for run in summary["runs"]:
        a.plot(algos.index(run["algo"]), run["samples_per_second"], "k.", ms=4)
        t, acc = zip(*run["curve"])
        b.plot(t, acc, ".-", color=f"C{algos.index(run['algo'])}",
               label=run["algo"] if run["repeat"] == 0 else None)
    a.set_ylabel("samples/s (median; dots: runs)")
    b.axhline(summary["target_accuracy"], color="k", ls="--", lw=1, label="target")
    b.set_xlabel("wall seconds"), b.set_ylabel("test accuracy"), b.legend(fontsize=8)
    fig.suptitle(f"{summary['workers']} workers, {summary['compute_ms']:.0f} ms compute, "
                 f"straggler {summary['straggler']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())

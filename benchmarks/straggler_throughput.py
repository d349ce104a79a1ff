"""straggler_throughput: samples/s of the parameter-server algorithms against ssgd with one slow worker.

Runs the reference training job (``hvd-async train``) with injected compute (``--compute-ms``, sleep)
and a straggler (``--straggler 2=3``: worker 2's steps take three times as long), on the same data,
model, batch size and number of workers, alternating the algorithms in each repeat so that drift on
a shared machine hits all alike. ssgd waits for the straggler at every allreduce; asgd's workers do
not wait for each other. Prints samples/s per run and the ratio of each algorithm's median to
ssgd's (asgd's target: >= 1.5), and writes JSON and a plot to benchmarks/results/.

    python benchmarks/straggler_throughput.py
    python benchmarks/straggler_throughput.py --algos asgd,dc-asgd,softsync --repeats 3
"""
import argparse
import os
import statistics
import sys

from common import HERE, save, train_job


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", type=int, default=4, help="workers (servers come on top)")
    p.add_argument("--algos", default="asgd,dc-asgd,softsync",
                   help="parameter-server algorithms compared with ssgd (comma-separated)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="injected compute per step")
    p.add_argument("--straggler", default="2=3", metavar="WORKER=FACTOR", help="the slow worker")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="runs of each algorithm, alternating")
    p.add_argument("--out", default=os.path.join(HERE, "results", "straggler_throughput.json"))
    args = p.parse_args(argv)
    if args.workers < 2 or args.epochs < 1 or args.repeats < 1:
        p.error("--workers must be >= 2, --epochs and --repeats >= 1")
    args.algo_list = [a for a in args.algos.split(",") if a]
    return args


def run_job(algo, args) -> dict:
    servers = 0 if algo == "ssgd" else 1
    return train_job(["--algo", algo, "--np", args.workers + servers, "--servers", servers,
                      "--epochs", args.epochs, "--compute-ms", args.compute_ms, "--straggler", args.straggler],
                     timeout=900)


def main(argv=None) -> int:
    args = parse_args(argv)
    algos = ["ssgd", *args.algo_list]
    runs = []
    for r in range(args.repeats):
        for algo in (algos if r % 2 == 0 else algos[::-1]):
            record = run_job(algo, args)
            runs.append({"repeat": r, "algo": algo, "samples_per_second": record["samples_per_second"],
                         "final_test_accuracy": record["final_test_accuracy"],
                         "staleness_mean": record["staleness_mean"], "step_wait_ms_mean": record["step_wait_ms_mean"]})
            print(f"repeat {r} {algo:>9}: {record['samples_per_second']:8.0f} samples/s  test accuracy "
                  f"{record['final_test_accuracy']:.3f}  staleness mean {record['staleness_mean']:.2f}  "
                  f"wait {record['step_wait_ms_mean']:.1f} ms/step", flush=True)
    median = {a: statistics.median(x["samples_per_second"] for x in runs if x["algo"] == a) for a in algos}
    ratios = {a: median[a] / median["ssgd"] for a in args.algo_list}
    summary = {"benchmark": "straggler_throughput", "workers": args.workers, "compute_ms": args.compute_ms,
               "straggler": args.straggler, "epochs": args.epochs, "repeats": args.repeats,
               "median_samples_per_second": median, "ratio_to_ssgd": ratios, "target_asgd": 1.5, "runs": runs}
    for algo, ratio in ratios.items():
        print(f"{algo} / ssgd samples/s: {ratio:.2f}" + ("  (target >= 1.5)" if algo == "asgd" else ""),
              flush=True)
    save(summary, args.out, plot)
    return 0


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(summary["median_samples_per_second"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(algos, [summary["median_samples_per_second"][a] for a in algos], color="tab:blue")
    for run in summary["runs"]:
        ax.plot(algos.index(run["algo"]), run["samples_per_second"], "k.", ms=4)
    ax.set_ylabel("samples/s (median; dots: runs)")
    ax.set_title(f"{summary['workers']} workers, {summary['compute_ms']:.0f} ms compute, "
                 f"straggler {summary['straggler']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())

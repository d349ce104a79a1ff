"""lookahead_sim: the mailbox algorithms at ssgd's settings with and without the look-ahead, in the simulator.

The question (issue 17): at 8 workers on the digits CNN, real runs of dc-asgd, lc-asgd and softsync
ended 12 to 17 points under ssgd (``convergence.json``) while asgd passed, and the simulator with
exponential compute times did not show it. The mailbox servers take the pushes one at a time, so the
workers fall into a round robin: every gradient is exactly ``workers - 1`` pushes stale. This study
runs the simulator with both kinds of compute times, ``constant`` (a strict round robin, what the
real mailbox runs had) and ``exponential`` (staleness spread around the same mean), for ssgd, asgd
and the three mailbox algorithms with ``--lookahead`` and ``--no-lookahead``, every other option at
the job's defaults (lr 0.1, momentum 0.9, 32 samples per worker, 8 epochs).

The criterion is ``convergence.py``'s, fixed before the runs: a configuration passes when its mean
final test accuracy over the seeds is at least ssgd's mean (same delays) minus ``--margin`` (1
point). Simulated runs are deterministic: the same seed gives the same figures.

    python benchmarks/study/lookahead_sim.py                       # 2 seeds, about 3 minutes here
    python benchmarks/study/lookahead_sim.py --seeds 11 --workers 4 --out /tmp/l.json
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, write_record
from simjobs import run_all

MAILBOX = ("dc-asgd", "lc-asgd", "softsync")
DELAYS = ("constant", "exponential")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", type=int, default=8, help="simulated workers")
    p.add_argument("--model", default="cnn", help="the job's --model")
    p.add_argument("--epochs", type=int, default=8, help="epochs of every run")
    p.add_argument("--seeds", default="11,12", help="comma-separated seeds")
    p.add_argument("--margin", type=float, default=0.01, help="pass: mean accuracy >= ssgd's mean minus this")
    p.add_argument("--jobs", type=int, default=2, help="simulations at a time")
    p.add_argument("--out", default=os.path.join(HERE, "results", "lookahead_sim.json"), help="JSON path")
    return p.parse_args(argv)


def configurations():
    """(name, algorithm, extra flags) of every configuration, ssgd and asgd first."""
    yield "ssgd", "ssgd", []
    yield "asgd", "asgd", []
    for algo in MAILBOX:
        yield f"{algo} --lookahead", algo, ["--lookahead"]
        yield f"{algo} --no-lookahead", algo, ["--no-lookahead"]


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    plan = [(delay, name, seed, ["--algo", algo, "--workers", args.workers, "--model", args.model, "--epochs",
                                 args.epochs, "--seed", seed, "--delay-dist", delay, *flags])
            for delay in DELAYS for name, algo, flags in configurations() for seed in seeds]
    print(f"{len(plan)} simulated runs", file=sys.stderr, flush=True)
    records = run_all([argv for *_, argv in plan], jobs=args.jobs,
                      label=lambda i, r: (f"[{i + 1}/{len(plan)}] {plan[i][0]} {plan[i][1]} seed {plan[i][2]}: "
                                          f"{r.get('final_test_accuracy')}"))
    table = {}
    for (delay, name, seed, _), record in zip(plan, records):
        cell = table.setdefault(delay, {}).setdefault(name, {"seeds": [], "final_test_accuracy": [],
                                                              "staleness_mean": [], "status": []})
        cell["seeds"].append(seed)
        cell["final_test_accuracy"].append(record.get("final_test_accuracy"))
        cell["staleness_mean"].append(record.get("staleness_mean"))
        cell["status"].append(record.get("status"))
    for delay, cells in table.items():
        target = statistics.mean(cells["ssgd"]["final_test_accuracy"]) - args.margin
        for name, cell in cells.items():
            accuracies = [a if a is not None else 0.0 for a in cell["final_test_accuracy"]]
            cell["mean_final_test_accuracy"] = statistics.mean(accuracies)
            cell["passes"] = cell["mean_final_test_accuracy"] >= target and all(s == "ok" for s in cell["status"])
        print(f"{delay} delays (target: ssgd's mean minus {args.margin:g} = {target:.4f})")
        for name, cell in cells.items():
            print(f"  {name:24s} {cell['mean_final_test_accuracy']:.4f}  "
                  f"{'pass' if cell['passes'] else 'FAIL'}  {cell['final_test_accuracy']}")
    write_record({"benchmark": "lookahead_sim", "workers": args.workers, "model": args.model, "epochs": args.epochs,
                  "seeds": seeds, "margin": args.margin, "table": table}, args.out)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

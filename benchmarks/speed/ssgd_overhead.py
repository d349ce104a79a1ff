"""ssgd overhead: hvd_async's ssgd against plain horovod.torch.DistributedOptimizer, same model, data and ranks.

Both run in the same MPI job, alternating (A B, then B A, ...) so drift on a shared machine hits
both alike; each repeat builds a fresh model from the same seed, warms up, then times a fixed
number of steps between barriers. Prints the throughput ratio ours / plain per repeat and the
median with its spread, and writes JSON and a plot to benchmarks/results/.

    python benchmarks/speed/ssgd_overhead.py              # launches itself on --np ranks via mpirun
    mpirun -np 4 python benchmarks/speed/ssgd_overhead.py  # or under an external launcher
    python benchmarks/speed/ssgd_overhead.py --quick --out /tmp/s.json  # bench_check's form (~30 s)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, apply_quick, quick_help, relaunch, save, spread, under_mpirun

QUICK = {"steps": 30, "warmup": 5}  # --quick: shorter runs, the same 8 alternating pairs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="MPI ranks (all workers)")
    p.add_argument("--repeats", type=int, default=8, help="timed pairs (ours, plain)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per run")
    p.add_argument("--batch-size", type=int, default=64, help="samples per step on each worker")
    p.add_argument("--hidden", type=int, default=1024, help="MLP width (parameters ~ 784*h + h*h/2)")
    p.add_argument("--quick", action="store_true", help=quick_help(QUICK))
    p.add_argument("--out", default=os.path.join(HERE, "results", "ssgd_overhead.json"), help="JSON path")
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    for name in ("np", "repeats", "steps", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def timed_run(kind, args, hvd, ha, torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden // 2), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden // 2, 10))
    base = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if kind == "plain":
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        opt = ha.DistributedOptimizer(base, named_parameters=model.named_parameters(), algorithm="ssgd")
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch_size, 784, generator=g)
    y = torch.randint(0, 10, (args.batch_size,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    hvd.allreduce(torch.zeros(1), name=f"barrier.{kind}.start")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    hvd.allreduce(torch.zeros(1), name=f"barrier.{kind}.end")
    seconds = time.perf_counter() - start
    if kind == "ours":
        opt.close()
    return args.steps * args.batch_size * hvd.size() / seconds


def bench(args) -> int:
    import horovod.torch as hvd
    import torch

    import hvd_async as ha

    ha.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))
    rows = []
    for r in range(args.repeats):
        order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
        rate = {kind: timed_run(kind, args, hvd, ha, torch) for kind in order}
        rows.append({"repeat": r, "ours": rate["ours"], "plain": rate["plain"],
                     "ratio": rate["ours"] / rate["plain"]})
        if hvd.rank() == 0:
            print(f"repeat {r}: ours {rate['ours']:.0f}  plain {rate['plain']:.0f} samples/s  "
                  f"ratio {rows[-1]['ratio']:.3f}", flush=True)
    if hvd.rank() == 0:
        s = spread(row["ratio"] for row in rows)
        summary = {"benchmark": "ssgd_overhead", "quick": args.quick, "np": hvd.size(),
                   "batch_size": args.batch_size, "hidden": args.hidden, "steps": args.steps,
                   "warmup": args.warmup, "repeats": args.repeats, "ratio_median": s["median"], "ratio_q1": s["q1"],
                   "ratio_q3": s["q3"], "ratio_min": s["min"], "ratio_max": s["max"], "target": 0.97,
                   "samples_per_second": {k: spread(row[k] for row in rows) for k in ("ours", "plain")},
                   "runs": rows}
        print(f"throughput ratio ours/plain: median {s['median']:.3f} "
              f"(IQR {s['q1']:.3f}..{s['q3']:.3f}, min {s['min']:.3f}, max {s['max']:.3f}) over "
              f"{s['n']} pairs at {hvd.size()} workers; target >= 0.97", flush=True)
        save(summary, args.out, lambda summary, path: plot(rows, summary, path))
    return 0


def plot(rows, summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    reps = [r["repeat"] for r in rows]
    a.plot(reps, [r["plain"] for r in rows], "o-", label="horovod DistributedOptimizer")
    a.plot(reps, [r["ours"] for r in rows], "s-", label="hvd_async ssgd")
    a.set_xlabel("repeat"), a.set_ylabel("samples/s"), a.legend(fontsize=8)
    b.boxplot([r["ratio"] for r in rows])
    b.axhline(summary["target"], color="r", ls="--", label="target 0.97")
    b.set_ylabel("ours / plain"), b.set_xticks([]), b.legend(fontsize=8)
    fig.suptitle(f"ssgd overhead, {summary['np']} workers: median ratio {summary['ratio_median']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not under_mpirun():
        return relaunch(__file__, args.np)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

"""step_cost: what a user's ``opt.step()`` costs under each server-side algorithm, against asgd's in the
same run (issue 58's targets at 16 MiB: dc-asgd and lc-asgd at most 1.3x asgd's, softsync at most 1.1x).

One server and one worker (``--np 2``, this node, windows in shared memory unless ``--mode``); the
model is one fp32 tensor of ``--size`` bytes. The worker builds one ``ha.DistributedOptimizer`` over
``torch.optim.SGD`` (momentum 0.9, weight decay 1e-4) per algorithm, each over a model of its own, sets
a fixed gradient, and then times ``opt.step(loss=...)``, the call a training loop makes: the push, the
server's rule, the answer and the new weights in the model. The algorithms take turns in blocks
(``--blocks`` of ``--steps`` steps each, the order rotated every block), so that drift on a shared
machine hits all alike; each block's mean is divided by asgd's in the same round. Printed and written:
per algorithm the median ms per step over the blocks and the median of the per-round ratios to asgd,
with their spread. Compute model: none (no forward or backward): only what the library adds to a step.

    python benchmarks/speed/step_cost.py               # 16 MiB, asgd against dc-asgd, lc-asgd, softsync, backup-sgd
    python benchmarks/speed/step_cost.py --size 4MB --blocks 5 --out /tmp/s.json
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, MODES, MODES_HELP, mpi_main, parse_size, spread, write_record

ALGOS = "asgd,dc-asgd,lc-asgd,softsync,backup-sgd"
TARGETS = {"dc-asgd": 1.3, "lc-asgd": 1.3, "softsync": 1.1}  # step time over asgd's at 16 MiB (issue 58)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="shm", help=MODES_HELP)
    p.add_argument("--size", default="16MB", help="the model's size (fp32 bytes)")
    p.add_argument("--algos", default=ALGOS, help="comma-separated; asgd first (the others' yardstick)")
    p.add_argument("--blocks", type=int, default=9, help="rounds of blocks (each algorithm once a round)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per block (after 3 untimed)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "step_cost.json"), help="JSON path")
    args = p.parse_args(argv)
    try:
        args.size_bytes = parse_size(args.size)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.algo_list = [a for a in args.algos.split(",") if a]
    if not args.algo_list or args.algo_list[0] != "asgd":
        p.error(f"--algos must start with asgd (the yardstick), got {args.algos!r}")
    if args.blocks < 1 or args.steps < 1:
        p.error(f"--blocks and --steps must be >= 1, got {args.blocks} and {args.steps}")
    args.np = 2
    return args


def bench(args) -> int:
    import torch

    import hvd_async as ha

    ha.init(servers=1)
    if ha.is_server():
        ha.serve()
        return 0
    numel = args.size_bytes // 4
    grad = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 1e-3
    loss = torch.tensor(1.0)
    runs = {}
    for algo in args.algo_list:
        weight = torch.nn.Parameter(torch.zeros(numel))
        opt = ha.DistributedOptimizer(torch.optim.SGD([weight], lr=0.01, momentum=0.9, weight_decay=1e-4),
                                      named_parameters=[("weight", weight)], algorithm=algo)
        weight.grad = grad.clone()
        for _ in range(3):  # (the first pushes: window pages touched, a compiled rule warmed up)
            opt.step(loss=loss)
        runs[algo] = opt
    order = list(args.algo_list)
    blocks = {algo: [] for algo in order}
    for block in range(args.blocks):
        for algo in order[block % len(order):] + order[:block % len(order)]:
            opt = runs[algo]
            start = time.perf_counter()
            for _ in range(args.steps):
                opt.step(loss=loss)
            blocks[algo].append(1e3 * (time.perf_counter() - start) / args.steps)
        print(f"block {block + 1}/{args.blocks}: " + "  ".join(f"{a} {blocks[a][-1]:.2f} ms" for a in order), flush=True)
    for opt in runs.values():
        opt.close()
    rows = {}
    for algo in order:
        ratios = [mine / base for mine, base in zip(blocks[algo], blocks["asgd"])]
        rows[algo] = {"ms_per_step": statistics.median(blocks[algo]), "ms_per_step_spread": spread(blocks[algo]),
                      "ratio_to_asgd": statistics.median(ratios), "ratio_to_asgd_spread": spread(ratios),
                      "target": TARGETS.get(algo) if args.size_bytes == 16 << 20 else None}
        row = rows[algo]
        target = f" (target <= {row['target']})" if row["target"] else ""
        print(f"{algo:>11}: {row['ms_per_step']:8.2f} ms a step, {row['ratio_to_asgd']:5.2f}x asgd's{target}; "
              f"ratio over the rounds {min(ratios):.2f}..{max(ratios):.2f}", flush=True)
    write_record({"benchmark": "step_cost", "mode": args.mode, "model_bytes": args.size_bytes, "workers": 1,
                  "servers": 1, "blocks": args.blocks, "steps_per_block": args.steps,
                  "optimizer": "SGD lr 0.01 momentum 0.9 weight_decay 1e-4", "compute_model": "none (step only)",
                  "targets": TARGETS, "algorithms": rows}, args.out)
    print(f"written {args.out}")
    return 0


def main(argv=None) -> int:
    return mpi_main(__file__, parse_args(argv), bench)


if __name__ == "__main__":
    sys.exit(main())

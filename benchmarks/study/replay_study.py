"""replay_study: real mailbox runs recorded, then replayed in the simulator in their own push order.

The question (issue 17): why do dc-asgd's real runs at 8 workers end below the simulator's? Each
seed runs the reference training job for real (``hvd-async train``, digits CNN, 8 workers + 1
server, ssgd's hyperparameters) with ``HVD_ASYNC_WINDOW_TRACE`` recording every push's place in
the server's order and the weights each answer brought. ``hvd-async simulate --replay`` then runs
the same job with its pushes made to land in that order:

- ``replay`` (same options): if the real path and the simulator compute the same thing, every
  answer matches the recorded one and the final accuracy is the real run's, to the bit;
- each ``--variants`` entry (extra flags, e.g. ``--lam 0``) replays the same order with one thing
  changed: a controlled comparison on the real orders, with no timing noise between the arms;
- ``constant`` and ``exponential``: the simulator's own orders (strict round robin; exponential
  compute times), for comparison.

Prints a table per seed and the means; writes JSON (with provenance) to ``--out``.

    python benchmarks/study/replay_study.py                                    # dc-asgd, seeds 11-15
    python benchmarks/study/replay_study.py --algo lc-asgd --seeds 11,12 --variants='--lam 0;--no-lookahead'
"""
import argparse
import collections
import os
import shlex
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, cli_job, train_job, write_record

DEFAULT_VARIANTS = "--lam 0;--dc-compensate uncovered;--no-lookahead;--momentum 0.8"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algo", default="dc-asgd", choices=("dc-asgd", "lc-asgd", "asgd"))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--model", default="cnn", choices=("mlp", "cnn"))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seeds", default="11,12,13,14,15", help="comma-separated seeds")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="';'-separated extra flags, each replayed on every recorded order ('' for none)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--out", default=os.path.join(HERE, "results", "replay_study.json"))
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not args.seeds:
        p.error("--seeds names no seed")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    args.variants = [v.strip() for v in args.variants.split(";") if v.strip()]
    return args


def simulate(args, seed, flags, timeout) -> dict:
    """``hvd-async simulate`` of the same job with ``flags`` added; its metrics record."""
    return cli_job("simulate", ["--algo", args.algo, "--workers", args.workers, "--model", args.model,
                                "--epochs", args.epochs, "--seed", seed, *flags], timeout=timeout)


def summary_of(record) -> dict:
    out = {"final_test_accuracy": record["final_test_accuracy"], "final_train_loss": record["final_train_loss"],
           "train_loss_per_epoch": [round(h["train_loss"], 4) for h in record["history"]]}
    replay = record.get("simulator", {}).get("replay")
    if replay:
        out["answers_matched"] = f"{replay['pulls_matched']} of {replay['pulls']}"
    return out


def order_of(trace_dir) -> dict:
    """The recorded order's shape: each push's staleness, counted."""
    from hvd_async.transport.trace import Trace

    trace = Trace(trace_dir)
    staleness = [e["staleness"][0] for rank in trace.events for e in trace.events[rank] if e["op"] == "push"]
    counts = collections.Counter(staleness)
    return {"pushes": trace.check_order(), "staleness_mean": round(statistics.mean(staleness), 3),
            "staleness_counts": {str(k): counts[k] for k in sorted(counts)},
            "share_at_workers_minus_one": round(counts.get(trace.workers - 1, 0) / len(staleness), 3)}


def run_seed(args, seed) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        os.environ["HVD_ASYNC_WINDOW_TRACE"] = trace
        try:
            real = train_job(["--algo", args.algo, "--np", args.workers + 1, "--servers", 1, "--model", args.model,
                              "--epochs", args.epochs, "--seed", seed], timeout=args.timeout)
        finally:
            del os.environ["HVD_ASYNC_WINDOW_TRACE"]
        row = {"seed": seed, "real": summary_of(real), "order": order_of(trace)}
        row["replay"] = summary_of(simulate(args, seed, ["--replay", trace], args.timeout))
        for flags in args.variants:
            row[f"replay {flags}"] = summary_of(simulate(args, seed, ["--replay", trace, *shlex.split(flags)],
                                                         args.timeout))
    for dist in ("constant", "exponential"):
        row[dist] = summary_of(simulate(args, seed, ["--delay-dist", dist], args.timeout))
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    arms = ["real", "replay", *[f"replay {v}" for v in args.variants], "constant", "exponential"]
    rows = []
    for seed in args.seeds:
        start = time.time()
        row = run_seed(args, seed)
        rows.append(row)
        print(f"seed {seed} ({time.time() - start:.0f} s): "
              + ", ".join(f"{arm} {row[arm]['final_test_accuracy']:.4f}" for arm in arms)
              + f"; replay matched {row['replay'].get('answers_matched')}", flush=True)
    means = {arm: round(statistics.mean(r[arm]["final_test_accuracy"] for r in rows), 4) for arm in arms}
    print("means over the seeds: " + ", ".join(f"{arm} {means[arm]:.4f}" for arm in arms))
    summary = {"benchmark": "replay_study", "algo": args.algo, "workers": args.workers, "model": args.model,
               "epochs": args.epochs, "seeds": args.seeds, "variants": args.variants, "arms": arms,
               "mean_final_test_accuracy": means, "runs": rows}
    write_record(summary, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""convergence: every algorithm at ssgd's hyperparameters, against ssgd, in real runs under mpirun.

The question a user asks before switching: keep the learning rate, momentum and batch size that
trained the model with ssgd, change the algorithm's name, and do I get the same model? Each run is
the reference training job (``hvd-async train``, scikit-learn's digits, defaults: lr 0.1, momentum
0.9, batch 32 per worker, 8 epochs) with one flag changed, ``--algo``; parameter-server algorithms
get one server rank on top of the workers. Settings (``--settings``):

- ``mlp-4``, ``cnn-4``: 4 workers, the digits MLP and CNN;
- ``cnn-8``: 8 workers;
- ``cnn-4-straggler``: 4 workers, worker 0's steps three times as long (``--straggler 0=3``);
- ``fmnist-4``, ``fmnist-8``, ``fmnist-4-straggler``: the same on Fashion-MNIST with LeNet at the
  hyperparameters chosen for ssgd on its validation split (benchmarks/protocol.md's grid);
- ``fmnist-v2-W``, ``fmnist-v2-W-steady``, ``fmnist-v2-W-transient`` (W = 4, 8; 16, 32, 64 with
  ``--simulate`` only): benchmarks/protocol_v2.md's grid, on emulated accelerators (``--compute-ms``),
  with no straggler, worker 0 3x slow, or every step's device time drawn from a heavy-tailed
  distribution. In the steady settings the pseudo-algorithm ``ssgd-loo`` is ssgd on the other W-1
  workers with no straggler, timed against the same target.

``cnn-4-straggler`` and ``fmnist-4-straggler`` are v1-only: their records were taken when
``--straggler`` stretched the real CPU compute; it now stretches only ``--compute-ms``, so they are
kept to read their records (``--report``) and refused for new runs.

The criterion, fixed before the runs: in every setting, an algorithm **passes** when its mean final
test accuracy over the seeds is at least ssgd's mean minus ``--margin`` (1 point) and no run
diverged (final train loss not finite, or final test accuracy below ``--diverged-below``, 0.5).
Beside the verdict: each run's final accuracy and loss, and the seconds until its test
accuracy first reached ssgd's mean final accuracy minus the margin (None: never, within the
epochs): the training clock at the first evaluation that did (a job with ``--evals-per-epoch K``
evaluates K times an epoch; records from before the evaluations list: wall seconds at epoch ends). ``--flags`` adds flags to every run but ssgd's (ablations: ``--flags="--push-rate full"``).

Results are written after every run (a rerun with the same ``--out`` skips the runs already in it,
``--fresh`` starts over), as JSON with its provenance and a plot, in benchmarks/results/.

    python benchmarks/study/convergence.py                                   # the whole study, about an hour here
    python benchmarks/study/convergence.py --settings cnn-4 --algos ssgd,asgd --seeds 11,12
    python benchmarks/study/convergence.py --quick --out /tmp/c.json         # a tiny form (about a minute)
    python benchmarks/study/convergence.py --settings fmnist-v2-16-steady --simulate --algos asgd --seeds 201
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, apply_quick, cli_job, provenance, pyplot, quick_help, train_job, write_record
from hvd_async import registry
from hvd_async.metrics import accuracy_curve, time_to_target as time_to

# every algorithm, in the registry's order; a pre-registered grid names its own in its --algos (its order)
ALGORITHMS = registry.names()
SERVERLESS = registry.serverless()  # everything else gets one server rank on top of the workers
FMNIST = ["--dataset", "fashion-mnist"]  # its defaults (lenet, lr 0.02) chosen for ssgd on the validation split
SETTINGS = {  # name -> (model, workers, more flags (data, straggler), seeds used by default)
    "mlp-4": ("mlp", 4, [], 5),
    "cnn-4": ("cnn", 4, [], 5),
    "cnn-8": ("cnn", 8, [], 2),
    "cnn-4-straggler": ("cnn", 4, ["--straggler", "0=3"], 2),
    "fmnist-4": ("lenet", 4, FMNIST, 5),  # benchmarks/protocol.md's grid
    "fmnist-8": ("lenet", 8, FMNIST, 5),
    "fmnist-4-straggler": ("lenet", 4, FMNIST + ["--straggler", "0=3"], 5),
}
# --straggler without --compute-ms stretched the real CPU compute when these ran; it is refused now
# (the straggler stretches the emulated device time only): their records stand, no new runs
V1_ONLY = ("cnn-4-straggler", "fmnist-4-straggler")

# benchmarks/protocol_v2.md's grid: one emulated accelerator per worker (--compute-ms), 12
# evaluations an epoch; none, a steady 3x straggler (worker 0), or transient stragglers (every
# worker's every step drawn from one heavy-tailed distribution)
V2_DEVICE = FMNIST + ["--compute-ms", "80", "--evals-per-epoch", "12"]
V2_KINDS = {"": [], "-steady": ["--straggler", "0=3"], "-transient": ["--delay-dist", "pareto", "--delay-shape", "3"]}
V2_REAL, V2_SIMULATED = (4, 8), (16, 32, 64)  # workers: real runs (and the simulator's agreement); simulator only
V2_SEEDS = (201, 202, 203, 204, 205)  # fresh: used by no record before protocol_v2.md
for _workers in V2_REAL + V2_SIMULATED:
    for _kind, _flags in V2_KINDS.items():
        SETTINGS[f"fmnist-v2-{_workers}{_kind}"] = ("lenet", _workers, V2_DEVICE + _flags, 5)
LEAVE_ONE_OUT = "ssgd-loo"  # steady settings: ssgd on the workers but the slow one, no straggler, same target
V2_SYNC_BASELINES = ("ssgd", "backup-sgd", "lb-sgd")  # (b2)'s synchronous baselines
CPU_BOUND = 0.05  # protocol v2 (amended): a run in which a worker's main thread waited for a core this share of its
# training time or more makes its cell CPU-bound (RunMetrics.core_wait)
SEEDS = (11, 12, 13, 14, 15)
QUICK = {"settings": "mlp-4", "algos": "ssgd,asgd", "seeds": "11", "epochs": 2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--settings", default=",".join(s for s in SETTINGS if s not in V1_ONLY and not s.startswith("fmnist-v2-")),
                   help=f"comma-separated, of: {', '.join(SETTINGS)}")
    p.add_argument("--algos", default=",".join(ALGORITHMS),
                   help=f"comma-separated; ssgd is always run (the yardstick); {LEAVE_ONE_OUT} (steady v2 settings): "
                        "ssgd on the workers but the slow one")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds for every setting (default: the first 5 of "
                        f"{','.join(map(str, SEEDS))} at 4 workers, 2 for cnn-8 and cnn-4-straggler; the v2 "
                        f"settings: {','.join(map(str, V2_SEEDS))})")
    p.add_argument("--epochs", type=int, default=8, help="epochs of every run")
    p.add_argument("--margin", type=float, default=0.01, help="pass: mean final accuracy >= ssgd's mean minus this")
    p.add_argument("--speedup", type=float, default=2.0,
                   help="straggler settings: pass (b) when the median time to target is ssgd's over this or less")
    p.add_argument("--diverged-below", type=float, default=0.5,
                   help="a run whose final test accuracy is below this (or whose loss is not finite) diverged")
    p.add_argument("--flags", default="", help="extra flags for every run except ssgd's (one string)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a run counts as failed")
    p.add_argument("--simulate", action="store_true",
                   help="run each run in hvd-async simulate (virtual clock, --workers) instead of the real job; "
                        "the v2 settings at 16, 32 and 64 workers run only so")
    p.add_argument("--quick", action="store_true",
                   help="a tiny form, to check the script (about a minute): " + quick_help(QUICK).split(": ", 1)[1])
    p.add_argument("--fresh", action="store_true", help="ignore the runs already in --out")
    p.add_argument("--report", action="store_true",
                   help="run nothing: print the verdicts and a Markdown table of the runs in --out")
    p.add_argument("--out", default=os.path.join(HERE, "results", "convergence.json"), help="JSON path")
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    args.setting_list = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.setting_list if s not in SETTINGS]
    if unknown:
        p.error(f"unknown setting(s) {', '.join(unknown)}; choose from: {', '.join(SETTINGS)}")
    old = [s for s in args.setting_list if s in V1_ONLY]
    if old and not args.report:
        p.error(f"{', '.join(old)}: v1-only (--straggler then stretched the real CPU compute; it now stretches "
                f"--compute-ms only): their records stand, --report reads them; new straggler runs are "
                f"benchmarks/protocol_v2.md's fmnist-v2-*-steady settings")
    simulated = [s for s in args.setting_list if v2_simulated_only(s)]
    if simulated and not (args.simulate or args.report):
        p.error(f"{', '.join(simulated)}: simulator only (benchmarks/protocol_v2.md); add --simulate")
    args.algo_list = ["ssgd"] + [a for a in args.algos.split(",") if a and a != "ssgd"]
    bad = [a for a in args.algo_list if a not in ALGORITHMS and a != LEAVE_ONE_OUT]
    if bad:
        p.error(f"unknown algorithm(s) {', '.join(bad)}; choose from: {', '.join(ALGORITHMS)}, {LEAVE_ONE_OUT}")
    if LEAVE_ONE_OUT in args.algo_list and not any(kind(s) == "steady" for s in args.setting_list):
        p.error(f"{LEAVE_ONE_OUT} leaves the slow worker out: it runs in the steady settings only "
                f"({', '.join(s for s in SETTINGS if kind(s) == 'steady' and s not in V1_ONLY)})")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s] if args.seeds else None
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give integers separated by commas, e.g. 11,12")
    if args.epochs < 1 or not 0 <= args.margin < 1:
        p.error("--epochs must be >= 1 and --margin in [0, 1)")
    return args


def v2_simulated_only(setting) -> bool:
    return setting.startswith("fmnist-v2-") and SETTINGS[setting][1] not in V2_REAL


def kind(setting):
    """"steady" (one worker slowed for the whole run), "transient" (a delay distribution), or None."""
    flags = SETTINGS[setting][2]
    return "steady" if "--straggler" in flags else "transient" if "--delay-dist" in flags else None


def seeds_for(args, setting):
    default = V2_SEEDS if setting.startswith("fmnist-v2-") else SEEDS
    return args.seed_list or list(default[:SETTINGS[setting][3]])


def flags_for(args, setting, algo, seed):
    model, workers, more, _ = SETTINGS[setting]
    if algo == LEAVE_ONE_OUT:  # ssgd without the slow worker: one worker fewer, no straggler
        at = more.index("--straggler")
        algo, workers, more = "ssgd", workers - 1, more[:at] + more[at + 2:]
    servers = 0 if algo in SERVERLESS else 1
    size = ["--workers", workers] if args.simulate else ["--np", workers + servers]
    flags = ["--algo", algo, *size, "--servers", servers, "--model", model,
             "--epochs", args.epochs, "--seed", seed, *more]
    return flags + (shlex.split(args.flags) if algo != "ssgd" else [])


def key(setting, algo, seed):
    return f"{setting}/{algo}/{seed}"


def run_one(args, setting, algo, seed) -> dict:
    flags = flags_for(args, setting, algo, seed)
    start = time.time()
    try:
        record = (cli_job("simulate", flags, timeout=args.timeout) if args.simulate
                  else train_job(flags, timeout=args.timeout))
    except (SystemExit, Exception) as failure:  # a failed or hung run is a result, not the end of the study
        return {"setting": setting, "algo": algo, "seed": seed, "failed": str(failure)[-500:],
                "flags": list(map(str, flags)), "seconds": round(time.time() - start, 1)}
    curve = accuracy_curve(record)
    return {"setting": setting, "algo": algo, "seed": seed, "flags": list(map(str, flags)),
            "final_test_accuracy": record["final_test_accuracy"], "final_train_loss": record["final_train_loss"],
            "wall_seconds": record["wall_seconds"], "samples_per_second": record.get("samples_per_second"),
            "curve": curve, "staleness_mean": record.get("staleness_mean"),
            "compensation_relative": record.get("compensation_relative"),
            "epochs_at": [e["epoch"] - 1 + e["at"] for e in record.get("evaluations", [])],  # each evaluation's place
            **{name: record.get(name) for name in RUN_FIGURES}, "simulated": args.simulate,
            "seconds": round(time.time() - start, 1)}


RUN_FIGURES = ("train_seconds", "eval_seconds", "samples", "samples_applied", "dropped_gradients",
               "cpu_utilisation", "worker_cpu_seconds", "core_wait", "worker_core_wait", "workers")  # kept from each run's metrics


def samples_to_target(run, target):
    """Samples applied by the first evaluation at or above ``target`` (None: never): the evaluation's
    place in epochs times the run's applied samples per epoch (records from before the evaluations
    list: at epoch ends)."""
    places = run.get("epochs_at") or list(range(1, len(run.get("curve", [])) + 1))
    epochs = max(places, default=0)
    applied = run.get("samples_applied")  # (records from before it was kept: None)
    if applied is None:
        return None
    at = next((place for place, (_, accuracy) in zip(places, run.get("curve", [])) if accuracy >= target), None)
    return None if at is None or not epochs else round(applied * at / epochs)


def diverged(run, args) -> bool:
    if "failed" in run:
        return True
    loss = run["final_train_loss"]
    return loss is None or not math.isfinite(loss) or run["final_test_accuracy"] < args.diverged_below


def summarize(args, runs) -> dict:
    table = {}
    for setting in args.setting_list:
        mine = [r for r in runs.values() if r["setting"] == setting]
        ssgd = [r["final_test_accuracy"] for r in mine if r["algo"] == "ssgd" and "failed" not in r]
        if not ssgd:
            continue
        reference = statistics.mean(ssgd)
        target = reference - args.margin
        rows = {}
        for algo in args.algo_list:
            these = sorted((r for r in mine if r["algo"] == algo), key=lambda r: r["seed"])
            if not these:
                continue
            finals = [r.get("final_test_accuracy") for r in these if "failed" not in r]
            mean = statistics.mean(finals) if finals else None
            n_div = sum(diverged(r, args) for r in these)
            times = [time_to(r["curve"], target) if "curve" in r else None for r in these]
            reached = [t for t in times if t is not None]
            samples = [samples_to_target(r, target) for r in these]
            got = [n for n in samples if n is not None]
            rows[algo] = {"seeds": [r["seed"] for r in these], "final_test_accuracy": finals,
                          "mean_final_test_accuracy": mean, "gap_to_ssgd": None if mean is None else mean - reference,
                          "final_train_loss": [r.get("final_train_loss") for r in these],
                          "diverged": n_div, "seconds_to_target": times,
                          "median_seconds_to_target": statistics.median(reached) if reached else None,
                          "samples_per_second": [r.get("samples_per_second") for r in these if "failed" not in r],
                          "samples_to_target": samples, "median_samples_to_target": statistics.median(got) if got else None,
                          "cpu_utilisation": [r.get("cpu_utilisation") for r in these if "failed" not in r],
                          "core_wait": [r.get("core_wait") for r in these if "failed" not in r],
                          "passes": mean is not None and mean >= target and n_div == 0}
        speeds(rows)
        table[setting] = {"ssgd_mean": reference, "target": target, "algorithms": rows}
        if setting.startswith("fmnist-v2-"):
            table[setting].update(v2_criterion(setting, rows))
        elif "--straggler" in SETTINGS[setting][2]:
            sooner(rows, args.speedup)
    return table


def median_time(row) -> float:
    """The median time to target over the seeds, a seed that never reached it counting as never (inf)."""
    times = [math.inf if t is None else t for t in row["seconds_to_target"]]
    return statistics.median(times) if times else math.inf


def _median(values):
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def speeds(rows) -> None:
    """Beside every algorithm, against ssgd's: the speedup to target (ssgd's median time over its own)
    and the throughput ratio (its median samples/s over ssgd's)."""
    reference, rate = (median_time(rows["ssgd"]), _median(rows["ssgd"]["samples_per_second"])) if "ssgd" in rows \
        else (math.inf, None)
    for row in rows.values():
        mine, own = median_time(row), _median(row["samples_per_second"])
        row["speedup_to_target"] = reference / mine if math.isfinite(reference) and math.isfinite(mine) else None
        row["throughput_ratio"] = own / rate if own and rate else None


def v2_criterion(setting, rows) -> dict:
    """benchmarks/protocol_v2.md's (b1) (steady straggler) or (b2) (transient stragglers) for a cell,
    and whether the cell is CPU-bound (a real run in which a worker's main thread waited for a core
    ``CPU_BOUND`` of its training time or more: its times are not judged). The best asynchronous
    algorithm: the lowest median time to target."""
    busy = [u for row in rows.values() for u in row["cpu_utilisation"] if u is not None]
    waits = [w for row in rows.values() for w in row.get("core_wait", []) if w is not None]
    out = {"max_cpu_utilisation": max(busy, default=None), "max_core_wait": max(waits, default=None),
           "cpu_bound": any(w >= CPU_BOUND for w in waits)}
    what = kind(setting)
    if what is None:
        return out
    asynchronous = [a for a in rows if a in registry.asynchronous()]
    if not asynchronous:
        return out
    best = min(asynchronous, key=lambda a: median_time(rows[a]))
    t = median_time(rows[best])
    if what == "steady":  # at most half of ssgd's, and at most 1.1x lb-sgd's and ssgd-loo's
        bounds = {"ssgd": 0.5, "lb-sgd": 1.1, LEAVE_ONE_OUT: 1.1}
    else:  # at most 1/1.3 of the best synchronous baseline's
        synchronous = [a for a in V2_SYNC_BASELINES if a in rows]
        bounds = {min(synchronous, key=lambda a: median_time(rows[a])): 1 / 1.3} if synchronous else {}
    against = {a: median_time(rows[a]) if a in rows else None for a in bounds}
    judged = all(v is not None for v in against.values()) and bool(bounds)
    passes = judged and math.isfinite(t) and all(t <= bounds[a] * v for a, v in against.items())
    finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731 (JSON has no inf)
    out.update({"criterion": "b1" if what == "steady" else "b2", "best": best, "best_median": finite(t),
                "against": {a: {"median": finite(v), "bound": bounds[a]} for a, v in against.items()},
                "passes": None if out["cpu_bound"] or not judged else passes})
    return out


def sooner(rows, speedup) -> None:
    """Criterion (b), protocol v1's straggler setting: an algorithm's median time to target (a seed that
    never reaches it counts as never) is at most ssgd's over ``speedup`` (:func:`speeds` first)."""
    for row in rows.values():
        row["sooner"] = row["speedup_to_target"] is not None and row["speedup_to_target"] >= speedup
    if "ssgd" in rows:
        rows["ssgd"]["sooner"] = None  # the yardstick


def report(table, args) -> None:
    v1_straggler = any("sooner" in row for entry in table.values() for row in entry["algorithms"].values())
    print(f"\ncriterion (a): mean final test accuracy >= ssgd's mean - {args.margin:g}, and no run diverged "
          f"(accuracy < {args.diverged_below:g} or loss not finite)"
          + (f"; (b), protocol v1's straggler settings: median time to ssgd's mean - {args.margin:g} at most "
             f"ssgd's over {args.speedup:g}" if v1_straggler else "")
          + ("; protocol v2's cells: each cell's own criterion, below it"
             if any("criterion" in entry for entry in table.values()) else ""))
    for setting, entry in table.items():
        print(f"\n{setting}: ssgd's mean {entry['ssgd_mean']:.4f}, target {entry['target']:.4f}")
        for algo, row in entry["algorithms"].items():
            finals = " ".join(f"{a:.3f}" for a in row["final_test_accuracy"])
            mean = "failed" if row["mean_final_test_accuracy"] is None else f"{row['mean_final_test_accuracy']:.4f}"
            t = row["median_seconds_to_target"]
            sooner = ""
            if "sooner" in row:
                verdict = {True: "PASS", False: "FAIL", None: "-"}[row["sooner"]]
                sooner = f"  (b) {verdict}"
            x, ratio, n = row.get("speedup_to_target"), row.get("throughput_ratio"), row.get("median_samples_to_target")
            rates = [r for r in row["samples_per_second"] if r]
            print(f"  {algo:10s} mean {mean}  [{finals}]  diverged {row['diverged']}  "
                  f"to target {'-' if t is None else f'{t:.1f} s'}  (a) {'PASS' if row['passes'] else 'FAIL'}"
                  f"  speedup {'-' if x is None else f'{x:.2f}x'}  samples/s {statistics.median(rates) if rates else 0:.0f}"
                  f" (ratio {'-' if ratio is None else f'{ratio:.2f}'})  samples to target {'-' if n is None else f'{n:.0f}'}"
                  f"{sooner}")
        if "criterion" in entry:
            verdict = {True: "PASS", False: "FAIL", None: "not judged"}[entry["passes"]]
            seconds = lambda t: "never" if t is None else f"{t:.1f} s"  # noqa: E731
            print(f"  ({entry['criterion']}) best asynchronous: {entry['best']} {seconds(entry['best_median'])}; "
                  + ", ".join(f"{a} {seconds(v['median'])} (bound x{v['bound']:.3g})" for a, v in entry["against"].items())
                  + f": {verdict}")
        if entry.get("cpu_bound"):
            print(f"  CPU-bound: a worker's main thread waited for a core {100 * entry['max_core_wait']:.1f}% of its "
                  f"training time (bound {100 * CPU_BOUND:g}%)")
        elif entry.get("max_core_wait") is not None:
            print(f"  cores: at most {100 * entry['max_core_wait']:.1f}% of a worker's training time waiting for one "
                  f"(bound {100 * CPU_BOUND:g}%); at most {entry['max_cpu_utilisation']:.2f} cores busy")
    failing = [f"{s}/{a}" for s, e in table.items() for a, r in e["algorithms"].items() if not r["passes"]]
    failing += [f"{s}/{a} (b)" for s, e in table.items() for a, r in e["algorithms"].items()
                if a != "ssgd" and r.get("sooner") is False]
    failing += [f"{s} ({e['criterion']})" for s, e in table.items() if e.get("passes") is False]
    print(f"\n{'every algorithm passes' if not failing else 'failing: ' + ', '.join(failing)}")


def load(args) -> dict:
    if args.fresh or not os.path.exists(args.out):
        return {}
    with open(args.out) as f:
        old = json.load(f)
    if (old.get("epochs"), old.get("flags"), old.get("simulate", False)) != (args.epochs, args.flags, args.simulate):
        print(f"{args.out} holds runs with other --epochs, --flags or --simulate: starting over", file=sys.stderr)
        return {}
    args.parts = old.get("parts", [])
    return {key(r["setting"], r["algo"], r["seed"]): r for r in old.get("runs", [])}


def write(args, runs) -> dict:
    summary = {"benchmark": "convergence", "epochs": args.epochs, "margin": args.margin, "speedup": args.speedup,
               "flags": args.flags, "simulate": args.simulate, "diverged_below": args.diverged_below,
               "settings": {s: SETTINGS[s][:3] for s in args.setting_list},
               "runs": list(runs.values()), "table": summarize(args, runs)}
    # each invocation that added runs (a part of a grid): its command, and commit and tree as it started
    summary["parts"] = args.parts + [{**args.part, "runs": args.new_runs}]
    write_record(summary, args.out)
    return summary


def markdown(table) -> str:
    """The table as Markdown: one row per algorithm, one column per setting (mean [min-max], diverged)."""
    settings = list(table)
    algos = list(dict.fromkeys(a for entry in table.values() for a in entry["algorithms"]))
    lines = ["| algorithm | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for algo in algos:
        cells = []
        for setting in settings:
            row = table[setting]["algorithms"].get(algo)
            if row is None or row["mean_final_test_accuracy"] is None:
                cells.append("-")
                continue
            finals = row["final_test_accuracy"]
            cell = f"{row['mean_final_test_accuracy']:.3f} [{min(finals):.3f}-{max(finals):.3f}]"
            if row["diverged"]:
                cell += f", {row['diverged']} diverged"
            cells.append(("**" + cell + "**") if row["passes"] or algo == "ssgd" else cell)
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        with open(args.out) as f:
            summary = json.load(f)
        args.margin, args.diverged_below = summary["margin"], summary["diverged_below"]
        args.speedup = summary.get("speedup", args.speedup)
        report(summary["table"], args)
        print("\n" + markdown(summary["table"]))
        return 0
    args.parts, args.new_runs = [], 0
    prov = provenance()
    args.part = {"command": prov["command"], "commit": prov["commit"], "tree_clean": prov["tree_clean"],
                 "started_utc": prov["date_utc"]}
    runs = load(args)
    todo = [(s, a, seed) for s in args.setting_list for seed in seeds_for(args, s) for a in args.algo_list
            if key(s, a, seed) not in runs and (a != LEAVE_ONE_OUT or kind(s) == "steady")]
    print(f"{len(todo)} run(s) to do ({len(runs)} already in {args.out})", flush=True)
    for i, (setting, algo, seed) in enumerate(todo, 1):
        run = runs[key(setting, algo, seed)] = run_one(args, setting, algo, seed)
        args.new_runs = i
        what = (f"FAILED: {run['failed'][-200:]}" if "failed" in run else
                f"accuracy {run['final_test_accuracy']:.4f} loss {run['final_train_loss']:.4f}")
        print(f"[{i}/{len(todo)}] {setting} {algo} seed {seed}: {what} ({run['seconds']:.0f} s)", flush=True)
        write(args, runs)
    summary = write(args, runs)
    report(summary["table"], args)
    plot(summary, os.path.splitext(args.out)[0] + ".png")
    print(f"\nwritten: {args.out}", flush=True)
    return 0


def plot(summary, path):
    plt = pyplot()
    table = summary["table"]
    fig, axes = plt.subplots(1, max(1, len(table)), figsize=(4.5 * max(1, len(table)), 4), squeeze=False)
    for ax, (setting, entry) in zip(axes[0], table.items()):
        algos = list(entry["algorithms"])
        for x, algo in enumerate(algos):
            finals = entry["algorithms"][algo]["final_test_accuracy"]
            ax.scatter([x] * len(finals), finals, s=14, color="C0" if entry["algorithms"][algo]["passes"] else "C3")
        ax.axhline(entry["ssgd_mean"], color="k", lw=0.8)
        ax.axhline(entry["target"], color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(algos)))
        ax.set_xticklabels(algos, rotation=60, fontsize=8)
        ax.set_ylim(max(0.0, entry["target"] - 0.1), 1.0)
        ax.set_title(setting)
        ax.set_ylabel("final test accuracy")
    fig.suptitle(f"at ssgd's hyperparameters, {summary['epochs']} epochs (line: ssgd's mean; dashed: minus the margin)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

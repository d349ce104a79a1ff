"""Randomized stress of the asynchronous algorithms: many short jobs, each bounded by a timeout.

Each case draws an algorithm (every block of 8 cases holds each asynchronous algorithm once, in a
random order), a world size of 2 to 5, servers (1 or 2 where the algorithm uses them and ranks
allow), shared memory on or off, and random delays. Two tests per case:

- ``test_no_lost_update``: tests/mpi/stress_job.py pushes integer gradients with lr=1 through the
  algorithm's real strategy, with random sleeps on every rank, and checks its invariant (exact for
  the parameter-server family and od-sgd; to fp32 rounding for easgd's centre and push-sum's mass;
  none for pull gossip, which only has to finish);
- ``test_job``: a 1 or 2 epoch ``hvd-async train`` with random options, ``--compute-ms`` and a
  ``--straggler``: it exits 0, its metrics JSON is valid and sane, and no process is left behind.

Short by default (CI: 4 cases, seed 3). The long version is run by hand: ``STRESS_RUNS=50 pytest
tests/test_stress.py -s``. The cases follow ``STRESS_SEED`` (3 for the short run, a fresh one for a long run unless given);
every failure says how to re-run its case alone. With ``STRESS_RESULTS=FILE`` (``make stress``: in
benchmarks/results/) the seed, every case's draw and outcome, and the provenance go to FILE as JSON,
rewritten after each test so an interrupted run keeps what it did.
"""
import json
import math
import os
import random
import sys
import time

import pytest

from hvd_async import registry
from procs import NO_SHM, mpirun, python, run

pytestmark = pytest.mark.stress

ALGORITHMS = registry.asynchronous()
NO_SERVER = registry.serverless()  # od-sgd: with servers (window exchange) or without (allreduce)
RUNS = int(os.environ.get("STRESS_RUNS", "4"))
# CI's short run is the same every time (seed 3: four different algorithms, each with two workers or more
# algorithms); a long run by hand draws a fresh seed unless given one.
SEED = int(os.environ.get("STRESS_SEED", "3" if "STRESS_RUNS" not in os.environ
                          else str(random.SystemRandom().randrange(10 ** 6))))
PUSHES = 100  # per worker in the lost-update job (a random count between half this and this)
TIMEOUT = 300  # seconds for one job: far beyond a loaded machine's worst; a hang is a bug


def make_case(index: int) -> dict:
    """Case ``index`` of the session's seed: everything random about it, drawn from (SEED, index)."""
    block = random.Random(f"{SEED}:block{index // len(ALGORITHMS)}")
    order = list(ALGORITHMS)
    block.shuffle(order)
    rng = random.Random(f"{SEED}:case{index}")
    algo, np = order[index % len(ALGORITHMS)], rng.randint(2, 5)
    if algo in NO_SERVER:
        servers = 0
    elif algo == "od-sgd":
        servers = rng.choice([0, 1, 1, 2] if np >= 4 else [0, 1])
    else:
        servers = rng.choice([1, 2]) if np >= 4 else 1  # 2 servers only where 2 workers remain
    workers = np - servers
    case = {"index": index, "seed": SEED, "algo": algo, "np": np, "servers": servers,
            "no_shm": rng.random() < 0.5, "job_seed": rng.randrange(10 ** 6),
            "max_sleep_ms": rng.choice([0.0, 0.5, 2.0, 5.0]), "epochs": rng.choice([1, 2]),
            "compute_ms": rng.choice([0, 2, 5])}
    case["straggler"] = f"{rng.randrange(workers)}={rng.choice([2, 3])}" if rng.random() < 0.6 else None
    if not case["compute_ms"]:  # a straggler stretches the injected device time: none to stretch
        case["straggler"] = None
    case["options"] = _job_options(algo, rng, workers, servers)
    return case


def _job_options(algo, rng, workers, servers):
    """The training job's algorithm flags, drawn at random among the valid ones."""
    if algo == "asgd":
        return ["--pull-every", str(rng.choice([1, 1, 2, 4]))]
    if algo == "dc-asgd":
        return ["--lam", str(rng.choice([0.0, 0.04, 0.2]))] + (["--dc-adaptive"] if rng.random() < 0.5 else [])
    if algo == "lc-asgd":
        return (["--predictor", rng.choice(["linear", "mlp"]), "--r-min", str(rng.choice([0.25, 0.5]))]
                + (["--no-loss-term"] if rng.random() < 0.25 else []))
    if algo == "softsync":
        return ["--softsync-n", str(rng.randint(1, workers))]
    if algo == "dbs-asgd":
        return ["--dbs-every", str(rng.choice([2, 5, 10]))]
    if algo == "od-sgd":
        exchange = ["--od-exchange", "window" if servers else "allreduce"]
        return exchange + ["--local-lr", str(rng.choice([0.0, 0.05, 0.1]))]
    if algo == "easgd":
        return (["--tau", str(rng.randint(1, 4))] + (["--easgd-sync"] if rng.random() < 0.3 else [])
                + (["--alpha", str(rng.choice([0.1, 0.3]))] if rng.random() < 0.5 else []))
    return ["--gossip-variant", rng.choice(["pull", "push"]), "--gossip-every", str(rng.choice([1, 2])),
            "--gossip-topology", rng.choice(["random", "ring", "exponential"])]


CASES = [make_case(i) for i in range(RUNS)]


def _case_id(case: dict) -> str:
    return (f"case{case['index']:03d}-{case['algo']}-np{case['np']}-s{case['servers']}-"
            f"{'noshm' if case['no_shm'] else 'shm'}")


def _describe(case: dict, part: str) -> str:
    return (f"{part}: {json.dumps(case)}\nre-run this case alone: STRESS_SEED={SEED} STRESS_RUNS={RUNS} "
            f"python -m pytest tests/test_stress.py -s -k '{_case_id(case)}'")


def _say(line: str) -> None:
    print(f"\nSTRESS {line}", flush=True)


RESULTS = os.environ.get("STRESS_RESULTS")
BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
_DONE: list = []


def _write_results() -> None:
    """The run so far, with its provenance (benchmarks/common.py's record writer)."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    import common  # benchmarks/ is not a package

    outcomes = [entry["outcome"] for entry in _DONE]
    common.write_record({
        "benchmark": "stress", "seed": SEED, "runs": RUNS, "tests_planned": 2 * RUNS,
        "passed": outcomes.count("passed"), "failed": len(outcomes) - outcomes.count("passed"),
        "results": _DONE}, RESULTS, command=f"STRESS_RUNS={RUNS} STRESS_SEED={SEED} STRESS_RESULTS={RESULTS} "
                                            "python -m pytest tests/test_stress.py -q -p no:cacheprovider")


@pytest.fixture(autouse=True)
def stress_facts(request):
    """What a test found (its figures), recorded with its case and outcome when STRESS_RESULTS is set."""
    facts, start = {}, time.monotonic()
    yield facts
    if not RESULTS:
        return
    report = getattr(request.node, "call_report", None)
    _DONE.append({"test": request.node.originalname, "case": request.node.callspec.params["case"],
                  "outcome": report.outcome if report else "error", "seconds": round(time.monotonic() - start, 1),
                  **facts})
    _write_results()


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_no_lost_update(case, stress_facts):
    """Integer pushes with lr=1 and random delays: the algorithm's invariant holds, within the timeout."""
    what = _describe(case, "lost-update job")
    start = time.monotonic()
    result = mpirun(case["np"], python("tests/mpi/stress_job.py", case["algo"], str(case["job_seed"]),
                                       str(case["max_sleep_ms"]), str(PUSHES)),
                    no_shm=case["no_shm"], env={"SERVERS": str(case["servers"])}, timeout=TIMEOUT)
    assert result.returncode == 0, f"{what}\n{result.out[-6000:]}"
    assert f"STRESS JOB OK {case['algo']}" in result.out, f"{what}\n{result.out[-3000:]}"
    checked = [line for line in result.out.splitlines() if line.startswith("STRESS CHECKED")]
    assert len(checked) == 1, f"{what}\n{result.out[-3000:]}"
    options = [line for line in result.out.splitlines() if line.startswith("STRESS CASE")]
    stress_facts["checked"] = checked[0][len("STRESS CHECKED "):]
    _say(f"{_case_id(case)} part=invariant seconds={time.monotonic() - start:.1f} "
         f"{stress_facts['checked']} | {options[0][len('STRESS CASE '):]}")


def _sane_metrics(record: dict, case: dict) -> None:
    workers = case["np"] - case["servers"]
    assert (record["algorithm"], record["world_size"], record["workers"], record["servers"]) == \
        (case["algo"], case["np"], workers, case["servers"])
    assert record["epochs"] == case["epochs"] and len(record["history"]) == case["epochs"]
    assert [entry["epoch"] for entry in record["history"]] == list(range(1, case["epochs"] + 1))
    for entry in record["history"]:
        assert 0.0 <= entry["test_accuracy"] <= 1.0 and math.isfinite(entry["train_loss"]), entry
    assert 0.0 <= record["final_test_accuracy"] <= 1.0
    assert math.isfinite(record["final_train_loss"]) and record["final_train_loss"] >= 0
    assert record["updates"] > 0 and record["steps"] > 0 and record["samples"] > 0
    assert record["samples_per_second"] > 0 and record["wall_seconds"] > 0
    assert 0 <= record["staleness_mean"] <= record["staleness_max"]
    assert record.get("dropped_workers", []) == []
    assert len(record["batch_sizes"]) == workers and all(size >= 1 for size in record["batch_sizes"])
    if case["straggler"]:
        worker, factor = case["straggler"].split("=")
        assert record["stragglers"] == {worker: float(factor)}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_job(case, tmp_path, stress_facts):
    """A short training job with random options and delays: exit 0, valid metrics, nothing left running."""
    what = _describe(case, "training job")
    metrics = tmp_path / "metrics.json"
    argv = python("-m", "hvd_async.job.cli", "train", "--algo", case["algo"], "--np", str(case["np"]),
                  "--servers", str(case["servers"]), "--epochs", str(case["epochs"]),
                  "--seed", str(case["job_seed"]), "--compute-ms", str(case["compute_ms"]),
                  "--progress", "epochs", "--metrics-out", str(metrics), *case["options"])
    if case["straggler"]:
        argv += ["--straggler", case["straggler"]]
    if case["no_shm"]:
        argv += ["--mpi-args", " ".join(NO_SHM)]
    start = time.monotonic()
    result = run(argv, timeout=TIMEOUT)
    assert result.returncode == 0, f"{what}\n{result.out[-6000:]}"
    try:
        record = json.loads(metrics.read_text())
        _sane_metrics(record, case)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        pytest.fail(f"{what}\nmetrics not valid ({type(exc).__name__}: {exc})\n{result.out[-3000:]}")
    stress_facts.update(updates=record["updates"], final_test_accuracy=record["final_test_accuracy"])
    _say(f"{_case_id(case)} part=job seconds={time.monotonic() - start:.1f} updates={record['updates']} "
         f"accuracy={record['final_test_accuracy']:.3f} options={' '.join(case['options'])}")

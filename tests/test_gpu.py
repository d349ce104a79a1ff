"""GPU tests (marker ``gpu``), skipped where torch sees no CUDA device; scripts/device_check.sh runs them
on the device machine. Each runs tests/mpi/gpu_checks.py under mpirun (with a timeout, nothing left
behind): hpsgd's CUDA-stream path against ssgd, plain Horovod, the CPU run and the hand recurrence;
its exchange hidden behind resnet50's backprop; asgd, dc-asgd and od-sgd with the model on the GPU
against the CPU run of the same pushes; and the training job with ``--device cuda``.

Two ranks on the one GPU: NCCL refuses two ranks on one device ("Duplicate GPU detected"), so the
two-rank tests first find a way that works (the ``two_ranks`` fixture): Horovod as it is (a build
without GPU operations stages CUDA tensors through host memory), else NCCL with a host id per rank
(``HVD_ASYNC_NCCL_HOSTID_PER_RANK=1``: NCCL takes the ranks for two hosts and joins them over
sockets on ``lo``); they skip, saying why, when neither does. ``HVD_ASYNC_GPU_TWO_RANKS=plain|hostid``
forces one (``none``: skip, scripts/device_check.sh's probe found no way). ``HVD_ASYNC_GPU_RESULTS=DIR``
keeps each check's measured figures in ``DIR/gpu_checks.json``.
"""
import json
import os
import re

import pytest
import torch

from procs import mpirun, python, run

# GPU_CHECKS_DEVICE=cpu runs the same tests on the CPU: a check of the tests' own plumbing, no more
ON_CPU = os.environ.get("GPU_CHECKS_DEVICE") == "cpu"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() and not ON_CPU,
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False here "
                              "(scripts/device_check.sh runs these on the device machine)"),
]

CHECKS = python("tests/mpi/gpu_checks.py")
CLI = python("-m", "hvd_async.job.cli")
HOSTID = {"HVD_ASYNC_NCCL_HOSTID_PER_RANK": "1", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}
WAYS = {"plain": {}, "hostid": HOSTID}


def _keep(test: str, out: str) -> None:
    """The RESULT lines of a check job, appended to $HVD_ASYNC_GPU_RESULTS/gpu_checks.json."""
    folder = os.environ.get("HVD_ASYNC_GPU_RESULTS")
    records = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT {")]
    if not folder or not records:
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "gpu_checks.json")
    kept = json.load(open(path)) if os.path.exists(path) else []
    kept += [{"test": test, "horovod": os.environ.get("HVD_ASYNC_GPU_HOROVOD", ""), **r} for r in records]
    with open(path, "w") as f:
        json.dump(kept, f, indent=2)


def checks(np, names, *, servers=0, env=None, timeout=300, test=""):
    env = {"SERVERS": str(servers), **(env or {})}
    for name in ("GPU_CHECKS_DEVICE", "GPU_CHECKS_MODEL", "GPU_CHECKS_IMAGE", "GPU_CHECKS_BATCH", "GPU_CHECKS_STEPS", "GPU_CHECKS_REPEATS", "GPU_CHECKS_WINDOW",
                 "GPU_CHECKS_HIDDEN_TARGET", "NCCL_DEBUG"):
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    result = mpirun(np, CHECKS + list(names), env=env, timeout=timeout)
    _keep(test or " ".join(names), result.out)
    return result


def _why(out: str) -> str:
    if "Duplicate GPU detected" in out:
        return "NCCL: Duplicate GPU detected (two ranks on one device)"
    errors = [line.strip() for line in out.splitlines() if "Error" in line or "error" in line]
    return errors[-1][:300] if errors else out.strip().splitlines()[-1][:300] if out.strip() else "no output"


@pytest.fixture(scope="session")
def two_ranks():
    """The environment under which two ranks share the GPU through Horovod, or skip saying why."""
    forced = os.environ.get("HVD_ASYNC_GPU_TWO_RANKS")
    if forced == "none":
        pytest.skip("two ranks cannot share the GPU through Horovod here: scripts/device_check.sh's probe "
                    "found no way (HVD_ASYNC_GPU_TWO_RANKS=none)")
    tried = []
    for way, env in WAYS.items():
        if forced and way != forced:
            continue
        result = checks(2, ["probe"], env=env, timeout=180, test=f"two_ranks probe ({way})")
        if result.returncode == 0 and "GPU PROBE OK workers=2" in result.out:
            print(f"two ranks on one GPU: {way}")
            return env
        tried.append(f"{way}: {_why(result.out)}")
    pytest.skip("two ranks cannot share the GPU through Horovod here; " + "; ".join(tried))


def _ok(result, banner):
    assert result.returncode == 0, result.out[-6000:]
    assert banner in result.out, result.out[-3000:]


def test_allreduce_on_the_gpu_at_one_rank():
    result = checks(1, ["probe"])
    _ok(result, "GPU PROBE OK workers=1")
    if os.environ.get("HVD_ASYNC_GPU_HOROVOD") == "nccl":
        assert re.search(r"nccl_built=(True|[1-9])", result.out), "this Horovod was meant to be built with NCCL"


def test_hpsgd_window_one_equals_ssgd_one_rank():
    _ok(checks(1, ["hpsgd_sync", "hpsgd_cpu"]), "GPU CHECKS OK hpsgd_sync hpsgd_cpu")


def test_hpsgd_window_one_equals_ssgd_two_ranks(two_ranks):
    """window=1, no overlap: hpsgd's stream path equals ssgd and plain Horovod to fp tolerance."""
    _ok(checks(2, ["hpsgd_sync"], env=two_ranks), "GPU CHECKS OK hpsgd_sync")


def test_ssgd_skips_a_non_finite_step_on_the_device_one_rank():
    """Fused SGD: no host sync in a step (torch's sync debug mode), a NaN step skipped exactly."""
    _ok(checks(1, ["ssgd_device_skip"]), "GPU CHECKS OK ssgd_device_skip")


def test_ssgd_skips_a_non_finite_step_on_the_device_two_ranks(two_ranks):
    _ok(checks(2, ["ssgd_device_skip"], env=two_ranks), "GPU CHECKS OK ssgd_device_skip")


def test_hpsgd_overlap_equals_the_cpu_run(two_ranks):
    """Overlap on: the GPU run equals the CPU run of the same seeds at every step (float64)."""
    _ok(checks(2, ["hpsgd_cpu"], env=two_ranks), "GPU CHECKS OK hpsgd_cpu")


def test_hpsgd_hand_recurrence_on_a_large_gpu_tensor(two_ranks):
    _ok(checks(2, ["hpsgd_table"], env=two_ranks), "GPU CHECKS OK hpsgd_table")


def test_hpsgd_exchange_hidden_behind_resnet50_backprop(two_ranks):
    """Blocked time per step <= 10% of the exchange's own time, both measured with CUDA events."""
    _ok(checks(2, ["hpsgd_hidden"], env=two_ranks, timeout=420), "GPU CHECKS OK hpsgd_hidden")


def test_parameter_servers_with_the_model_on_the_gpu_equal_the_cpu_run():
    """asgd, dc-asgd and od-sgd (both exchanges): exact parity on integer gradients, lr 1. Their
    exchanges stage through CPU buffers, so two workers need no GPU collective."""
    _ok(checks(3, ["ps_parity"], servers=1), "GPU CHECKS OK ps_parity")


JOBS = {"ssgd": [], "hpsgd": ["--window", "2"], "asgd": ["--servers", "1"], "od-sgd": ["--od-exchange", "allreduce"]}


def _job(tmp_path, algo, workers, env=None):
    servers = 1 if "--servers" in JOBS[algo] else 0
    metrics = tmp_path / "m.json"
    result = run(CLI + ["train", "--algo", algo, "--np", str(workers + servers), "--device", "cpu" if ON_CPU else "cuda",
                        "--dataset", "digits", "--epochs", "3", "--metrics-out", str(metrics), *JOBS[algo]],
                 timeout=300, env=env)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert record["workers"] == workers and record["final_test_accuracy"] >= 0.8, record["history"]


@pytest.mark.parametrize("algo", sorted(JOBS))
def test_training_job_on_the_gpu_one_worker(tmp_path, algo):
    _job(tmp_path, algo, 1)


@pytest.mark.parametrize("algo", sorted(JOBS))
def test_training_job_on_the_gpu_two_workers(tmp_path, two_ranks, algo):
    if "HVD_ASYNC_NCCL_HOSTID_PER_RANK" in two_ranks:
        pytest.skip("two workers share the GPU only with a NCCL host id per rank, which the checks and "
                    "benchmarks set and the training job does not")
    _job(tmp_path, algo, 2, env=two_ranks)

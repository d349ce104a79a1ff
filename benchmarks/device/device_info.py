"""Where a result was measured: the machine, its GPU and driver, the software and the commit, for the
``environment`` block of the device benchmarks' JSON (gpu_throughput.py, cpu_study.py)."""
import os
import platform
import subprocess
import sys
from typing import Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT


def _run(cmd, cwd=ROOT) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> str:
    """The checkout's commit: DEVICE_COMMIT when set (the device machine gets a copy of the working
    tree without .git), else git's HEAD, with '+dirty' when tracked files differ from it."""
    if os.environ.get("DEVICE_COMMIT"):
        return os.environ["DEVICE_COMMIT"]
    head = _run(["git", "rev-parse", "HEAD"])
    if not head:
        return "unknown"
    return head + ("+dirty" if _run(["git", "status", "--porcelain", "--untracked-files=no"]) else "")


def environment() -> Dict:
    """A dict of what the results depend on (cheap: no GPU work)."""
    info = {"commit": commit(), "cpus": os.cpu_count(), "python": platform.python_version()}
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"])
    if smi:
        info["gpus"] = [dict(zip(("name", "driver", "memory", "compute_capability"),
                                 (v.strip() for v in line.split(",")))) for line in smi.splitlines()]
        info["driver"] = info["gpus"][0]["driver"]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # the record is still useful without it
        info["torch_error"] = repr(exc)
    try:
        import horovod
        import horovod.torch as hvd

        info["horovod"] = horovod.__version__
        info["horovod_built"] = {"mpi": hvd.mpi_built(), "gloo": hvd.gloo_built(), "nccl": hvd.nccl_built(),
                                 "cuda": hvd.cuda_built()}
    except Exception as exc:
        info["horovod_error"] = repr(exc)
    for name in ("HVD_ASYNC_GPU_HOROVOD", "HVD_ASYNC_NCCL_HOSTID_PER_RANK", "OMP_NUM_THREADS"):
        if os.environ.get(name):
            info[name] = os.environ[name]
    return info

"""Build and run the mpirun command line that starts a job on this machine (or a hostfile's)."""
import os
import shlex
import shutil
import subprocess
import sys
from typing import List, Sequence


def mpirun_command(np: int, program: Sequence[str], *, mpi_args: str = "",
                   env: Sequence[str] = ()) -> List[str]:
    """``mpirun`` with what a local run needs: root allowed, oversubscription, no core binding.

    Ranks are not bound to cores because several share each core when oversubscribed; the
    environment variables named in ``env`` are forwarded to every rank.
    """
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise FileNotFoundError("mpirun not found on PATH; install OpenMPI (scripts/setup.sh does, "
                                "or apt-get install openmpi-bin)")
    cmd = [mpirun, "-np", str(np), "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for name in ("PYTHONUNBUFFERED", "PYTHONPATH", "HVD_ASYNC_LOG_LEVEL", "HVD_ASYNC_PROGRESS", *env):
        if name in os.environ:
            cmd += ["-x", name]
    cmd += shlex.split(mpi_args)
    return cmd + list(program)


def run(cmd: List[str]) -> int:
    """Run a launcher command to completion and return its exit status (Ctrl-C stops the job)."""
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 130


def python_module(module: str, args: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", module, *args]

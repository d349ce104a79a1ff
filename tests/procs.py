"""Run a command (an mpirun job, a CLI call) with a timeout, in its own process group, leaving nothing behind."""
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_SHM = ["--mca", "btl", "self,tcp", "--mca", "osc", "^sm"]  # how separate nodes behave


class Result:
    def __init__(self, returncode: int, out: str):
        self.returncode, self.out = returncode, out

    def __repr__(self):
        return f"Result(returncode={self.returncode}, out=...{self.out[-3000:]})"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def group_processes(pgid: int) -> list:
    """``pid ppid state wchan elapsed command`` of every process in the process group ``pgid`` (ps's view)."""
    done = subprocess.run(["ps", "-o", "pid=,ppid=,stat=,wchan:24=,etime=,args=", "-g", str(pgid)],
                          capture_output=True, text=True)
    return [line.strip()[:200] for line in done.stdout.splitlines() if line.strip()]


def hung_processes(pgid: int) -> str:
    """What each process of a hung job's group is doing, for the failure's message: its row of
    :func:`group_processes`, and every thread's native stack (``gdb``, where installed; a rank blocked
    in MPI shows where, mpirun shows whether it still waits on a rank or on itself)."""
    rows = group_processes(pgid)
    lines = ["processes of the hung job (pid ppid state wchan elapsed command):", *rows]
    gdb = shutil.which("gdb")
    for pid in ([row.split()[0] for row in rows] if gdb else []):
        try:
            stacks = subprocess.run([gdb, "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt 12"],
                                    capture_output=True, text=True, timeout=30).stdout
        except subprocess.TimeoutExpired:
            stacks = "(gdb did not answer in 30 s)"
        frames = [line[:100] for line in stacks.splitlines() if line.startswith(("#", "Thread "))]
        lines.append(f"stacks of {pid}:\n" + "\n".join(frames[:80]))
    return "\n".join(lines)


def run(cmd: Sequence[str], *, timeout: float = 240, env: Optional[dict] = None, cwd: str = ROOT) -> Result:
    """Run ``cmd``; on timeout kill its whole process group and fail (a hang is a bug, not a flake)."""
    # the check scripts' watchdog (tests/mpi/harness.py) fires first and prints where each rank hung
    watchdog = str(max(timeout - 15, 0.9 * timeout))
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", HVD_ASYNC_CHECK_WATCHDOG=watchdog)
    full_env.update(env or {})
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        where = hung_processes(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s (deadlock?): {' '.join(cmd)}\n{out[-5000:]}\n{where}")
    deadline = time.time() + 10
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"processes were left behind by: {' '.join(cmd)}")
    return Result(proc.returncode, out)


def mpirun(np: int, program: Sequence[str], *, no_shm: bool = False, timeout: float = 240,
           env: Optional[dict] = None, mpi_args: Sequence[str] = ()) -> Result:
    """``program`` on ``np`` ranks through the project's own launcher command line (``mpi_args``:
    more mpirun options)."""
    from hvd_async.launcher import mpirun_command

    cmd = mpirun_command(np, program, mpi_args=" ".join([*(NO_SHM if no_shm else []), *mpi_args]),
                         env=list((env or {}).keys()))
    return run(cmd, timeout=timeout, env=env)


def python(*args: str) -> List[str]:
    return [sys.executable, *args]

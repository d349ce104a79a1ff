"""Run a command (an mpirun job, a CLI call) with a timeout, in its own process group, leaving nothing behind."""
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

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


# After every process the command started has exited (mpirun's ranks: zombies it has not reaped), the
# seconds it has to exit too before it is stopped as stuck in its own teardown: Debian's Open MPI with its
# external PMIx can deadlock in mpirun's PMIx_server_finalize after a rank's MPI_Abort (open-mpi/ompi#5528's
# kind), which no rank can end; the training launcher stops it the same way (launcher.ABORT_END_SECONDS).
STUCK_AFTER_RANKS_SECONDS = 10.0
STUCK_NOTE = "procs: every rank had exited and {cmd} had not after {s:g} s (its own teardown); stopped it"


def _wait_status(pid: int) -> Optional[int]:
    """The exit status of the zombie ``pid`` as a shell gives it (its code, or 128 + the signal that
    ended it), from the ``exit_code`` field of /proc/PID/stat (waitpid's form; Linux 3.5 and later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        raw = int(stat[stat.rindex(")") + 2:].split()[49])
    except (OSError, ValueError, IndexError):
        return None
    return 128 + (raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF


class StuckLeader:
    """Watches the process group of a command whose processes (mpirun's ranks) have all exited while
    the command itself has not: :meth:`stuck` is true once that has lasted ``STUCK_AFTER_RANKS_SECONDS``.
    ``statuses`` are then the ranks' exit statuses, read before anything is killed, and ``status``
    what mpirun reports for them: the first non-zero exit code, else the first signal's 128 + N, else 0."""

    def __init__(self, pgid: int):
        self.pgid, self.since, self.statuses = pgid, None, []

    def stuck(self) -> bool:
        rows = [row.split() for row in group_processes(self.pgid)]
        children = [row for row in rows if row and int(row[0]) != self.pgid]
        if not (children and all(row[2].startswith("Z") for row in children)):
            self.since = None
            return False
        now = time.time()
        if self.since is None:
            self.since = now
        self.statuses = [_wait_status(int(row[0])) for row in children]
        return now - self.since >= STUCK_AFTER_RANKS_SECONDS

    @property
    def status(self) -> int:
        known = [s for s in self.statuses if s is not None]
        return next((s for s in known if 0 < s < 128), next((s for s in known if s), 0))


class Ended(NamedTuple):
    """How :func:`wait_ended` saw a command end: its output; its status (None: still running at the
    timeout, then killed); the ranks' statuses where it was stopped as stuck after they had all exited
    (:class:`StuckLeader`; None otherwise); and ``where``, what ``describe`` said of its process group
    just before a timeout's kill."""
    out: str
    code: Optional[int]
    stuck: Optional[List[Optional[int]]]
    where: Any


def wait_ended(proc: subprocess.Popen, timeout: float, describe: Callable[[int], Any] = group_processes) -> Ended:
    """Wait for ``proc`` (the leader of its own process group) to end, for at most ``timeout`` seconds
    from now. A leader stuck after all its children have exited is stopped ``STUCK_AFTER_RANKS_SECONDS``
    later, its status then what it would have reported; one still running at the timeout is described
    (``describe(pgid)``) and killed. The whole group is killed in both cases."""
    deadline, watch = time.time() + timeout, StuckLeader(proc.pid)
    while True:
        try:
            out, _ = proc.communicate(timeout=1.0)  # (a retry after a timeout loses no output)
            return Ended(out, proc.returncode, None, None)
        except subprocess.TimeoutExpired:
            pass
        if watch.stuck():
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return Ended(out, watch.status, list(watch.statuses), None)
        if time.time() >= deadline:
            where = describe(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return Ended(out, None, None, where)


def _wait(proc: subprocess.Popen, timeout: float, cmd: Sequence[str]) -> Tuple[str, int]:
    """``proc``'s output and exit status once it has ended (:func:`wait_ended`); a hang fails the test
    with where each process was, and a stuck leader's stop is noted in the output."""
    ended = wait_ended(proc, timeout, describe=hung_processes)
    if ended.code is None:
        pytest.fail(f"timed out after {timeout} s (deadlock?): {' '.join(cmd)}\n{ended.out[-5000:]}\n{ended.where}")
    if ended.stuck is not None:
        return ended.out + STUCK_NOTE.format(cmd=os.path.basename(cmd[0]), s=STUCK_AFTER_RANKS_SECONDS) + "\n", ended.code
    return ended.out, ended.code


def run(cmd: Sequence[str], *, timeout: float = 240, env: Optional[dict] = None, cwd: str = ROOT) -> Result:
    """Run ``cmd``; on timeout kill its whole process group and fail (a hang is a bug, not a flake)."""
    # the check scripts' watchdog (tests/mpi/harness.py) fires first and prints where each rank hung
    watchdog = str(max(timeout - 15, 0.9 * timeout))
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", HVD_ASYNC_CHECK_WATCHDOG=watchdog)
    full_env.update(env or {})
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
    out, code = _wait(proc, timeout, cmd)
    deadline = time.time() + 10
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"processes were left behind by: {' '.join(cmd)}")
    return Result(code, out)


def mpirun(np: int, program: Sequence[str], *, no_shm: bool = False, timeout: float = 240,
           env: Optional[dict] = None, mpi_args: Sequence[str] = ()) -> Result:
    """``program`` on ``np`` ranks through the project's own launcher command line (``mpi_args``:
    more mpirun options)."""
    from hvd_async.job.launcher import mpirun_command

    cmd = mpirun_command(np, program, mpi_args=" ".join([*(NO_SHM if no_shm else []), *mpi_args]),
                         env=list((env or {}).keys()))
    return run(cmd, timeout=timeout, env=env)


def python(*args: str) -> List[str]:
    return [sys.executable, *args]

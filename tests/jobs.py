"""A training job run in the background, so a test can signal one of its ranks mid-run (SIGKILL,
SIGSTOP) and then check how the job and the launcher answered."""
import os
import signal
import subprocess
import threading
import time
from typing import List, Optional, Tuple

from procs import ROOT


class BackgroundJob:
    """``cmd`` in its own process group; its output lines kept with the time each arrived."""

    def __init__(self, cmd: List[str]):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                     start_new_session=True, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines: List[Tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    @property
    def out(self) -> str:
        return "".join(line for _, line in self.lines)

    def wait_for(self, text: str, timeout: float = 240) -> bool:
        """Wait until a line holds ``text`` (False when the job ended or time ran out first)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for _, line in self.lines):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def rank_process(self, world_rank: int):
        """The job's process of that MPI world rank (psutil.Process), or None."""
        import psutil

        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if (child.environ().get("OMPI_COMM_WORLD_RANK") == str(world_rank)
                        and "hvd_async.job.train" in " ".join(child.cmdline())):
                    return child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return None

    def signal_rank(self, world_rank: int, sig: int) -> float:
        victim = self.rank_process(world_rank)
        assert victim is not None, f"no process of world rank {world_rank}:\n{self.out[-3000:]}"
        victim.send_signal(sig)
        return time.time()

    def finish(self, timeout: float = 300) -> int:
        """Wait for the job; kill its whole group if it outlives ``timeout`` (and fail: a hang is a bug)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"the job did not end within {timeout} s:\n{self.out[-4000:]}")
        finally:
            self._reader.join(timeout=10)
        return self.proc.returncode

    def first_line_time(self, text: str) -> Optional[float]:
        return next((t for t, line in self.lines if text in line), None)

    def left_behind(self) -> list:
        """Processes of this job still alive (there must be none)."""
        import psutil

        time.sleep(1)
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return []
        return [p for p in psutil.process_iter() if _in_group(p, self.proc.pid)]


def _in_group(process, pgid: int) -> bool:
    try:
        return os.getpgid(process.pid) == pgid
    except (ProcessLookupError, OSError):
        return False

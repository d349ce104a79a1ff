"""Build and run the mpirun command line that starts a job on this machine (or a hostfile's)."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Callable, List, NamedTuple, Optional, Sequence

# the launch time of a run of ``hvd-async train`` (time.time()), for its record's seconds to the first step
LAUNCHED_AT = "HVD_ASYNC_LAUNCHED_AT"


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
    for name in ("PYTHONUNBUFFERED", "PYTHONPATH", "HVD_ASYNC_LOG_LEVEL", "HVD_ASYNC_PROGRESS", LAUNCHED_AT, *env):
        if name in os.environ:
            cmd += ["-x", name]
    cmd += shlex.split(mpi_args)
    return cmd + list(program)


class Outcome(NamedTuple):
    """How a launched job ended: mpirun's exit status, and ``interrupted``, the signal's name where
    the job was stopped by one rather than failing (None otherwise)."""
    code: int
    interrupted: Optional[str] = None


class _Terminated(Exception):
    """SIGTERM reached the launcher (a scheduler's cancel): stop the job as Ctrl-C does."""


def _raise_terminated(signum, frame):
    raise _Terminated()


# After a rank called MPI_Abort (mpirun relays its banner), the seconds mpirun has to end the job before
# the launcher stops it: the ranks are gone within seconds (failures.abort's backstop ends the aborting
# one within 10 s), so an mpirun still running long after is stuck itself and would hold the job for ever.
ABORT_END_SECONDS = 30.0


def run(cmd: List[str]) -> Outcome:
    """Run a launcher command to completion (Ctrl-C or SIGTERM to this process stops the job).

    Its stderr is relayed as it comes, except Open MPI's repeats of a failure after a job that already
    said what went wrong in an ``error:`` line (see :class:`BannerFilter`). mpirun itself, when it is
    sent SIGINT or SIGTERM, stops the ranks and exits 1 without a word, where a failed rank always
    leaves a line (the job's ``error:``, a traceback or mpirun's banner): that silent exit 1 is an
    interruption too. An mpirun still running ``ABORT_END_SECONDS`` after a rank called MPI_Abort is
    stopped, with a line saying so, and the job ends with the aborting rank's error code."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    guard = _AbortGuard(proc)
    sink = BannerFilter(sys.stderr, on_abort=guard.aborted)
    relay = threading.Thread(target=_relay, args=(proc.stderr, sink), daemon=True)
    relay.start()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    interrupted = None
    try:
        code = proc.wait()
    except (KeyboardInterrupt, _Terminated) as stop:
        interrupted = "SIGINT" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        code = 128 + getattr(signal, interrupted)
    finally:
        guard.cancel()
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    if guard.code is not None:
        code = guard.code
    relay.join(10)
    if interrupted is None and code == 1 and not sink.saw_failure:
        interrupted = "a signal to mpirun"
    return Outcome(code, interrupted)


class _AbortGuard:
    """Stops mpirun where it has not ended ``ABORT_END_SECONDS`` after a rank called MPI_Abort
    (:meth:`aborted`, from the relay); ``code`` is then the abort's error code, else None."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.code: Optional[int] = None
        self._timer: Optional[threading.Timer] = None

    def aborted(self, code: int) -> None:
        if self._timer is None:
            self._timer = threading.Timer(ABORT_END_SECONDS, self._stop, args=(code,))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _stop(self, code: int) -> None:
        if self.proc.poll() is not None:
            return
        self.code = code
        sys.stderr.write(f"hvd-async: error: mpirun had not ended {ABORT_END_SECONDS:g} s after a rank called "
                         f"MPI_Abort (error code {code}); stopped it, which ends the ranks it still held\n")
        sys.stderr.flush()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _relay(pipe, sink: "BannerFilter") -> None:
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        sink.feed(data)
    sink.close()


_BANNER_EDGE = re.compile(rb"^-{20,}\s*$")
# mpirun's banners that only repeat that a process exited with a non-zero status
_EXIT_BANNERS = (b"exited with non-zero status", b"returned\na non-zero exit code", b"MPI_ABORT was invoked")
# mpirun's line when the rank that aborts dies before its MPI_ABORT banner has reached mpirun whole: Open
# MPI relays a rank's help messages to mpirun (PMIx's log), whatever orte_base_help_aggregate says. The
# error it names varies with where the relay was cut ("Data unpack would read past end of buffer", "Out
# of resource"); what marks it is that show_help.c, the help relay, raised it
_CUT_BANNER = re.compile(rb"ORTE_ERROR_LOG: .* in file \S*show_help\.c at line \d+")
_ABORT_CODE = re.compile(rb"MPI_ABORT was invoked on rank \d+ in communicator .*\s+with errorcode (-?\d+)")


class BannerFilter:
    """Passes a job's stderr through as it comes (progress bars included: text after ``\\r`` goes out
    at once), holding back each block mpirun frames with lines of dashes until it is complete. Open
    MPI's repeats of a failure (the blocks that only say a process exited with a non-zero status or
    called MPI_Abort, and mpirun's ``ORTE_ERROR_LOG ... show_help.c`` line for an abort banner cut
    short) are dropped where a line held ``error:`` (the job's own one-line error), before or after
    them: they reach mpirun apart from the rank's stderr, sometimes first, so until such a line comes
    they are held, and written at the end of the stream if none did. Every other block (a rank killed
    by a signal, help messages) is passed on whole."""

    def __init__(self, out, on_abort: Optional[Callable[[int], None]] = None):
        self.out = out
        self.on_abort = on_abort  # called once, with the error code, when mpirun says a rank called MPI_Abort
        self.binary = getattr(out, "buffer", None)
        self.line = b""  # the current line, ``flushed`` bytes of it already written
        self.flushed = 0
        self.block: Optional[List[bytes]] = None
        self.held: List[bytes] = []  # repeats of a failure seen before any error line
        self.saw_error = False
        self.saw_failure = False  # an ``error:`` line, a traceback or one of mpirun's blocks

    def _write(self, data: bytes) -> None:
        if data:
            if self.binary is not None:
                self.out.flush()
                self.binary.write(data)
                self.binary.flush()
            else:
                self.out.write(data.decode(errors="replace"))
                self.out.flush()

    def feed(self, data: bytes) -> None:
        for piece in re.split(rb"(?<=[\r\n])", data):
            if not piece:
                continue
            self.line += piece
            if self.line.endswith((b"\n", b"\r")):
                self._complete(self.line)
                self.line, self.flushed = b"", 0
            elif self.block is None and not self.line.startswith((b"-", b"[")):  # (mpirun's "[host:pid] ...")
                self._write(self.line[self.flushed:])
                self.flushed = len(self.line)

    def _complete(self, line: bytes) -> None:
        edge = self.flushed == 0 and _BANNER_EDGE.match(line) is not None
        if self.block is not None:
            self.block.append(line)
            if edge:
                text, self.block = b"".join(self.block), None
                abort = _ABORT_CODE.search(text)
                if abort is not None:
                    self._aborted(int(abort.group(1)))
                if any(marker in text for marker in _EXIT_BANNERS):
                    self._repeat(text)
                else:
                    self._write(text)
            return
        if edge:
            self.block, self.saw_failure = [line], True
            return
        if _CUT_BANNER.search(line):
            self._aborted(1)  # (an abort whose banner was cut: its error code is not known)
            self._repeat(line[self.flushed:])
            return
        self._write(line[self.flushed:])
        if b"error:" in line:
            self.saw_error = True
            self.held.clear()
        if b"error:" in line or line.startswith(b"Traceback"):
            self.saw_failure = True

    def _aborted(self, code: int) -> None:
        if self.on_abort is not None:
            self.on_abort(code)
            self.on_abort = None

    def _repeat(self, text: bytes) -> None:
        if not self.saw_error:
            self.held.append(text)

    def close(self) -> None:
        """At the end of the stream: write what is still held (an unfinished line or block, repeats of
        a failure that no error line followed)."""
        if self.line:
            self._complete(self.line)
            self.line, self.flushed = b"", 0
        if self.block is not None:
            self._write(b"".join(self.block))
            self.block = None
        for text in self.held:
            self._write(text)
        self.held.clear()


def python_module(module: str, argv: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", module, *argv]

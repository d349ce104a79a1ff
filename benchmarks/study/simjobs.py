"""Many simulator runs (``hvd_async.sim.simulate``), each in a forked child, a few at a time, with a guard
against diverged runs.

Why a child per run, and a guard: a diverging run is stopped early and scored as diverged, and a
run that hangs must not hang the study. Each run is watched:

- deterministically, from the simulator's own epoch lines: a mean training loss that is not finite
  or above ``DIVERGED_LOSS`` (twice the chance-level loss ln 10 of 10 classes) ends the run as
  ``diverged``, keeping the epochs it reported;
- by the simulator: a run whose gradients stay non-finite (``--max-nonfinite``, 20 in a row by
  default) raises ``TrainingStopped``, also recorded as ``diverged``;
- as a last resort, by the clock: a child that reports nothing for ``timeout`` real seconds is killed
  and the run recorded as ``stalled`` (no result).

The record of a finished run is the simulator's metrics record; a stopped one has ``status`` and the
epochs seen. The parent imports torch and the simulator once; children are forked from it.

    >>> from simjobs import run_all
    >>> records = run_all([["--algo", "asgd", "--workers", "4", "--epochs", "2"]], jobs=1)
    >>> records[0]["status"], 0 <= records[0]["final_test_accuracy"] <= 1
    ('ok', True)
"""
import contextlib
import importlib
import io
import math
import multiprocessing
import os
import re
import sys
import time
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT

if ROOT not in sys.path:
    sys.path.append(ROOT)  # last: a PYTHONPATH entry may name another copy of the library

DIVERGED_LOSS = 2 * math.log(10)
_EPOCH = re.compile(r"^epoch (\d+)/\d+\s+train loss (\S+)\s+test accuracy (\S+)")


class Diverged(Exception):
    """The run's mean training loss left the finite range or passed ``DIVERGED_LOSS``."""


class _EpochWatch(io.TextIOBase):
    """Stands in for stderr during a run: keeps the simulator's epoch lines, raises on divergence."""

    def __init__(self):
        self.epochs: List[Dict] = []
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            m = _EPOCH.match(line.strip())
            if m:
                epoch, loss, acc = int(m[1]), float(m[2]), float(m[3])
                self.epochs.append({"epoch": epoch, "train_loss": loss, "test_accuracy": acc})
                if not math.isfinite(loss) or loss > DIVERGED_LOSS:
                    raise Diverged(f"mean training loss {loss} at epoch {epoch}")
        return len(text)


def _child(argv: Sequence[str], conn) -> None:
    from hvd_async.sim import simulate
    from hvd_async.job.train import TrainingStopped

    watch = _EpochWatch()
    try:
        with contextlib.redirect_stderr(watch):
            record = dict(simulate(list(argv)), status="ok")
    except (Diverged, TrainingStopped) as exc:
        record = {"status": "diverged", "why": str(exc), "epochs_seen": watch.epochs}
    except Exception as exc:  # noqa: B902 - reported to the parent, which decides
        record = {"status": "error", "why": f"{type(exc).__name__}: {exc}", "epochs_seen": watch.epochs}
    conn.send(record)
    conn.close()


def run_all(argvs: List[Sequence[str]], *, jobs: int = 2, timeout: float = 120.0, label=None) -> List[Dict]:
    """Simulate every argv list; returns the records in order. ``label(i, record)`` is printed per
    finished run (progress); errors other than divergence raise SystemExit with the run's options."""
    importlib.import_module("hvd_async.sim.runner")  # imported once here, inherited by every forked child

    ctx = multiprocessing.get_context("fork")
    results: List[Optional[Dict]] = [None] * len(argvs)
    pending = list(range(len(argvs)))
    running: Dict[int, tuple] = {}
    while pending or running:
        while pending and len(running) < max(1, jobs):
            i = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=([str(a) for a in argvs[i]], child), daemon=True)
            proc.start()
            child.close()
            running[i] = (proc, parent, time.monotonic())
        for i, (proc, conn, started) in list(running.items()):
            record = None
            if conn.poll(0.05):
                try:
                    record = conn.recv()
                except EOFError:
                    record = {"status": "error", "why": f"the child exited with {proc.exitcode}"}
            elif not proc.is_alive() and not conn.poll(0):
                record = {"status": "error", "why": f"the child exited with {proc.exitcode} and no result"}
            elif time.monotonic() - started > timeout:
                proc.kill()
                record = {"status": "stalled", "why": f"no result after {timeout:.0f} real seconds (killed)"}
            if record is None:
                continue
            proc.join(5)
            conn.close()
            del running[i]
            if record["status"] == "error":
                raise SystemExit(f"simulate {' '.join(map(str, argvs[i]))} failed: {record['why']}")
            record["argv"] = [str(a) for a in argvs[i]]
            results[i] = record
            if label is not None:
                print(label(i, record), flush=True)
    return results


def library_info() -> Dict:
    """Where the simulated library came from (file and git commit of its checkout, if any)."""
    import subprocess

    import hvd_async

    where = os.path.dirname(os.path.dirname(os.path.abspath(hvd_async.__file__)))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "hvd_async"], cwd=where, capture_output=True,
                           text=True).stdout.strip()
    return {"hvd_async": hvd_async.__file__, "commit": commit or None, "library_modified": bool(dirty)}

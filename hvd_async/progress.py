"""Worker 0's progress inside an epoch (``--progress``): a tqdm bar on a terminal, a plain line every
few seconds elsewhere (a Slurm log, a pipe), nothing with ``--progress epochs``.

The loop hands :meth:`EpochProgress.update` the fraction of the epoch done as the job sees it (a
synchronous worker: its own steps of its share; a parameter-server one: the servers' count of pushes
this epoch; dbs-asgd: the shared cursor), so the bar's total is the worker's share of an epoch under
every algorithm and never overruns, however fast this worker draws; the plain line adds what this
worker did itself: its samples, its samples/s and its running loss.

Example::

    >>> import io
    >>> out = io.StringIO()
    >>> p = EpochProgress("lines", share=100, epochs=2, desc="asgd x4", stream=out, every=0.0)
    >>> p.start(1); p.update(1, 0.25, samples=800, loss=lambda: 1.5)
    >>> out.getvalue().split(":")[0]
    'asgd x4 epoch 1/2'
"""
import os
import sys
import time
from typing import Any, Callable, Optional

MODES = ("auto", "bar", "epochs")  # --progress: auto (a bar on a terminal, else lines), bar, epochs (off)
LINE_EVERY = 5.0  # seconds between two plain lines


def progress_mode(choice: str, reporter: bool, *, tty: Optional[bool] = None) -> Optional[str]:
    """What ``--progress choice`` shows on this rank: ``"bar"``, ``"lines"`` or None (not the reporting
    worker, or ``epochs``). ``auto``: a bar where stderr is a terminal (``tty``; the launcher sets
    HVD_ASYNC_PROGRESS=1 when its own is, since the ranks' output is piped), else lines."""
    if not reporter or choice == "epochs":
        return None
    if tty is None:
        tty = sys.stderr.isatty() or os.environ.get("HVD_ASYNC_PROGRESS") == "1"
    return "bar" if choice == "bar" or tty else "lines"


class EpochProgress:
    """One run's progress display.

    Args:
        mode: ``"bar"`` (tqdm) or ``"lines"``.
        share: the worker's share of an epoch in steps (the bar's total per epoch).
        epochs: the run's epochs.
        desc: the bar's and the lines' label.
        stream: where it writes (stderr).
        every: seconds between two plain lines.
        clock: the clock the rate and the line interval are measured on.
    """

    def __init__(self, mode: str, *, share: int, epochs: int, desc: str, stream=None,
                 every: float = LINE_EVERY, clock: Callable[[], float] = time.monotonic):
        if mode not in ("bar", "lines"):
            raise ValueError(f"mode must be 'bar' or 'lines', got {mode!r}")
        self.mode, self.share, self.epochs, self.desc = mode, max(1, int(share)), epochs, desc
        self.stream = sys.stderr if stream is None else stream
        self.every, self.clock = every, clock
        self.bar: Any = None  # a tqdm bar in mode "bar" (tqdm ships no types)
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=epochs * self.share, desc=desc, unit="step", file=self.stream, dynamic_ncols=True)
        self.epoch_start = self.last_line = clock()
        self.start_samples = 0

    def start(self, epoch: int, samples: int = 0) -> None:
        """An epoch (or the rest of one, after a pause or a resume: this worker had trained ``samples``
        of it) begins."""
        self.epoch_start = self.last_line = self.clock()
        self.start_samples = samples
        if self.bar is not None:
            self._move_to((epoch - 1) * self.share)

    def update(self, epoch: int, fraction: float, *, samples: int, loss: Callable[[], float]) -> None:
        """``fraction`` of ``epoch`` is done (clamped to 0..1); this worker trained ``samples`` of it
        in all; ``loss()`` reads its running loss (called only when shown)."""
        fraction = min(1.0, max(0.0, fraction))
        now = self.clock()
        if self.bar is not None:
            self._move_to((epoch - 1) * self.share + round(fraction * self.share))
            if now - self.last_line >= self.bar.mininterval:
                self.bar.set_postfix(loss=f"{loss():.3f}", epoch=epoch, refresh=False)
                self.last_line = now
        elif now - self.last_line >= self.every:
            rate = (samples - self.start_samples) / max(now - self.epoch_start, 1e-9)
            self.write(f"{self.desc} epoch {epoch}/{self.epochs}: {100 * fraction:.0f}% of the epoch; "
                       f"worker 0: {samples} samples, {rate:.0f} samples/s, loss {loss():.4f}")
            self.last_line = now

    def _move_to(self, n: int) -> None:
        n = min(self.bar.total, n)
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)

    def write(self, line: str) -> None:
        """A line of its own (the epoch's report), above the bar where there is one."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

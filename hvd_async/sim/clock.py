"""The simulator's virtual clock: one thread per simulated worker, exactly one of them running at a time.

Each worker has a clock (simulated seconds). The running worker keeps the CPU until it calls
:meth:`Scheduler.advance` (its clock moves on by some simulated time) or :meth:`Scheduler.wait_until`
(it needs something another worker will do: a collective, softsync's aggregate, a replayed turn);
the scheduler then hands control to the runnable worker with the smallest clock, ties to the lowest
worker id. A waiting worker becomes runnable as soon as its condition holds, at the clock of the
worker whose action made it hold (conditions are checked at every hand-over, before the running
worker's clock moves). Nothing reads the wall clock and the OS's thread scheduling decides nothing:
the same inputs give the same sequence of events.

Threads (not coroutines) are what let the strategies run unmodified: their code calls the
transport, and a call that must wait simply blocks its thread inside the scheduler.

Example::

    >>> sched = Scheduler(2)
    >>> order = []
    >>> def body(w):
    ...     for _ in range(2):
    ...         sched.advance(w, 1.0 + w)   # worker 1 is slower
    ...         order.append((w, sched.now(w)))
    >>> _ = sched.run(body)
    >>> order
    [(0, 1.0), (0, 2.0), (1, 2.0), (1, 4.0)]
"""
import threading
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple


_current = threading.local()  # in a simulated worker's thread: .sched and .worker


def current():
    """``(scheduler, worker)`` of the simulated worker this thread runs, or None."""
    sched = getattr(_current, "sched", None)
    return None if sched is None else (sched, _current.worker)


class SimulationError(RuntimeError):
    """The simulated job cannot go on (every worker waits for another: a deadlock)."""


class _Abort(BaseException):
    """Raised in a worker's thread when another worker failed: unwinds it without running its logic."""


class Scheduler:
    """The virtual clocks of ``workers`` simulated workers and the hand-over between their threads.

    Args:
        workers: how many workers (thread ``w`` runs ``body(w)`` in :meth:`run`).
    """

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.clock = [0.0] * workers
        self.events = 0  # hand-over decisions: how many times the scheduler picked a worker
        self._go = [threading.Semaphore(0) for _ in range(workers)]
        self._waiting: Dict[int, Tuple[Callable[[], bool], str]] = {}
        self._finished: set = set()
        self._error: Optional[BaseException] = None
        self._aborted = False

    # --- what a worker calls ---------------------------------------------------------------------
    def now(self, worker: int) -> float:
        return self.clock[worker]

    def advance(self, worker: int, seconds: float) -> None:
        """Move ``worker``'s clock on by ``seconds`` (>= 0) and let any worker that is behind it run."""
        self._check()
        if seconds < 0:
            raise ValueError(f"simulated time cannot go back ({seconds} s)")
        if seconds == 0:
            return
        self._wake(self.clock[worker])
        self.clock[worker] += seconds
        self._switch(worker)

    def wait_until(self, worker: int, condition: Callable[[], bool], what: str) -> None:
        """Block ``worker`` until ``condition()`` holds (``what`` names it in a deadlock report)."""
        self._check()
        while not condition():
            self._wake(self.clock[worker])
            self._waiting[worker] = (condition, what)
            self._switch(worker)

    def sync_clocks(self, workers, at: float) -> None:
        """Set the clocks of ``workers`` to at least ``at`` (a collective completing)."""
        for w in workers:
            self.clock[w] = max(self.clock[w], at)

    # --- running the simulation ------------------------------------------------------------------
    def run(self, body: Callable[[int], Any]) -> List[Any]:
        """Run ``body(w)`` for every worker on its own thread under this clock; returns their results in
        worker order, or raises the first failure (the other workers are unwound)."""
        results: List[Any] = [None] * self.workers

        def main(w: int) -> None:
            self._go[w].acquire()
            if self._aborted:
                return
            _current.sched, _current.worker = self, w
            try:
                results[w] = body(w)
            except _Abort:
                return
            except BaseException as exc:  # noqa: B902 - surfaced by run() in the caller's thread
                self._fail(exc)
                return
            self._finish(w)

        threads = [threading.Thread(target=main, args=(w,), name=f"sim-worker-{w}", daemon=True)
                   for w in range(self.workers)]
        for t in threads:
            t.start()
        first = self._pick()
        assert first is not None  # at least one worker, none waiting or finished yet
        self._go[first].release()
        for t in threads:
            t.join()
        if self._error is not None:
            raise self._error
        return results

    # --- the hand-over ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._aborted:
            raise _Abort()

    def _wake(self, now: float) -> None:
        """Waiting workers whose condition holds become runnable at time ``now`` (the waker's clock)."""
        for w in sorted(self._waiting):
            condition, _ = self._waiting[w]
            if condition():
                del self._waiting[w]
                self.clock[w] = max(self.clock[w], now)

    def _pick(self) -> Optional[int]:
        self.events += 1
        best = None
        for w in range(self.workers):
            if w in self._waiting or w in self._finished:
                continue
            if best is None or self.clock[w] < self.clock[best]:
                best = w
        return best

    def _switch(self, worker: int) -> None:
        nxt = self._pick()
        if nxt is None:
            self._deadlock()
        if nxt != worker:
            self._go[nxt].release()
            self._go[worker].acquire()
        self._check()

    def _finish(self, worker: int) -> None:
        self._wake(self.clock[worker])
        self._finished.add(worker)
        if len(self._finished) == self.workers:
            return
        nxt = self._pick()
        if nxt is None:
            try:
                self._deadlock()
            except SimulationError as exc:
                self._fail(exc)
            return
        self._go[nxt].release()

    def _deadlock(self) -> NoReturn:
        waits = ", ".join(f"worker {w} waits for {what}" for w, (_, what) in sorted(self._waiting.items()))
        raise SimulationError(f"simulated job deadlocked: {waits}")

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._aborted = True
        for sem in self._go:  # every thread blocked in a hand-over wakes up and unwinds
            sem.release()

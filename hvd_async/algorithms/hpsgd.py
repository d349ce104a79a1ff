"""hpsgd: hierarchical parallel SGD, the exchange of one window overlapped with the next window's training.

Zhou et al., "Towards Fast Distributed Training: Hierarchical Parallel SGD" (arXiv 2009.02701).

Each worker holds ``G``, a flat copy of the global model (the same on every worker; worker 0's
parameters, broadcast at construction), and the replica ``R``: the model's own parameters, which
are made views into one flat buffer (so the model must be on its device and dtype before wrapping).
With window ``k``, ``merge_rate`` ``a`` and M workers, every ``step()`` runs the wrapped optimizer
(any ``torch.optim`` optimizer; its state stays local and survives every restart) on ``R``, and
after every k-th step (``steps % k == 0``, boundary j):

1. ``D_j = R - S_j``, the window's change (``S_j``: where the replica began the window), into its own
   buffer (two, used alternately, so ``D_j`` never overwrites the exchange still in flight).
2. ``overlap=True``: wait for the exchange of ``D_{j-1}`` if one is in flight and merge its average
   ``A_{j-1} = mean_m D_{j-1}(m)``: ``G <- G + a * A_{j-1}``; then start averaging ``D_j``.
   ``overlap=False``: average ``D_j`` and wait at once: ``G <- G + a * A_j``.
3. The replica restarts from the global model: ``R <- G``, plus, with overlap and
   ``keep_own_change`` (default), its own change still in flight: ``R <- G + D_j``, so that its
   window's progress is neither lost nor, once the average arrives, counted twice. ``S_{j+1} <- R``.

With overlap the merged change is one window stale (``stats()["staleness_mean"]`` is 1.0); without,
0. ``k=1, merge_rate=1, overlap=False`` with ``torch.optim.SGD`` is synchronous SGD exactly:
``w <- w - lr * mean_m g(m)`` (momentum too, since it is linear).

``keep_own_change=False`` is the plain reading of "the replica restarts from the global model": the
replica drops its last window's progress and gets it back, averaged, one window later, while it
has meanwhile made much of the same progress again: that progress then counts twice, and with
momentum training can diverge (the default keeps the replica's own change instead).

Choices made here:

- ``load_global_model()`` is collective. It ends the current window early: ``D = R - S`` if steps were
  taken since the last exchange, merge the exchange in flight, average ``D`` and merge it at once,
  ``R <- G``. Afterwards every worker holds the same parameters and nothing is in flight. Window
  boundaries stay at multiples of k (the position in the window is ``steps % k``), so after a
  mid-window ``load_global_model()`` the next boundary exchanges the rest of that window.
- ``state_dict()`` holds ``steps``, ``G`` and ``skipped_nonfinite``, and is only taken with nothing in
  flight and ``R == G``, i.e. after ``load_global_model()``; ``load_state_dict()`` sets ``G`` and the
  replica from it, and a resumed run continues at the same position in its window.
- ``close()`` waits for the exchange in flight (every worker already started it, so no new
  collective is needed) and drops it unmerged; the model keeps the replica. Call ``load_global_model()``
  first to keep that change. The transport is closed by its owner.
- Gradients holding NaN or infinity skip the local optimizer step; it still counts as a step so
  that windows stay aligned across workers (``stats()["skipped_nonfinite"]``, a warning).
- On CUDA, D, the launch, the merge and ``R <- G`` run on a stream the strategy owns: it waits for
  an event recorded on the current stream after the optimizer step, and the current stream waits
  for its event before the replica is used again. Horovod records its ready event on the stream
  current at ``allreduce_async_`` (here the strategy's), and its ``synchronize`` returns once the
  result may be used there. On CPU the same code runs with no stream (Horovod's background thread
  does the overlap).
"""
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict

import torch

from ..checks import all_finite, is_finite_number, is_int_at_least
from ..options import option
from ..transport.base import ReduceOp
from ..transport.window import staleness_summary
from .algorithm import Algorithm
from .base import ExchangeStats, Strategy

logger = logging.getLogger(__name__)


@dataclass
class HPSGDOptions:
    window: int = option(4, "local steps per window (its change is averaged while the next runs)",
                         flag="--window")
    merge_rate: float = option(1.0, "fraction of the averaged change merged into the global model",
                               flag="--merge-rate")
    overlap: bool = option(True, "wait for each window's exchange at once (local SGD with averaging)",
                           flag="--no-overlap", action="store_false")
    keep_own_change: bool = option(True, "restart the replica from the global model alone, dropping its "
                                   "own change in flight (the literal reading; unstable at high momentum)",
                                   flag="--drop-own-change", action="store_false")

    def __post_init__(self):
        if not is_int_at_least(self.window, 1):
            raise ValueError(f"window must be an integer >= 1 (local steps per exchange), got {self.window!r}")
        rate = self.merge_rate
        if not is_finite_number(rate) or rate <= 0:
            raise ValueError(f"merge_rate must be a finite number > 0 (1.0 merges the whole average "
                             f"change), got {rate!r}")
        self.merge_rate = float(rate)
        for name in ("overlap", "keep_own_change"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


class HPSGD(Strategy):
    """Local SGD in windows of k steps whose averaged changes merge into a global model, one window late.

    Options (keyword options of ``DistributedOptimizer``):
        window: local steps per window, k >= 1 (default 4). Larger windows exchange less often;
            raise it until ``stats()["exchange_wait_seconds"]`` stays near 0.
        merge_rate: factor on the averaged change merged into the global model, > 0 (default 1.0).
        overlap: exchange while the next window trains (default True); False waits at every
            boundary (no staleness).
        keep_own_change: with overlap, the replica restarts from G plus its own change still in
            flight (default True); False restarts it from G alone (see the module docstring).

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      named_parameters=model.named_parameters(),
                                      algorithm="hpsgd", window=4)
        for x, y in batches:
            opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
        opt.load_global_model()  # every worker, e.g. at epoch end: identical parameters from here
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._params = [p for _, p in named_parameters if p.requires_grad]
        if not self._params:
            raise ValueError("hpsgd found no trainable parameters (requires_grad=True) to exchange")
        devices = sorted({str(p.device) for p in self._params})
        dtypes = sorted({str(p.dtype) for p in self._params})
        if len(devices) > 1:
            raise ValueError(f"hpsgd needs all trainable parameters on one device, found {', '.join(devices)}; "
                             "move the model with model.to(device) before wrapping the optimizer")
        if len(dtypes) > 1 or not self._params[0].dtype.is_floating_point:
            raise ValueError(f"hpsgd needs all trainable parameters in one floating dtype, found "
                             f"{', '.join(dtypes)}; convert the model with model.to(dtype) before wrapping")
        with torch.no_grad():
            self._replica = torch.cat([p.detach().reshape(-1) for p in self._params])
            start = 0
            for p in self._params:  # the parameters become views into the replica buffer
                p.data = self._replica[start:start + p.numel()].view_as(p)
                start += p.numel()
        self._global = self._replica.clone()
        self._start = self._replica.clone()  # where the replica began this window
        self._buffers = [torch.empty_like(self._replica) for _ in range(2)]
        self._free = 0  # which buffer the next window's change goes into
        self._pending = None  # (handle, restarts when started) of the exchange in flight
        self._unexchanged = 0  # steps since the last exchange started
        self._restarts = 0  # times the replica restarted from G
        self._stream = torch.cuda.Stream(device=self._replica.device) if self._replica.is_cuda else None
        if self._stream is not None:
            for t in (self._replica, self._global, self._start, *self._buffers):
                t.record_stream(self._stream)
        self._closed = False
        self.skipped_nonfinite = 0
        self.exchanges = 0
        self.exchange_wait_seconds = 0.0
        self._staleness_hist = [0, 0]  # merged exchanges by windows of staleness (0, 1)

    def begin(self) -> None:
        """R = G = worker 0's weights as they are now, on every worker."""
        self.transport.broadcast_(self._replica, root=0, name="hpsgd.init")
        self._global.copy_(self._replica)
        self._start.copy_(self._replica)

    @property
    def global_model(self) -> torch.Tensor:
        """G, the flat global model (read only)."""
        return self._global

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this hpsgd optimizer was closed; create a new DistributedOptimizer")

    # --- the exchange -------------------------------------------------------------------
    @contextmanager
    def _exchange_stream(self):
        """Run the body on the strategy's CUDA stream, ordered after and before the current stream."""
        if self._stream is None:
            yield
            return
        current = torch.cuda.current_stream(self._replica.device)
        self._stream.wait_event(current.record_event())  # R is read after the optimizer step
        with torch.cuda.stream(self._stream):
            yield
        current.wait_event(self._stream.record_event())  # R is used after R <- G

    def _finish(self) -> float:
        """Wait for the exchange in flight, if any, and merge it into G; returns seconds waited."""
        if self._pending is None:
            return 0.0
        handle, started = self._pending
        self._pending = None
        begin = self.clock()
        average = self.transport.synchronize(handle)
        waited = self.clock() - begin
        self._global.add_(average, alpha=self.options.merge_rate)
        staleness = self._restarts - started
        self.exchanges += 1
        self._staleness_hist[min(staleness, len(self._staleness_hist) - 1)] += 1
        return waited

    def _end_window(self, blocking: bool) -> float:
        """Steps 1-3 of the module docstring; returns seconds waited for exchanges."""
        with torch.no_grad(), self._exchange_stream():
            delta = None
            if self._unexchanged:
                delta = self._buffers[self._free]
                torch.sub(self._replica, self._start, out=delta)
            waited = self._finish()
            self._replica.copy_(self._global)
            if delta is not None:
                if self.options.keep_own_change and not blocking:
                    self._replica.add_(delta)  # before the in-place allreduce overwrites it
                handle = self.transport.allreduce_async_(delta, name=f"hpsgd.delta.{self._free}",
                                                         op=ReduceOp.AVERAGE)
                self._free ^= 1
                self._pending = (handle, self._restarts)
                self._unexchanged = 0
                if blocking:
                    waited += self._finish()
                    self._replica.copy_(self._global)
            self._start.copy_(self._replica)
            self._restarts += 1
        return waited

    # --- the optimizer interface ----------------------------------------------------------
    def _grads_finite(self) -> bool:
        grads = [p.grad for p in self._params if p.grad is not None]
        return all_finite(grads)

    def step(self, closure=None):
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._grads_finite():
            self.optimizer.step()
        else:
            self.skipped_nonfinite += 1
            if self.skipped_nonfinite == 1 or self.skipped_nonfinite % 100 == 0:
                logger.warning("worker %d: gradient holds NaN or infinity at step %d; local step skipped "
                               "(%d skipped so far)", self.transport.rank, self.steps + 1,
                               self.skipped_nonfinite)
        self.steps += 1
        self._unexchanged += 1
        if self.steps % self.options.window == 0:
            self.exchange_wait_seconds += self._end_window(blocking=not self.options.overlap)
        return loss

    def load_global_model(self) -> None:
        """Collective: merge the exchange in flight and this window's change so far; R <- G everywhere."""
        self._check_open()
        self._end_window(blocking=True)

    def stats(self) -> ExchangeStats:
        mean, largest = staleness_summary(self._staleness_hist)
        return ExchangeStats(staleness_mean=mean, staleness_max=largest, staleness_hist=list(self._staleness_hist),
                             exchange_wait_seconds=self.exchange_wait_seconds,
                             skipped_nonfinite=self.skipped_nonfinite, extra={"exchanges": self.exchanges})

    def state_dict(self) -> Dict[str, Any]:
        self._check_open()
        if self._pending is not None or self._unexchanged:
            raise RuntimeError("hpsgd state_dict() needs every change merged: call load_global_model() on "
                               "every worker first (an exchange in flight is not saved)")
        return {"steps": self.steps, "global": self._global.detach().clone(),
                "skipped_nonfinite": self.skipped_nonfinite}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._check_open()
        if self._pending is not None:
            raise RuntimeError("hpsgd load_state_dict() with an exchange in flight: call load_global_model() first")
        saved = state["global"]
        if saved.numel() != self._global.numel():
            raise ValueError(f"state_dict holds a global model of {saved.numel()} elements, this model "
                             f"has {self._global.numel()}; load it into the same model")
        with torch.no_grad(), self._exchange_stream():
            self._global.copy_(saved.reshape(-1))
            self._replica.copy_(self._global)
            self._start.copy_(self._global)
        self.steps = int(state["steps"])
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self._unexchanged = 0

    def close(self) -> None:
        """Wait for the exchange in flight and drop it unmerged (no new collective); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            handle = self._pending[0]
            self._pending = None
            try:
                with self._exchange_stream():
                    self.transport.synchronize(handle)
            except RuntimeError as exc:  # e.g. the transport was closed first: nothing left to wait for
                logger.warning("hpsgd close(): dropped the exchange in flight (%s)", exc)


class HPSGDAlgorithm(Algorithm):
    """hpsgd's declaration: Horovod's collectives (the default transport)."""

    Options = HPSGDOptions
    strategy = HPSGD

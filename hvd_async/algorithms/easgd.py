"""easgd: elastic averaging SGD, the centre variable held in the parameter servers' MPI windows.

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD" (NIPS 2015); compared with
gossip and synchronous SGD by Jin, Yuan, Iandola, Keutzer (arXiv 1611.04581).

Each worker trains its own weights ``w_i`` with the wrapped optimizer (any ``torch.optim``
optimizer; its state stays on the worker). The centre ``c`` lives in the servers' windows
(:class:`~hvd_async.transport.window.WindowTransport` in accumulate mode; the servers do no
arithmetic, their loop only keeps MPI progressing). At construction worker 0's weights become both
the centre and every worker's start. After every ``tau``-th local step (``steps % tau == 0``) the
worker makes an elastic move (:func:`hvd_async.rules.elastic.elastic_move`):

- asynchronous form (default): ``c' = pull()`` (one-sided ``Get``), ``d = alpha * (w_i - c')``,
  ``w_i -= d``, and ``d`` is added into the centre with ``MPI_Accumulate`` (atomic, so no move is
  lost however many land together; the centre gets exactly the sum of all moves). The staleness of
  a move is the number of other moves that landed between its read and its add (the transport's
  version counter), kept in ``stats()["staleness_hist"]``.
- synchronous form (``synchronous=True``): every worker at the same step; ``pull()``, a barrier
  among the workers (everyone read the same centre ``c``), the move and its ``Accumulate``, a second
  barrier (every move landed before the next round reads): ``c <- c + sum_i alpha * (w_i - c)``.
  Same windows and servers as the asynchronous form; the staleness recorded is 0 (every move is
  against the round's centre). ``progress()`` is then ``steps * workers`` so every worker ends an
  epoch at the same step.

Rate: exactly one of ``alpha`` (the moving rate, in (0, 1)) or ``rho`` (the elastic coefficient,
``alpha = lr * rho`` with the wrapped optimizer's ``lr`` at construction); neither gives the
paper's suggestion ``beta = N * alpha = 0.9``, i.e. ``alpha = 0.9 / N`` for N workers.

``load_global_model()`` (collective over the workers; the training loop calls it at epoch ends before
evaluating): after a barrier (every move has landed) every worker puts its own weights aside and
loads the centre into its model, and a second barrier keeps anyone from moving the centre before
all have read it, so every worker evaluates the same model: the centre. Training continues from
the worker's own weights: the next ``step()`` (or an explicit ``resume_local()``) restores them
before the optimizer steps. That first step's gradient was computed at the centre (the model the
caller held) and is applied to the worker's own weights, which the elastic force keeps close to
it; call ``resume_local()`` before the next forward pass to avoid even that.

Gradients holding NaN or infinity skip the optimizer step (the elastic move still happens, so the
synchronous rounds stay aligned); ``stats()["skipped_nonfinite"]`` counts them.

Example::

    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  model.named_parameters(), algorithm="easgd", tau=4)

Tuning: small ``tau`` (1 to 4) keeps the workers close to the centre; larger ``tau`` lets them
explore more and costs fewer exchanges. If the centre lags the workers' accuracy, raise alpha
(keep ``N * alpha`` below 1).
"""
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..checks import is_finite_number, is_int_at_least
from ..options import option
from ..rules.elastic import elastic_move, resolve_alpha
from ..transport import window
from .base import ExchangeStats, Strategy
from .flat import FlatModel, local_step_if_finite
from .ps import PSAlgorithm, load_server_state_dict, server_state_dict

logger = logging.getLogger(__name__)


@dataclass
class EASGDOptions:
    tau: int = option(1, "local steps between elastic moves", flag="--tau")
    alpha: Optional[float] = option(None, "moving rate in (0, 1) (default 0.9 / workers); or give --rho",
                                    flag="--alpha")
    rho: Optional[float] = option(None, "elastic coefficient, alpha = lr * rho", flag="--rho")
    synchronous: bool = option(False, "synchronous form (all workers move at the same step)",
                               flag="--easgd-sync", action="store_true")

    def __post_init__(self):
        if not is_int_at_least(self.tau, 1):
            raise ValueError(f"tau must be an integer >= 1 (local steps between elastic moves), got {self.tau!r}")
        if self.alpha is not None and self.rho is not None:
            raise ValueError(f"give alpha or rho, not both (alpha={self.alpha!r}, rho={self.rho!r}); "
                             f"alpha = lr * rho")
        if self.alpha is not None and not (is_finite_number(self.alpha) and 0 < self.alpha < 1):
            raise ValueError(f"alpha must be a number in (0, 1) (the elastic moving rate; the paper "
                             f"suggests 0.9 / workers), got {self.alpha!r}")
        if self.rho is not None and not (is_finite_number(self.rho) and self.rho > 0):
            raise ValueError(f"rho must be a finite number > 0 (alpha = lr * rho), got {self.rho!r}")
        if not isinstance(self.synchronous, bool):
            raise ValueError(f"synchronous must be True or False, got {self.synchronous!r}")


class EASGD(Strategy):
    """easgd: local steps, and every ``tau`` steps an elastic move between the worker and the centre.

    Options:
        tau: local steps between elastic moves (default 1: larger values let the workers drift
            from the centre, which costs accuracy with many workers; the guide's convergence section).
        alpha: moving rate in (0, 1) (default 0.9 / workers).
        rho: elastic coefficient instead of alpha: ``alpha = lr * rho``.
        synchronous: all workers move together against one centre (default False).
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self.alpha = resolve_alpha(options.alpha, options.rho, float(optimizer.param_groups[0]["lr"]),
                                   transport.size)
        self.model = FlatModel([p for _, p in named_parameters])
        self.centre = torch.empty_like(self.model.flat)
        self.move = torch.empty_like(self.model.flat)
        self.local = torch.empty_like(self.model.flat)  # own weights while the model holds the centre
        self.holding_centre = False
        self.hist = np.zeros(window.HIST_BINS, dtype=np.int64)
        self.moves = 0
        self.wait_seconds = 0.0
        self.skipped_nonfinite = 0

    def begin(self) -> None:
        """Worker 0's weights as they are now: the centre and every worker's start."""
        self.model.store_params()
        self.transport.publish_(self.model.flat)
        self.model.load_params()

    def after_evaluation(self) -> None:
        self.resume_local()

    def resume_local(self) -> None:
        """After ``load_global_model()``: put the worker's own weights back into the model (no-op otherwise)."""
        if self.holding_centre:
            self.model.flat.copy_(self.local)
            self.model.load_params()
            self.holding_centre = False

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.resume_local()
        local_step_if_finite(self, self.model)
        self.steps += 1
        if self.steps % self.options.tau == 0:
            self._elastic_move()
        return loss

    def _elastic_move(self) -> None:
        """``d = alpha * (w - c)``; ``w -= d``; ``c += d`` (see the module docstring for both forms)."""
        start = self.clock()
        t, sync = self.transport, self.options.synchronous
        t.pull(self.centre)
        if sync:
            t.barrier()  # everyone has read this round's centre before anyone adds to it
        elastic_move(self.model.flat, self.centre, self.alpha, out=self.move)
        self.model.flat.sub_(self.move)
        self.model.load_params()
        staleness = t.accumulate(self.move)
        if sync:
            t.barrier()  # every move of the round has landed before anyone reads the centre again
            self.hist[0] += 1
        else:
            self.hist[min(int(np.max(staleness)), window.HIST_BINS - 1)] += 1
        self.moves += 1
        self.wait_seconds += self.clock() - start

    def progress(self) -> int:
        """Local steps of all workers together: ``steps * workers`` in the synchronous form; in the
        asynchronous form ``tau`` times the moves the centre received, as last seen."""
        if self.options.synchronous:
            return self.steps * self.transport.size
        return self.options.tau * int(self.transport.latest_versions[0])

    def load_global_model(self) -> None:
        """Collective over the workers: every worker's model holds the centre (see the module docstring)."""
        start = self.clock()
        self.transport.barrier()  # every move has landed (an accumulate completes before step() returns)
        if not self.holding_centre:
            self.model.store_params()
            self.local.copy_(self.model.flat)
            self.holding_centre = True
        self.transport.pull(self.model.flat)
        self.model.load_params()
        self.transport.barrier()  # nobody moves the centre before every worker has read it
        self.wait_seconds += self.clock() - start

    def stats(self) -> ExchangeStats:
        mean, largest = window.staleness_summary(self.hist)
        return ExchangeStats(staleness_mean=mean, staleness_max=largest, staleness_hist=self.hist.tolist(),
                             pushes=self.moves, exchange_wait_seconds=self.wait_seconds,
                             skipped_nonfinite=self.skipped_nonfinite,
                             extra={"elastic_moves": self.moves, "alpha": self.alpha})

    def state_dict(self):
        """Counters, the worker's own weights (also while the model holds the centre) and, on worker
        0, the centre on the servers: take it after ``load_global_model()``."""
        self.model.store_params()
        own = self.local if self.holding_centre else self.model.flat
        state = {"steps": self.steps, "staleness_hist": self.hist.tolist(), "moves": self.moves,
                 "skipped_nonfinite": self.skipped_nonfinite, "local": own.clone(),
                 "holding_centre": self.holding_centre}
        state.update(server_state_dict(self.transport))
        return state

    def load_state_dict(self, state):
        """Collective over the workers (worker 0 restores the centre)."""
        self.steps = int(state["steps"])
        self.hist[:] = np.asarray(state["staleness_hist"], dtype=np.int64)
        self.moves = int(state["moves"])
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.local.copy_(state["local"])
        self.holding_centre = bool(state["holding_centre"])
        if not self.holding_centre:
            self.model.flat.copy_(self.local)
            self.model.load_params()
        load_server_state_dict(self.transport, state)


class EASGDAlgorithm(PSAlgorithm):
    """easgd's declaration: the centre on the servers' windows, which the workers' elastic moves
    accumulate into; ``rho`` checked against the job's ``lr``."""

    Options = EASGDOptions
    strategy = EASGD

    @classmethod
    def check_for_job(cls, given, *, workers, lr: float) -> None:
        rho = given.get("rho")
        if isinstance(rho, (int, float)) and not 0 < lr * rho < 1:
            raise ValueError(f"rho {rho} gives alpha = lr * rho = {lr * rho}; it must be in (0, 1)")

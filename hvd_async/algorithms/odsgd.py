"""od-sgd: one-step delay SGD (Xu et al., arXiv 2005.06728): a synchronous global step whose result
arrives one iteration late, bridged by a local step.

Iteration ``t`` of worker ``m``, in order:

1. compute ``g_m(t)`` at the local weights ``w_m(t)`` (the caller's forward/backward);
2. wait for the exchange started at iteration ``t-1``: it yields ``w_g(t) = w_g(t-1) - eta_g *
   mean_m g_m(t-1)`` (the *global* step, synchronous over workers, with the wrapped optimizer's
   ``lr``, ``momentum`` and ``weight_decay`` read at every step, so schedulers drive it);
3. start the exchange of ``g_m(t)`` and return without waiting for it;
4. the *local* step: ``w_m(t+1) = w_g(t) - eta_l * g_m(t)``, taken by a local optimizer (plain SGD
   with ``local_lr`` and ``local_momentum`` unless another is given) on the weights ``w_g(t)``.

So iteration ``t``'s exchange runs while iteration ``t+1`` computes: od-sgd hides communication
behind compute. It does not hide stragglers: the global step waits for every worker's gradient, so
one slow worker paces all of them (as ssgd), only one step later; use asgd, dc-asgd or softsync
against stragglers. Every gradient after the first is one global step stale (computed at weights
derived from ``w_g(t-1)``, applied to ``w_g(t)``); the staleness histogram says so.

Two exchanges, the same arithmetic:

- ``exchange="window"`` (default): the parameter servers hold ``w_g`` in MPI windows; each worker puts
  ``g_m(t)`` into its inbox slot and the servers apply the global step once every active worker's
  gradient is in (``aggregate.AggregateProgram`` over every worker, unscaled); each worker reads
  ``w_g(t+1)`` from the weights window. With ``--worker-timeout`` the servers may apply the next global step without a
  worker that is still reading this one: each global step is written under
  ``ShardHost.writing_weights`` and read with ``pull(guarded=True)``, which takes a snapshot from
  the server instead when a write overlapped the read (``transport.overlapped_reads`` counts them).
  The momentum buffer of the global step lives on the servers. One communication thread per worker
  runs the whole exchange (upload, the servers' step, download), so none of it is on the critical
  path unless it takes longer than an iteration's compute.
- ``exchange="allreduce"``: no server; Horovod's ``allreduce_async_`` sums the gradients among the
  workers (with a count of the finite ones), and every worker applies the same global step to its
  own copy of ``w_g`` (and of its momentum buffer), so the copies stay identical.

Local optimizer settings (the authors expose them separately): ``local_lr`` (default: the wrapped
optimizer's ``lr`` at construction), ``local_momentum`` (default: the wrapped optimizer's
``momentum``), ``local_optimizer`` (a callable
``params -> torch.optim.Optimizer`` replacing the local SGD), ``local_schedule``: ``"follow"``
(default: the local rates keep their ratio to the global rate as a scheduler changes it), ``"fixed"``,
or a callable ``step -> local lr``. ``local_lr=0`` makes od-sgd one-step-delayed synchronous SGD.

Non-finite gradients are not exchanged (window: that worker sends none this iteration and its next
gradient joins the pending global step; allreduce: it contributes zeros and is not counted in the
mean) and skip the local step; ``stats()["skipped_nonfinite"]`` counts them.
"""
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from ..rules import SGDRule
from ..options import option
from ..transport import window
from ..transport.base import ReduceOp
from ..checkpoint import tensors_copy
from .aggregate import AggregateProgram
from .algorithm import Algorithm
from .base import ExchangeStats, Strategy
from .flat import FlatModel, finite_grads
from .groups import InboxSlots
from .payload import SGDPayload, check_server_sgd, server_sgd_hyper
from .ps import load_server_state_dict, mailbox_snapshot, server_state_dict

EXCHANGES = ("window", "allreduce")


@dataclass
class ODSGDOptions(InboxSlots):
    local_lr: Optional[float] = option(None, "rate of the local step (default: --lr; 0: ssgd one step late)",
                                       flag="--local-lr")
    local_momentum: Optional[float] = option(None, "momentum of the local step (default: --momentum)",
                                             flag="--local-momentum")
    local_optimizer: Optional[Callable] = option(None, "params -> optimizer for the local step (default: SGD "
                                                 "with local_lr and local_momentum)")
    local_schedule: Any = option("follow", "the local step's rate follows the optimizer's schedule, or stays "
                                 "fixed at --local-lr", flag="--local-schedule", choices=("follow", "fixed"),
                                 type=str)
    exchange: str = option("window", "global step on parameter servers (window) or by Horovod allreduce "
                           "among the workers (allreduce, no server)", flag="--od-exchange", choices=EXCHANGES)

    def __post_init__(self):
        super().__post_init__()
        lr = self.local_lr
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < float("inf")):
            raise ValueError(f"local_lr must be a finite number >= 0 (0: one-step-delayed ssgd), got {lr!r}")
        mom = self.local_momentum
        if mom is not None and (isinstance(mom, bool) or not isinstance(mom, (int, float)) or not 0 <= mom < 1):
            raise ValueError(f"local_momentum must be in [0, 1), got {mom!r}")
        if self.local_optimizer is not None and not callable(self.local_optimizer):
            raise ValueError(f"local_optimizer must be a callable params -> torch.optim.Optimizer, "
                             f"got {self.local_optimizer!r}")
        if not (self.local_schedule in ("follow", "fixed") or callable(self.local_schedule)):
            raise ValueError(f"local_schedule must be 'follow', 'fixed' or a callable step -> lr, "
                             f"got {self.local_schedule!r}")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}, got {self.exchange!r}")


class _ServerExchange:
    """The global step on the parameter servers (mailbox windows), driven by one communication
    thread so that the whole exchange (gradient upload, the servers' step, the download of
    ``w_g``) runs while the caller computes the next gradient."""

    def __init__(self, transport, model: FlatModel):
        self.transport, self.global_w = transport, torch.empty_like(model.flat)
        self.send = torch.empty_like(model.grad)  # the thread reads and writes only these two
        self.recv = torch.empty_like(model.grad)
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="od-sgd-exchange")
        self.future: Optional[Future] = None
        self.pushes = 0
        self.model = model

    def begin(self) -> None:
        self.transport.publish_(self.model.flat)

    def start(self, grad: Optional[torch.Tensor], payload: SGDPayload) -> None:
        if grad is not None:
            self.send.copy_(grad)
            self.future = self.thread.submit(self._exchange, payload.encode())

    def _exchange(self, payload):
        """On the thread: push, wait for the global step, read it from the weights window. Without
        a worker timeout the weights cannot move again before this worker's next gradient is in; with
        one the servers may go on without this worker while it reads, hence the guarded read."""
        answers = self.transport.request_async(window.Kind.PUSH, grad=self.send, payload=payload).wait()
        self.transport.pull(self.recv, guarded=True)
        return answers

    def finish(self) -> None:
        """Wait for the exchange in flight (``global_w`` then holds the newer global step)."""
        if self.future is not None:
            answers, self.future = self.future.result(), None
            self.pushes = answers.pushes
            self.global_w, self.recv = self.recv, self.global_w  # a swap: no copy while the step waits

    def snapshot(self) -> None:
        mailbox_snapshot(self.transport, self.global_w)

    def state_dict(self) -> Dict:
        self._idle("state_dict")
        state = {"pushes": self.pushes}
        state.update(server_state_dict(self.transport))
        return state

    def load_state_dict(self, state: Dict) -> None:
        self._idle("load_state_dict")
        self.pushes = int(state["pushes"])
        load_server_state_dict(self.transport, state)

    def _idle(self, what: str) -> None:
        if self.future is not None:
            raise RuntimeError(f"od-sgd {what}() with an exchange in flight: call load_global_model() first")

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.thread.shutdown(wait=True)


class _AllreduceExchange:
    """The global step on every worker's copy of ``w_g``, after Horovod sums the gradients."""

    def __init__(self, transport, model: FlatModel):
        self.transport, self.global_w = transport, torch.empty_like(model.flat)
        self.buffer = torch.zeros(model.numel + 1)  # the gradient, then 1 if it counts
        self.sgd = SGDRule()
        self.sgd_state: Dict[str, Any] = {}
        self.handle = None
        self.hyper: Optional[SGDPayload] = None  # set with the handle
        self.model = model

    def begin(self) -> None:
        self.transport.broadcast_(self.model.flat, root=0, name="od-sgd.init")

    def start(self, grad: Optional[torch.Tensor], payload: SGDPayload) -> None:
        if grad is None:
            self.buffer.zero_()
        else:
            self.buffer[:-1].copy_(grad)
            self.buffer[-1] = 1.0
        self.hyper = payload
        self.handle = self.transport.allreduce_async_(self.buffer, name="od-sgd.grad", op=ReduceOp.SUM)

    def finish(self) -> None:
        if self.handle is None:
            return
        total, self.handle = self.transport.synchronize(self.handle), None
        count = float(total[-1])
        if count == 0:  # every worker's gradient was non-finite: no global step
            return
        mean = total[:-1].div_(count)
        assert self.hyper is not None  # start() set it with the handle
        self.sgd.apply_(self.global_w, mean, self.sgd_state, **self.hyper.sgd_kwargs())

    def state_dict(self) -> Dict:
        if self.handle is not None:
            raise RuntimeError("od-sgd state_dict() with an exchange in flight: call load_global_model() first")
        return {"sgd_state": tensors_copy(self.sgd_state)}

    def load_state_dict(self, state: Dict) -> None:
        self.sgd_state = tensors_copy(state["sgd_state"])

    def snapshot(self) -> None:
        pass  # every worker's global_w is already the global one

    def close(self) -> None:
        self.finish()  # the transport (Horovod's) belongs to the job


class _GlobalStepProgram(AggregateProgram):
    """The servers' global step: every active worker's gradient, averaged, through one momentum buffer
    at the optimizer's full rate (no staleness scaling, no look-ahead), leaving the weights in the
    weights window only (every worker reads the same ones, guarded: each step is written under
    ``host.writing_weights``)."""

    def __init__(self, host):
        super().__init__(host, every=host.spec.workers, rate=1.0, staleness_lr=False, shared_momentum=True,
                         lookahead=False)
        host.reset_writing_mark()

    def maybe_apply(self, fold=None) -> None:
        # marked on every call: whether this one writes is the aggregate's business (a mark without a
        # write only sends a reader that happens to look meanwhile to the snapshot)
        with self.host.writing_weights():
            super().maybe_apply(fold)

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self.host.reset_writing_mark()  # the meta counters came from the checkpoint (older ones: slot 0)


class ODSGD(Strategy):
    """od-sgd: global SGD step exchanged one iteration late, bridged by a local step on each worker.

    Wrap a ``torch.optim.SGD``: its ``lr``/``momentum``/``weight_decay`` are the global step's.

    Options:
        local_lr: rate of the local step (default: the wrapped optimizer's lr; 0: delayed ssgd).
        local_momentum: momentum of the local SGD (default: the wrapped optimizer's momentum, so
            that the local step moves as the global one does).
        local_optimizer: callable ``params -> optimizer`` for the local step (overrides the two above).
        local_schedule: ``"follow"`` (default), ``"fixed"`` or a callable ``step -> lr``.
        exchange: ``"window"`` (parameter servers, default) or ``"allreduce"`` (Horovod, no server).

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      model.named_parameters(), algorithm="od-sgd", local_lr=0.05)

    Tuning: a local rate about the global one works on digits; lower it if the loss oscillates.
    ``opt.strategy.local_optimizer`` is the local optimizer, for schedulers of your own.
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        params = [p for _, p in named_parameters]
        self.model = FlatModel(params)
        exchange = _ServerExchange if options.exchange == "window" else _AllreduceExchange
        self.exchange = exchange(transport, self.model)
        self.global_w.copy_(self.model.flat)
        global_lr = float(optimizer.param_groups[0]["lr"])
        if options.local_optimizer is not None:
            self.local_optimizer = options.local_optimizer(params)
            if not isinstance(self.local_optimizer, torch.optim.Optimizer):
                raise TypeError(f"local_optimizer must return a torch.optim.Optimizer, got "
                                f"{type(self.local_optimizer).__name__}")
        else:
            local_lr = global_lr if options.local_lr is None else float(options.local_lr)
            local_momentum = (float(optimizer.param_groups[0].get("momentum", 0.0)) if options.local_momentum is None
                              else float(options.local_momentum))
            self.local_optimizer = torch.optim.SGD(params, lr=local_lr, momentum=local_momentum)
        self._global_lr0 = global_lr
        self._local_lr0 = [group["lr"] for group in self.local_optimizer.param_groups]
        self.hist = np.zeros(window.HIST_BINS, dtype=np.int64)
        self.fresh = True  # the local weights are the global ones (start, after load_global_model)
        self.skipped_nonfinite = 0
        self.wait_seconds = 0.0

    def _set_local_lr(self) -> None:
        schedule = self.options.local_schedule
        if schedule == "fixed":
            return
        groups = self.local_optimizer.param_groups
        if callable(schedule):
            lrs = [float(schedule(self.steps))] * len(groups)
        else:
            ratio = float(self.optimizer.param_groups[0]["lr"]) / self._global_lr0
            lrs = [lr0 * ratio for lr0 in self._local_lr0]
        for group, lr in zip(groups, lrs):
            group["lr"] = lr

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad = finite_grads(self, self.model, "not exchanged")
        finite = grad is not None
        payload = server_sgd_hyper(self.name, self.optimizer)
        start = self.clock()
        self.exchange.finish()  # w_g(t) is now in global_w
        self.wait_seconds += self.clock() - start
        self.exchange.start(grad, payload)
        if finite:
            self.hist[0 if self.fresh else 1] += 1
            self.fresh = False
        with torch.no_grad():
            self.model.flat.copy_(self.global_w)
        self.model.load_params()
        if finite:  # the parameters' .grad still hold g_m(t)
            self._set_local_lr()
            self.local_optimizer.step()
            self.model.store_params()
        self.steps += 1
        return loss

    def begin(self) -> None:
        """Worker 0's weights as they are now: the global ones and every worker's."""
        self.model.store_params()
        self.exchange.begin()
        self.model.load_params()
        self.global_w.copy_(self.model.flat)

    def load_global_model(self) -> None:
        """Collective over the workers: finish the exchange in flight, then every worker holds the
        latest global weights (the local correction is dropped) and nothing is pending."""
        start = self.clock()
        self.exchange.finish()
        self.wait_seconds += self.clock() - start
        self.exchange.snapshot()
        with torch.no_grad():
            self.model.flat.copy_(self.global_w)
        self.model.load_params()
        self.fresh = True

    def progress(self) -> int:
        if isinstance(self.exchange, _ServerExchange):
            return self.exchange.pushes
        return super().progress()

    def stats(self) -> ExchangeStats:
        mean, largest = window.staleness_summary(self.hist)
        return ExchangeStats(staleness_mean=mean, staleness_max=largest, staleness_hist=self.hist.tolist(),
                             pushes=int(self.hist.sum()), skipped_nonfinite=self.skipped_nonfinite,
                             exchange_wait_seconds=self.wait_seconds)

    @property
    def global_w(self) -> torch.Tensor:
        """The global weights as last received (the exchange's buffer: it may swap it each step)."""
        return self.exchange.global_w

    def state_dict(self):
        """Counters, the local optimizer, the global weights and the exchange's state (the servers'
        on worker 0): take it after ``load_global_model()``."""
        return {"steps": self.steps, "staleness_hist": self.hist.tolist(),
                "skipped_nonfinite": self.skipped_nonfinite,
                "local_optimizer": self.local_optimizer.state_dict(), "global_w": self.global_w.clone(),
                "fresh": self.fresh, "exchange": self.exchange.state_dict()}

    def load_state_dict(self, state):
        """Collective over the workers."""
        self.steps = int(state["steps"])
        self.hist[:] = np.asarray(state["staleness_hist"], dtype=np.int64)
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.local_optimizer.load_state_dict(state["local_optimizer"])
        self.global_w.copy_(state["global_w"])
        self.fresh = bool(state["fresh"])
        self.exchange.load_state_dict(state["exchange"])

    def close(self) -> None:
        self.exchange.close()


class ODSGDAlgorithm(Algorithm):
    """od-sgd's declaration: the global step in the servers' program (the window exchange) or on every
    worker (the allreduce exchange, no servers)."""

    Options = ODSGDOptions
    strategy = ODSGD
    mode = "mailbox"  # (the window exchange's: the global step runs in the servers' program)
    runs_user_optimizer = False  # the wrapped SGD sets the global step, on the servers or all workers

    @classmethod
    def uses_servers(cls, options, registered: bool) -> bool:
        return options.get("exchange", ODSGDOptions.exchange) == "window"

    @classmethod
    def simulated(cls, options) -> bool:  # the window exchange runs on a thread of its own
        return options.get("exchange", ODSGDOptions.exchange) == "allreduce"

    @classmethod
    def check_optimizer(cls, optimizer) -> None:
        check_server_sgd(cls.name, optimizer)

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        if options.exchange == "allreduce":
            return super().make_transport(named_parameters, options, comms)
        numel = sum(p.numel() for _, p in named_parameters)
        return comms.windows(cls.window_spec(options, numel, comms.servers, comms.group.size))

    @classmethod
    def outbox_for(cls, options) -> bool:
        return False  # the workers read the global step from the weights window (guarded)

    @classmethod
    def server_program(cls, host):
        return _GlobalStepProgram(host)

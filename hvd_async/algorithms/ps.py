"""The parameter-server family: asgd, dc-asgd and softsync over MPI windows.

Each worker keeps its model's parameters as views into one flat fp32 buffer (or, for parameters
that are not CPU float32, copies through one), and exchanges that buffer with the server shards
through a :class:`~hvd_async.transport.window.WindowTransport`. The server side of each algorithm is
its ``server_program``, run by :func:`hvd_async.serve` on every shard.

Where optimizer state lives:

- **asgd**: entirely on the worker. ``step()`` runs the wrapped optimizer (momentum, weight decay,
  Nesterov, Adam moments: whatever it is) on the local copy and pushes the change it made as a
  delta, added atomically into the global weights; the servers hold only the weights.
- **dc-asgd, softsync**: the rule runs on the servers, so the wrapped optimizer must be
  ``torch.optim.SGD``; its ``lr``, ``momentum`` and ``weight_decay`` (read from ``param_groups`` at
  every step, so schedulers work) travel with each push, and the momentum buffers live on the
  server shards; the wrapped optimizer's own ``state`` stays empty. dc-asgd keeps one momentum
  buffer per worker (what asgd keeps on each worker, so that dc-asgd with ``lam=0`` is asgd; one
  buffer shared by all pushes, as MXNet's DCASGD has, adds the implicit momentum of asynchrony to
  the explicit one and diverged on digits at momentum 0.9); softsync keeps one per worker as well
  (an aggregate is the mean of the workers' momentum directions; ``momentum='shared'`` keeps one
  buffer for every aggregate). dc-asgd's backups ``w_bak(m)`` are the server's
  per-worker outbox slots: exactly what worker m received.

Gradients holding NaN or infinity are never pushed: the worker skips the exchange, counts the step
in ``stats()["skipped_nonfinite"]`` and logs it; the servers check again before applying.
"""
import inspect
import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..checks import all_finite, is_int_at_least
from ..horovod_options import compression_name
from ..rules import DCRule, LCRule, SGDRule, staleness_scaled_mean_
from ..rules.loss_prediction import PREDICTORS
from ..transport import window as W
from .base import Strategy

logger = logging.getLogger(__name__)


class _FlatModel:
    """The parameters as one flat fp32 CPU buffer: views when they are CPU float32, copies otherwise."""

    def __init__(self, params: List[torch.Tensor]):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel, dtype=torch.float32)
        self.grad = torch.zeros(self.numel, dtype=torch.float32)
        self.views = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)
        self.slices, start = [], 0
        for p in params:
            self.slices.append(slice(start, start + p.numel()))
            start += p.numel()
        with torch.no_grad():
            for p, s in zip(params, self.slices):
                self.flat[s].copy_(p.detach().reshape(-1))
                if self.views:
                    p.data = self.flat[s].view_as(p)

    def load_params(self) -> None:
        """After ``flat`` changed: make the parameters hold it (nothing to do for views)."""
        if not self.views:
            with torch.no_grad():
                for p, s in zip(self.params, self.slices):
                    p.copy_(self.flat[s].view_as(p))

    def store_params(self) -> None:
        """After the parameters changed: copy them into ``flat`` (nothing to do for views)."""
        if not self.views:
            with torch.no_grad():
                for p, s in zip(self.params, self.slices):
                    self.flat[s].copy_(p.detach().reshape(-1))

    def gather_grads(self) -> torch.Tensor:
        """The parameters' gradients into ``grad`` (zeros where a parameter got none)."""
        with torch.no_grad():
            for p, s in zip(self.params, self.slices):
                if p.grad is None:
                    self.grad[s].zero_()
                else:
                    grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
                    self.grad[s].copy_(grad.detach().reshape(-1))
        return self.grad


def finite_grads(strategy, model: "_FlatModel", skipped: str) -> Optional[torch.Tensor]:
    """The model's gradients as one flat tensor, or None (counted in ``strategy.skipped_nonfinite``
    and logged, ``skipped`` saying what is not done) when one holds NaN or infinity."""
    grad = model.gather_grads()
    if all_finite([grad]):
        return grad
    strategy.skipped_nonfinite += 1
    if strategy.skipped_nonfinite == 1 or strategy.skipped_nonfinite % 100 == 0:
        logger.warning("worker %d: gradient holds NaN or infinity at step %d; %s (%d skipped so far)",
                       strategy.transport.rank, strategy.steps + 1, skipped, strategy.skipped_nonfinite)
    return None


def local_step_if_finite(strategy, model: "_FlatModel") -> bool:
    """The wrapped optimizer's step on the worker's weights, skipped when a gradient is not finite
    (gossip, easgd)."""
    if finite_grads(strategy, model, "optimizer step skipped") is None:
        return False
    strategy.optimizer.step()
    model.store_params()
    return True


def server_sgd_hyper(algorithm: str, optimizer) -> Dict[int, float]:
    """The SGD hyperparameters a push carries to a server-side rule, read from the param groups now
    (so schedulers work); raises where the server cannot apply what the optimizer says."""
    groups = optimizer.param_groups
    first = groups[0]
    if first.get("maximize", False):
        raise ValueError(f"{algorithm}: maximize=True is not supported on the server; minimise the "
                         f"negated objective instead")
    if first.get("dampening", 0):
        raise ValueError(f"{algorithm}: dampening={first['dampening']} is not supported; use 0")
    for group in groups[1:]:
        for key in ("lr", "momentum", "weight_decay", "nesterov"):
            if group.get(key) != first.get(key):
                raise ValueError(f"{algorithm} applies one rate on the server: every param group "
                                 f"must share {key} (got {first.get(key)} and {group.get(key)})")
    return {W.H_LR: float(first["lr"]), W.H_MOMENTUM: float(first.get("momentum", 0.0)),
            W.H_WEIGHT_DECAY: float(first.get("weight_decay", 0.0)),
            W.H_NESTEROV: float(bool(first.get("nesterov", False)))}


def check_server_sgd(algorithm: str, optimizer) -> None:
    """The rule runs on the servers with SGD's hyperparameters: the wrapped optimizer must be SGD."""
    if not isinstance(optimizer, torch.optim.SGD):
        from .. import registry

        anything = [name for name in registry.NAMES if registry.strategy_class(name).runs_user_optimizer]
        raise TypeError(f"{algorithm} applies its SGD rule on the parameter servers: wrap a "
                        f"torch.optim.SGD (got {type(optimizer).__name__}); these run any optimizer: "
                        f"{', '.join(anything)}")
    server_sgd_hyper(algorithm, optimizer)


def mailbox_snapshot(transport, flat: torch.Tensor, while_idle=None) -> None:
    """Collective over the workers of a mailbox transport: everyone receives the global weights.

    Each worker first tells the servers it is idle (so a synchronous rule does not wait for its
    gradient), then receives a snapshot (which also becomes its dc-asgd backup), calls
    ``while_idle()`` if given (no worker pushes meanwhile), then resumes."""
    transport.request_async(W.KIND_IDLE).wait()
    transport.barrier()
    transport.request_async(W.KIND_PULL, out=flat).wait()
    if while_idle is not None:
        while_idle()
    transport.request_async(W.KIND_RESUME).wait()
    transport.barrier()


def server_state_dict(transport) -> Dict:
    """The window transport's part of a state_dict: this worker's counters and, on worker 0, every
    server shard (weights, versions, the rule's buffers); exact when taken after ``load_global_model()``."""
    state = {"servers": transport.server_state()} if transport.rank == 0 else {}
    state["transport"] = transport.local_state()  # after server_state() sent the staleness counts due
    return state


def load_server_state_dict(transport, state: Dict) -> None:
    """Put back :func:`server_state_dict`'s part; collective over the workers (worker 0 restores the
    servers, and nobody pushes before they are restored)."""
    transport.load_local_state(state["transport"])
    if transport.rank == 0:
        if "servers" not in state:
            raise ValueError("this state_dict holds no server state (it was taken on a worker other than "
                             "0): load worker 0's state_dict on worker 0")
        transport.load_server_state(state["servers"])
    transport.barrier()


PUSH_RATES = ("average", "full")


def check_push_rate(value) -> None:
    if value not in PUSH_RATES:
        raise ValueError(f"push_rate must be 'average' (each push moves the global weights by "
                         f"1/workers of the optimizer's step: a round of pushes makes one ssgd step) "
                         f"or 'full' (each push a whole step), got {value!r}")


def push_scale(options, workers: int) -> float:
    """What one push's step is multiplied by: ``1 / workers`` under ``push_rate='average'``, else 1."""
    return 1.0 / workers if options.push_rate == "average" else 1.0


@dataclass
class ASGDOptions:
    pull_every: int = 1
    push_rate: str = "average"

    def __post_init__(self):
        if not is_int_at_least(self.pull_every, 1):
            raise ValueError(f"pull_every must be an integer >= 1 (pull the global weights every k "
                             f"steps), got {self.pull_every!r}")
        check_push_rate(self.push_rate)


def _wire(compression) -> str:
    """Horovod's compression option as the windows' wire format: 'fp32' or 'fp16'."""
    return "fp16" if compression_name(compression) == "fp16" else "fp32"


@dataclass
class DCASGDOptions:
    lam: float = 2.0
    adaptive: bool = True
    ms_momentum: float = 0.95
    compression: Any = "none"  # 'fp16': gradients and weights cross the network in half precision
    push_rate: str = "average"

    def __post_init__(self):
        self.compression = compression_name(self.compression)
        check_push_rate(self.push_rate)
        _check_dc_numbers(self.lam, self.ms_momentum)
        DCRule(self.lam, adaptive=self.adaptive, ms_momentum=self.ms_momentum)  # validates
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")


@dataclass
class LCASGDOptions:
    lam: float = 0.04
    adaptive: bool = False
    ms_momentum: float = 0.95
    loss_term: bool = True
    predictor: str = "linear"
    predictor_options: Optional[Dict] = None
    floor: float = 0.0
    r_min: float = 0.25
    r_max: float = 1.0
    min_history: int = 4
    compression: Any = "none"
    push_rate: str = "average"

    def __post_init__(self):
        self.compression = compression_name(self.compression)
        check_push_rate(self.push_rate)
        _check_dc_numbers(self.lam, self.ms_momentum)
        if self.predictor in PREDICTORS and isinstance(self.predictor_options, dict):
            accepted = _predictor_keywords(self.predictor)
            unknown = sorted(set(self.predictor_options) - set(accepted) - {"floor", "min_history"})
            if unknown:
                raise ValueError(f"predictor_options {', '.join(map(repr, unknown))} unknown to the "
                                 f"{self.predictor!r} predictor; accepted: {', '.join(accepted)}")
        LCRule(**self.rule_options())  # validates

    def rule_options(self) -> Dict:
        return {k: v for k, v in vars(self).items() if k not in ("compression", "push_rate")}


def _check_dc_numbers(lam, ms_momentum) -> None:
    """dc-asgd's and lc-asgd's numbers, as finite numbers in range (the rule checks the rest)."""
    def number(value):
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

    if not (number(lam) and lam >= 0):
        raise ValueError(f"lam must be a number >= 0 and finite (0 turns compensation off), got {lam!r}")
    if not (number(ms_momentum) and 0 <= ms_momentum < 1):
        raise ValueError(f"ms_momentum must be in [0, 1), got {ms_momentum!r}")


def _predictor_keywords(name: str) -> List[str]:
    """The keyword options of loss predictor ``name`` that predictor_options may set."""
    found = set()
    for cls in PREDICTORS[name].__mro__:
        if "__init__" in vars(cls):
            found |= {p.name for p in inspect.signature(vars(cls)["__init__"]).parameters.values()
                      if p.kind is p.KEYWORD_ONLY}
    return sorted(found - {"floor", "min_history"})


@dataclass
class SoftSyncOptions:
    n: Optional[int] = None
    staleness_lr: bool = False
    compression: Any = "none"
    momentum: str = "per-worker"
    push_rate: str = "average"

    def __post_init__(self):
        self.compression = compression_name(self.compression)
        check_push_rate(self.push_rate)
        if self.momentum not in ("per-worker", "shared"):
            raise ValueError(f"momentum must be 'per-worker' (one buffer per worker, as asgd and dc-asgd "
                             f"keep) or 'shared' (one buffer for every aggregate), got {self.momentum!r}")
        if self.n is not None and not is_int_at_least(self.n, 1):
            raise ValueError(f"n must be an integer between 1 and the number of workers, got {self.n!r}")
        if not isinstance(self.staleness_lr, bool):
            raise ValueError(f"staleness_lr must be True or False, got {self.staleness_lr!r}")


class PSStrategy(Strategy):
    """Common worker side of the parameter-server algorithms (not used directly)."""

    mode = "accumulate"

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        params = [p for _, p in named_parameters]
        self.model = _FlatModel(params)
        self.hist = np.zeros((transport.servers, W.HIST_BINS), dtype=np.int64)
        self.skipped_nonfinite = 0
        self.global_pushes = 0

    def begin(self) -> None:
        """Worker 0's weights as they are now become the global ones, and every worker's."""
        self.model.store_params()
        self.transport.publish_(self.model.flat)
        self.model.load_params()

    @classmethod
    def server_options(cls, options) -> Dict:
        return {}

    @classmethod
    def make_transport(cls, named_parameters, options):
        numel = sum(p.numel() for _, p in named_parameters)
        if numel == 0:
            raise ValueError("the optimizer holds no parameter elements; nothing to train")
        return W.WindowTransport(numel, algorithm=cls.name, mode=cls.mode, options=cls.server_options(options),
                                 wire=_wire(getattr(options, "compression", "none")))

    # --- what every step does ------------------------------------------------------------
    def _grads_or_skip(self) -> Optional[torch.Tensor]:
        return finite_grads(self, self.model, "not pushed")

    def _record(self, staleness) -> None:
        for k, s in enumerate(staleness):
            self.hist[k, min(int(s), W.HIST_BINS - 1)] += 1

    def step(self, closure=None):
        loss = self.reported_loss
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reported_loss = None
        grad = self._grads_or_skip()
        if grad is not None:
            self._exchange(grad, loss)
        self.steps += 1
        return loss

    def _exchange(self, grad: torch.Tensor, loss) -> None:
        raise NotImplementedError

    def progress(self) -> int:
        """Pushes applied by all workers together, as last seen by this worker (after ``load_global_model()``:
        the servers' count, the same on every worker)."""
        return self.global_pushes

    def _settle_progress(self) -> None:
        """Inside ``load_global_model()``, between two barriers of the workers (every push has landed and
        none is made): read the servers' count, the same on every worker."""
        self.global_pushes = int(self.transport.read_stats()[0]["pushes"])

    def stats(self) -> Dict:
        pooled = self.hist.sum(axis=0)
        mean, largest = W.staleness_summary(pooled)
        return {"staleness_mean": mean, "staleness_max": largest, "staleness_hist": pooled.tolist(), "pushes": int(self.hist[0].sum()),
                "skipped_nonfinite": self.skipped_nonfinite}

    def state_dict(self):
        """Counters, and the servers' whole state (on worker 0): take it after ``load_global_model()``."""
        state = {"steps": self.steps, "staleness_hist": self.hist.tolist(),
                 "skipped_nonfinite": self.skipped_nonfinite, "global_pushes": self.global_pushes}
        state.update(server_state_dict(self.transport))
        return state

    def load_state_dict(self, state):
        """Collective over the workers (worker 0 restores the servers)."""
        self.steps = int(state["steps"])
        self.hist[:] = np.asarray(state["staleness_hist"], dtype=np.int64)
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.global_pushes = int(state["global_pushes"])
        load_server_state_dict(self.transport, state)

    def close(self) -> None:
        self.transport.close()


class ASGD(PSStrategy):
    """asgd: push the local optimizer's change, added atomically into the global weights; pull.

    Each ``step()`` runs the wrapped optimizer on the local weights, pushes ``w_after - w_before``
    with ``MPI_Accumulate`` (so with plain SGD the global weights get ``w -= lr * g`` as each push
    lands, in any order), then pulls the global weights (every ``pull_every`` steps; in between the
    worker goes on from its own weights). No barrier anywhere.

    Rate: with ``push_rate='average'`` (the default) each push adds ``1 / workers`` of the change,
    so that one push from every worker moves the global weights as far as one ssgd step of the
    averaged gradient at the same ``lr``: an epoch makes ssgd's progress, and the hyperparameters
    that trained ssgd train asgd. ``push_rate='full'`` adds the whole change (workers times ssgd's
    step per epoch: divide ``lr`` by the workers yourself).

    Options:
        pull_every: pull the global weights every k steps (default 1).
        push_rate: ``'average'`` (default) or ``'full'``, as above.
    """

    name = "asgd"
    Options = ASGDOptions
    mode = "accumulate"

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._before = torch.empty_like(self.model.flat)
        self._delta = torch.empty_like(self.model.flat)
        self._scale = push_scale(options, transport.size)

    def _exchange(self, grad, loss) -> None:
        self._before.copy_(self.model.flat)
        self.optimizer.step()
        self.model.store_params()
        torch.sub(self.model.flat, self._before, out=self._delta)
        if self._scale != 1.0:
            self._delta.mul_(self._scale)
        self._record(self.transport.accumulate(self._delta))
        self.global_pushes = int(self.transport.latest_versions[0])
        if (self.steps + 1) % self.options.pull_every == 0:
            self.transport.pull(self.model.flat, after_push=True)
            self.model.load_params()

    def load_global_model(self) -> None:
        """Collective over the workers: every worker loads the global weights (after all pushes)."""
        self.transport.barrier()
        self.transport.pull(self.model.flat)
        self.model.load_params()
        self._settle_progress()
        self.transport.barrier()  # nobody pushes again before every worker has read the same state

    @classmethod
    def server_program(cls, host):
        return _AccumulateProgram(host)


class _MailboxStrategy(PSStrategy):
    """Worker side of the algorithms whose rule runs on the server: push g, receive new weights."""

    mode = "mailbox"
    runs_user_optimizer = False  # the rule's SGD runs on the servers
    compensates = False  # dc-asgd, lc-asgd: stats() adds the servers' compensation norms

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        # softsync scales its aggregates on the server (it knows how many gradients each holds)
        self._scale = 1.0 if self.name == "softsync" else push_scale(options, transport.size)

    @classmethod
    def check_optimizer(cls, optimizer) -> None:
        check_server_sgd(cls.name, optimizer)

    @classmethod
    def hyper(cls, optimizer) -> Dict[int, float]:
        return server_sgd_hyper(cls.name, optimizer)

    def _exchange(self, grad, loss) -> None:
        header = self.hyper(self.optimizer)
        header[W.H_LR] *= self._scale
        if loss is not None:
            header[W.H_LOSS] = float(loss)
        answers = self.transport.push(grad, self.model.flat, header)
        self.model.load_params()
        applied = answers[:, W.R_STATUS] == W.STATUS_APPLIED
        if applied.all():
            self._record(answers[:, W.R_STALENESS])
        else:
            self.skipped_nonfinite += 1
        self.global_pushes = int(answers[0, W.R_PUSHES])

    def load_global_model(self) -> None:
        """Collective over the workers: every worker loads the global weights (after all pushes)."""
        mailbox_snapshot(self.transport, self.model.flat, while_idle=self._settle_progress)
        self.model.load_params()

    def stats(self) -> Dict:
        """Adds ``server_ms_per_push``: the server program's time per push, on the busiest shard; dc-asgd
        and lc-asgd add ``server_pushes``, ``compensation_sq_sum`` and ``grad_sq_sum`` (sums over
        those pushes of ``||compensated step - g||^2`` and ``||g||^2``)."""
        out = super().stats()
        rows = self.transport.read_stats()
        out["server_ms_per_push"] = max(1000.0 * row["busy_seconds"] / max(1, row["pushes"]) for row in rows)
        if self.compensates:  # sums over the servers' applied pushes (the shards' parts add up)
            out["server_pushes"] = rows[0]["pushes"]
            out["compensation_sq_sum"] = sum(row["compensation_sq"] for row in rows)
            out["grad_sq_sum"] = sum(row["grad_sq"] for row in rows)
        return out


class DCASGD(_MailboxStrategy):
    """dc-asgd: the server applies ``w -= lr * (g + lam * g * g * (w - w_bak(m)))`` per push.

    Options:
        lam: compensation strength (default 2.0, the paper's lam0 for DC-ASGD-a; 0 gives asgd's
            update).
        adaptive: DC-ASGD-a, ``lam / sqrt(MS + 1e-7)`` with a running mean square of gradients
            (default True: a constant lam of 0.04, the default before, left the term numerically
            inert at the averaged rate; the adaptive lam 2 adds 2 to 11 % of the gradient's norm on
            digits, ``compensation_relative`` in benchmarks/results/convergence.json).
        ms_momentum: decay of that mean square (default 0.95).
        compression: ``hvd.Compression.fp16`` (or ``'fp16'``) sends the gradient and receives the
            weights in half precision, half the bytes; the servers keep and update fp32 weights.
            A gradient element beyond fp16's range (65504) arrives as infinity and the push is
            skipped, as any non-finite one.
        push_rate: ``'average'`` (default: the server applies ``lr / workers`` per push, so a round
            of pushes makes one ssgd step, as asgd's) or ``'full'`` (``lr`` per push).
    """

    name = "dc-asgd"
    Options = DCASGDOptions
    compensates = True

    @classmethod
    def server_options(cls, options) -> Dict:
        return {"lam": options.lam, "adaptive": options.adaptive, "ms_momentum": options.ms_momentum}

    @classmethod
    def server_program(cls, host):
        return _DCProgram(host, **host.spec.options)


class LCASGD(DCASGD):
    """lc-asgd: dc-asgd's step scaled by ``r``, from the loss the server predicts for the pushing
    worker at the version its gradient is applied to (rules/lc.py has the derivation).

    Every push carries the worker's mini-batch loss: call ``opt.step(loss=loss)`` (or
    ``opt.step(closure)``); the servers keep each worker's loss history and predictor.

    Options: dc-asgd's ``lam`` (0: no DC term), ``adaptive``, ``ms_momentum``; ``loss_term``
    (False: exactly dc-asgd), ``predictor`` (``"linear"``: a weighted fit of log-loss against
    version; ``"mlp"``: a tiny network trained online), ``predictor_options``, ``floor`` (the loss's
    lower bound, 0), ``r_min``/``r_max`` (clip of ``r``, 0.25 and 1), ``min_history`` (4).
    """

    name = "lc-asgd"
    Options = LCASGDOptions

    def _exchange(self, grad, loss) -> None:
        if loss is None and self.options.loss_term:
            raise ValueError("lc-asgd sends the mini-batch loss with every push: call "
                             "opt.step(loss=loss) (or opt.step(closure))")
        super()._exchange(grad, loss)

    @classmethod
    def server_options(cls, options) -> Dict:
        return options.rule_options()

    @classmethod
    def server_program(cls, host):
        return _LCProgram(host, **host.spec.options)


class SoftSync(_MailboxStrategy):
    """softsync (n-softsync): the server applies one update per ``c = floor(workers / n)`` gradients
    (their mean, each optionally divided by its staleness); ``n=1`` is synchronous SGD, ``n=workers``
    asgd.

    Options:
        n: 1 .. workers (default: workers).
        push_rate: ``'average'`` (default: an aggregate of ``c`` gradients takes ``c / workers``
            of ``lr``, so the ``n`` aggregates of a round of pushes make one ssgd step, as asgd's
            pushes do) or ``'full'`` (``lr`` per aggregate).
        staleness_lr: divide each gradient's rate by ``max(1, staleness)`` (the paper's rule;
            default False: on top of ``push_rate='average'`` it cuts the progress per epoch again;
            the old defaults, this with ``'full'`` and one shared buffer, are in docs/guide.md's
            convergence tables).
        compression: as dc-asgd's (fp16 on the wire, fp32 on the servers).
        momentum: ``'per-worker'`` (default: each worker's gradients go through a momentum buffer of
            its own, as in dc-asgd and asgd, and an aggregate is the mean of the workers' directions,
            so ``n=1`` is ssgd and ``n=workers`` with ``staleness_lr=False`` is asgd with
            ``push_rate='full'``) or ``'shared'`` (one buffer for every aggregate).
    """

    name = "softsync"
    Options = SoftSyncOptions

    def __init__(self, optimizer, named_parameters, transport, options):
        self._resolve_n(options, transport.size)
        super().__init__(optimizer, named_parameters, transport, options)

    @classmethod
    def make_transport(cls, named_parameters, options):
        from .. import runtime

        cls._resolve_n(options, runtime.size())  # before the servers are asked to open anything
        return super().make_transport(named_parameters, options)

    @staticmethod
    def _resolve_n(options, workers: int) -> None:
        if options.n is None:
            options.n = workers
        if not 1 <= options.n <= workers:
            raise ValueError(f"n must be between 1 and the number of workers ({workers}), got {options.n}")

    @classmethod
    def server_options(cls, options) -> Dict:
        return {"n": options.n, "staleness_lr": options.staleness_lr, "momentum": options.momentum,
                "push_rate": options.push_rate}

    @classmethod
    def server_program(cls, host):
        return _SoftSyncProgram(host, **host.spec.options)


# --- server programs (run by hvd_async.serve on each shard) ---------------------------------------

def _tensors_copy(value):
    """A deep copy of nested dicts/lists holding tensors (the rules' state), tensors cloned."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _tensors_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors_copy(v) for v in value)
    return value


class _AccumulateProgram:
    """asgd's servers do no arithmetic: the accumulates land by themselves; the loop keeps MPI moving."""

    def __init__(self, host):
        self.host = host

    def on_request(self, worker, header):
        raise RuntimeError(f"server {self.host.shard}: asgd takes no mailbox requests (worker {worker})")

    def on_leave(self, worker):
        pass


class _MailboxProgram:
    """Shared server side of dc-asgd and softsync: snapshots, idle/resume, the non-finite check."""

    def __init__(self, host):
        self.host = host
        workers = host.spec.workers
        self.active = set(range(workers))
        self.held = [0] * workers  # version of the weights each worker last received
        self.started = False
        self.sgd = SGDRule()
        self.sgd_state: Dict = {}

    def snapshot(self, worker: int, copy: bool = True) -> None:
        """The current weights into ``worker``'s outbox slot (its backup ``w_bak(worker)``); with
        ``copy=False`` only note that the worker is reading the current version itself."""
        if copy:
            self.host.outbox[worker].copy_(self.host.weights)
        self.held[worker] = self.host.version

    def staleness(self, worker: int) -> int:
        return self.host.version - self.held[worker]

    def on_request(self, worker: int, header: np.ndarray) -> None:
        if not self.started:  # every worker starts from the published weights, version 0
            for m in range(self.host.spec.workers):
                self.snapshot(m)
            self.started = True
        kind = int(header[W.H_KIND])
        if kind == W.KIND_PUSH:
            self.active.add(worker)
            grad = self.host.inbox[worker]
            if not all_finite([grad]):
                self.host.skipped_nonfinite += 1
                logger.warning("server %d: non-finite gradient from worker %d skipped (%d so far)",
                               self.host.shard, worker, self.host.skipped_nonfinite)
                self.snapshot(worker)
                self.host.answer(worker, 0, W.STATUS_SKIPPED)
                return
            self.on_push(worker, grad, header)
        elif kind == W.KIND_PULL:
            self.snapshot(worker)
            self.host.answer(worker, 0, W.STATUS_SNAPSHOT)
        elif kind == W.KIND_IDLE:
            self.on_leave(worker)
        elif kind == W.KIND_RESUME:
            self.active.add(worker)
        else:
            raise RuntimeError(f"server {self.host.shard}: unknown request kind {kind} from worker {worker}")

    def state_dict(self) -> Dict:
        """What the program keeps besides the windows (a checkpoint holds it; see ShardHost)."""
        return {"held": list(self.held), "started": self.started, "active": sorted(self.active),
                "sgd_state": _tensors_copy(self.sgd_state)}

    def load_state_dict(self, state: Dict) -> None:
        self.held = [int(v) for v in state["held"]]
        self.started = bool(state["started"])
        self.active = set(int(m) for m in state["active"])
        self.sgd_state = _tensors_copy(state["sgd_state"])

    def step_kwargs(self, header) -> Dict:
        return {"lr": float(header[W.H_LR]), "momentum": float(header[W.H_MOMENTUM]),
                "weight_decay": float(header[W.H_WEIGHT_DECAY]), "nesterov": bool(header[W.H_NESTEROV])}

    def on_push(self, worker, grad, header) -> None:
        raise NotImplementedError

    def on_leave(self, worker) -> None:
        self.active.discard(worker)


class _DCProgram(_MailboxProgram):
    def __init__(self, host, lam, adaptive, ms_momentum):
        super().__init__(host)
        self.setup(DCRule(lam, adaptive=adaptive, ms_momentum=ms_momentum))

    def setup(self, rule) -> None:
        self.rule = rule
        self.state = rule.init(self.host.weights)
        self.state["backup"] = self.host.outbox
        self.momentum = [{} for _ in range(self.host.spec.workers)]  # one buffer per worker, as asgd's

    def compensated(self, worker, grad, header) -> torch.Tensor:
        return self.rule.compensated(self.host.weights, grad, self.state, worker)

    def state_dict(self) -> Dict:
        state = super().state_dict()
        rule_state = {k: v for k, v in self.state.items() if k not in ("backup", "predictors")}
        predictors = {int(m): p.state_dict() for m, p in self.state.get("predictors", {}).items()}
        state.update(momentum=[_tensors_copy(buf) for buf in self.momentum], rule=_tensors_copy(rule_state),
                     predictors=predictors)
        return state

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self.momentum = [_tensors_copy(buf) for buf in state["momentum"]]
        self.state.update(_tensors_copy(state["rule"]))
        if "predictors" in self.state:
            self.state["predictors"] = {}
            for worker, saved in state["predictors"].items():
                predictor = self.state["predictors"][int(worker)] = self.rule.new_predictor()
                predictor.load_state_dict(saved)

    def on_push(self, worker, grad, header) -> None:
        staleness = self.staleness(worker)
        step = self.compensated(worker, grad, header)
        # the compensation's size, for the workers' stats (TensorBoard ``compensation/``)
        self.host.add_compensation(float(torch.dist(step, grad)) ** 2, float(grad.norm()) ** 2)
        self.sgd.apply_(self.host.weights, step, self.momentum[worker], **self.step_kwargs(header))
        self.host.bump([staleness])
        self.snapshot(worker)
        self.host.answer(worker, staleness, W.STATUS_APPLIED)


class _LCProgram(_DCProgram):
    """dc-asgd's program with the step scaled by the worker's predicted loss (rules/lc.py)."""

    def __init__(self, host, **options):
        _MailboxProgram.__init__(self, host)
        self.setup(LCRule(**options))

    def compensated(self, worker, grad, header) -> torch.Tensor:
        loss = float(header[W.H_LOSS])
        self.rule.observe(self.state, worker, self.held[worker], loss)  # the loss at the weights it held
        return self.rule.compensated(self.host.weights, grad, self.state, worker, loss=loss,
                                     version_now=self.host.version, version_pulled=self.held[worker])


class _SoftSyncProgram(_MailboxProgram):
    outbox_on_push = True  # False: the pushers read the weights window themselves after the answer

    def __init__(self, host, n, staleness_lr, momentum="shared", push_rate="full"):
        super().__init__(host)
        self.c = max(1, host.spec.workers // n)
        self.scale = staleness_lr
        # 'average': an aggregate of c gradients takes c / workers of the rate, so that the
        # aggregates of one round of pushes (one per worker) make one ssgd step
        self.rate = self.c / host.spec.workers if push_rate == "average" else 1.0
        self.pending: List = []
        self.mean = torch.zeros_like(host.weights)
        # 'per-worker': each worker's gradients go through its own momentum buffer (dc-asgd's and
        # asgd's), and the aggregate is the staleness-scaled mean of the workers' directions: n=1 is
        # then ssgd's single buffer (the mean of linear buffers), n=workers asgd's. 'shared': one buffer.
        self.momentum = [{} for _ in range(host.spec.workers)] if momentum == "per-worker" else None

    def on_push(self, worker, grad, header) -> None:
        self.pending.append((worker, header))
        self.maybe_apply()

    def state_dict(self) -> Dict:
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} gradient(s) wait for the "
                               f"aggregate; save after load_global_model() on every worker")
        state = super().state_dict()
        if self.momentum is not None:
            state["momentum"] = [_tensors_copy(buf) for buf in self.momentum]
        return state

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        if self.momentum is not None and "momentum" in state:
            self.momentum = [_tensors_copy(buf) for buf in state["momentum"]]

    def on_leave(self, worker) -> None:
        super().on_leave(worker)
        self.maybe_apply()

    def maybe_apply(self) -> None:
        """Apply once ``c`` gradients are in (fewer when fewer workers are pushing at all)."""
        if not self.pending or len(self.pending) < max(1, min(self.c, len(self.active))):
            return
        workers = [m for m, _ in self.pending]
        staleness = [self.staleness(m) for m in workers]
        if self.momentum is None:
            staleness_scaled_mean_([self.host.inbox[m] for m in workers], staleness, self.mean, scale=self.scale)
            if self.rate != 1.0:
                self.mean.mul_(self.rate)
            self.sgd.apply_(self.host.weights, self.mean, self.sgd_state, **self.step_kwargs(self.pending[-1][1]))
        else:
            directions = []
            for m, header in self.pending:
                kwargs = self.step_kwargs(header)
                del kwargs["lr"]
                directions.append(self.sgd.direction(self.host.weights, self.host.inbox[m], self.momentum[m], **kwargs))
            staleness_scaled_mean_(directions, staleness, self.mean, scale=self.scale)
            self.host.weights.add_(self.mean, alpha=-self.rate * self.step_kwargs(self.pending[-1][1])["lr"])
        self.host.bump(staleness, pushes=len(workers))
        self.pending = []
        for m, s in zip(workers, staleness):
            self.snapshot(m, copy=self.outbox_on_push)
            self.host.answer(m, s, W.STATUS_APPLIED)

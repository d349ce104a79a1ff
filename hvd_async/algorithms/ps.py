"""The parameter-server family's shared declarations, worker and server sides: the declaration bases
(windows on the servers; the mailbox's SGD check and options for the servers), the strategy base (flat
model, push, staleness counts, state_dict), the mailbox strategy base (the rule runs on the servers), the push
rate, the accumulate-mode server program, and the mailbox server program's base (snapshots,
idle/resume, the servers' non-finite check). Each algorithm, its options and its server program are
in a module of its own: asgd.py, dcasgd.py, lcasgd.py, softsync.py, backup.py (dbs.py builds on
asgd). The family's other public pieces: what a push carries (payload.py), the option groups its
members share (groups.py), the servers' look-ahead (lookahead.py), what dc-asgd and lc-asgd share
(compensation.py). A member imports only these public names, never another member's private ones.

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
  the explicit one, too much momentum at 0.9); softsync keeps one per worker as well
  (an aggregate is the mean of the workers' momentum directions; ``server_momentum='shared'`` keeps one
  buffer for every aggregate). dc-asgd's backups ``w_bak(m)`` are the server's
  per-worker outbox slots: exactly what worker m received.

Gradients holding NaN or infinity are never pushed: the worker skips the exchange, counts the step
in ``stats()["skipped_nonfinite"]`` and logs it; the servers check again before applying.
"""
import dataclasses
import logging
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from ..checkpoint import tensors_copy
from ..checks import all_finite, norm_if_finite
from ..rules import Blocks, Scratch, SGDRule
from ..rules.fused import FusedPush, Variant
from ..transport import window
from .algorithm import Algorithm
from .base import ExchangeStats, Strategy
from .flat import FlatModel, finite_grads
from .lookahead import Lookahead
from .payload import Payload, SGDPayload, check_server_sgd, server_sgd_hyper

logger = logging.getLogger(__name__)

def mailbox_snapshot(transport, flat: torch.Tensor, while_idle=None) -> None:
    """Collective over the workers of a mailbox transport: everyone receives the global weights.

    Each worker first tells the servers it is idle (so a synchronous rule does not wait for its
    gradient), then that it resumes, then receives a snapshot (which also becomes its dc-asgd backup)
    and calls ``while_idle()`` if given (no worker pushes before the last barrier).

    RESUME goes before the answered PULL: IDLE and RESUME are not answered, and a server takes one
    worker's requests in order but several workers' in any order (round-robin over senders). Were
    RESUME last, a fast worker's next push could be taken before a slower worker's RESUME, and a
    synchronous rule would apply it alone as a whole round. The PULL's answer proves every shard took
    this worker's RESUME; the barrier then proves it for every worker before anyone pushes."""
    transport.request_async(window.Kind.IDLE).wait()
    transport.barrier()  # every worker's last push was answered: nothing is pending on any shard
    transport.request_async(window.Kind.RESUME).wait()
    transport.request_async(window.Kind.PULL, out=flat).wait()
    if while_idle is not None:
        while_idle()
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



class PSAlgorithm(Algorithm):
    """The declaration shared by the parameter-server algorithms (not registered itself): the windows
    on the server ranks, opened for the workers' flat model; in accumulate mode the servers' program
    does no arithmetic (asgd, dbs-asgd, easgd's centre)."""

    mode = "accumulate"

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        numel = sum(p.numel() for _, p in named_parameters)
        if numel == 0:
            raise ValueError("the optimizer holds no parameter elements; nothing to train")
        cls.resolve_options(options, comms.group.size)  # before the servers are asked to open anything
        return comms.windows(cls.window_spec(options, numel, comms.servers, comms.group.size))

    @classmethod
    def server_program(cls, host):
        return AccumulateProgram(host)


class MailboxAlgorithm(PSAlgorithm):
    """The declaration shared by the algorithms whose rule runs in the servers' program: the wrapped
    optimizer must be SGD (its hyperparameters travel with each push), the servers rebuild the options."""

    mode = "mailbox"
    runs_user_optimizer = False  # the rule's SGD runs on the servers

    @classmethod
    def check_optimizer(cls, optimizer) -> None:
        check_server_sgd(cls.name, optimizer)

    @classmethod
    def server_options(cls, options) -> Dict:
        """Every field of the options, as plain values (the servers rebuild them: :meth:`server_spec`)."""
        return {field.name: getattr(options, field.name) for field in dataclasses.fields(options)}

    @classmethod
    def server_spec(cls, host):
        """What the server program is built from: the algorithm's typed options, as the workers resolved
        them, rebuilt from what the transport carried."""
        return cls.Options(**host.spec.options)


class PSStrategy(Strategy):
    """Common worker side of the parameter-server algorithms (not used directly)."""

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        params = [p for _, p in named_parameters]
        self.model = FlatModel(params)
        self.hist = np.zeros((transport.servers, window.HIST_BINS), dtype=np.int64)
        self.skipped_nonfinite = 0
        self.global_pushes = 0

    def begin(self) -> None:
        """Worker 0's weights as they are now become the global ones, and every worker's."""
        self.model.store_params()
        self.transport.publish_(self.model.flat)
        self.model.load_params()

    # --- what every step does ------------------------------------------------------------
    def _grads_or_skip(self) -> Optional[torch.Tensor]:
        return finite_grads(self, self.model, "not pushed", fp16=self.transport.spec.wire == "fp16")

    def _record(self, staleness) -> None:
        for k, s in enumerate(staleness):
            self.hist[k, min(int(s), window.HIST_BINS - 1)] += 1

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

    def stats(self) -> ExchangeStats:
        pooled = self.hist.sum(axis=0)
        mean, largest = window.staleness_summary(pooled)
        return ExchangeStats(staleness_mean=mean, staleness_max=largest, staleness_hist=pooled.tolist(),
                             pushes=int(self.hist[0].sum()), skipped_nonfinite=self.skipped_nonfinite)

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
        # the flat copy the next step's push is measured from holds the model as loaded (a copy where the
        # parameters are not its views: on a GPU)
        self.model.store_params()



class MailboxStrategy(PSStrategy):
    """Worker side of the algorithms whose rule runs on the server: push g, receive new weights."""

    # The servers set each update's rate (softsync knows how many gradients an aggregate holds; backup-sgd
    # makes one whole step per update): the pushes carry the optimizer's lr unscaled by a push rate.
    scales_on_server = False

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._scale = 1.0 if self.scales_on_server else options.push_scale(transport.size)

    def payload(self, grad: torch.Tensor, loss: Optional[float]) -> Payload:
        """What this push carries to the server program: the wrapped SGD's hyperparameters, the rate
        scaled by the push rate (a program with more fields: a payload of its own, built here)."""
        hyper = server_sgd_hyper(self.name, self.optimizer)
        return dataclasses.replace(hyper, lr=hyper.lr * self._scale)

    def _exchange(self, grad, loss) -> None:
        payload = self.payload(grad, loss).encode()
        if self.transport.spec.outbox:
            answers = self.transport.push(grad, self.model.flat, payload)
        else:  # the answer says the weights are ready: read them (guarded: a later update may be writing)
            answers = self.transport.request_async(window.Kind.PUSH, grad=grad, payload=payload).wait()
            self.transport.pull(self.model.flat, guarded=True)
        self.model.load_params()
        self._count(answers)
        self.global_pushes = answers.pushes

    def _count(self, answers) -> None:
        """Count a push by the servers' answers (backup-sgd also counts the pushes it dropped)."""
        if answers.all(window.Status.APPLIED):
            self._record(answers.staleness)
        else:
            self.skipped_nonfinite += 1

    def load_global_model(self) -> None:
        """Collective over the workers: every worker loads the global weights (after all pushes)."""
        mailbox_snapshot(self.transport, self.model.flat, while_idle=self._settle_progress)
        self.model.load_params()

    def stats(self) -> ExchangeStats:
        """Adds ``server_ms_per_push``: the server program's time per push, on the busiest shard (with a
        pool of inbox slots, ``inbox_slot_waits``: this worker's pushes that waited for one), and what
        :meth:`add_server_stats` reads from the servers' counters."""
        out = super().stats()
        rows = self.transport.read_stats()
        out.server_ms_per_push = max(1000.0 * row["busy_seconds"] / max(1, row["pushes"]) for row in rows)
        if self.transport.spec.pooled:  # pushes that found every inbox slot taken (--inbox-slots too few?)
            out.inbox_slot_waits = self.transport.slot_waits
        self.add_server_stats(out, rows)
        return out

    def add_server_stats(self, stats: ExchangeStats, rows: List[Dict]) -> None:
        """What the algorithm adds to :meth:`stats` from the shards' counters (``read_stats`` rows; the
        sums its program declares, by name: ``window.named_sums``)."""



class AccumulateProgram(window.ServerProgram):
    """The servers' program in accumulate mode (asgd, dbs-asgd, easgd's centre): no arithmetic, the
    workers' accumulates land by themselves; the servers' loop keeps MPI moving."""



class MailboxProgram(window.ServerProgram):
    """The server side shared by the programs that apply each push themselves (dc-asgd and lc-asgd,
    softsync and od-sgd's global step, backup-sgd): snapshots, idle/resume, the non-finite check.
    A program that reads each gradient's norm sets ``uses_grad_norm``: the check then takes it (one
    pass for both) and hands it to ``on_push``."""

    uses_grad_norm = False
    Payload = SGDPayload  # what the pushes carry (decoded before on_push)
    momentum: Optional[List[Dict]] = None  # per-worker SGD state, where the program keeps one
    lookahead: Optional[Lookahead] = None  # the sum of those buffers, where it answers ahead
    fused: Optional[FusedPush] = None  # the push as one compiled loop (rules/fused.py), where chosen

    def __init__(self, host):
        super().__init__(host)
        workers = host.spec.workers
        self.active = set(range(workers))
        self.held = [0] * workers  # version of the weights each worker last received
        self.started = False
        self.sgd = SGDRule()
        self.sgd_state: Dict = {}
        # a push's arithmetic, slice by slice, on the host's threads (a host without the attribute: one)
        self.blocks = Blocks(host.weights.numel(), threads=getattr(host, "threads", 1))

    def close(self) -> None:
        self.blocks.close()

    @property
    def compile_seconds(self) -> float:
        return 0.0 if self.fused is None else self.fused.compile_seconds

    @property
    def compiled_updates(self) -> int:
        return 0 if self.fused is None else self.fused.calls + self.fused.rounds

    def warm_up(self, variant: Variant) -> None:
        """Compile the fused push's ``variant`` now (:meth:`FusedPush.ready`); the eager push where it cannot."""
        if self.fused is not None and not self.fused.ready(variant):
            self.fused = None

    def answer_slice(self, worker: int, sl: slice, scratch: Scratch, step: float = 0.0, total=None) -> None:
        """Slice ``sl`` of ``worker``'s answer in its outbox slot: the weights, or with the look-ahead's
        ``step`` the look-ahead point (``total``: the shared buffer in place of the sum; an fp16 slot
        is written through ``scratch``'s third tensor). Nothing where the windows have no outbox."""
        if self.host.outbox is None:
            return
        out, weights = self.host.outbox[worker][sl], self.host.weights[sl]
        if self.lookahead is None or not step:
            out.copy_(weights)
            return
        total = self.lookahead.total if total is None else total
        wide = scratch.take(weights, 3)[2] if out.dtype != weights.dtype else None
        self.lookahead.answer(out, weights, step, total[sl], wide=wide)

    def mean_step(self, total: torch.Tensor, factor: float, kwargs) -> Callable[[slice, Scratch], None]:
        """The chain (for :attr:`blocks`) of one SGD step of the weights with ``factor * total`` (a
        running mean's sum, the division folded in), through the shared momentum buffer."""
        self.sgd.ready_buffer_(self.sgd_state, total, kwargs["momentum"])
        weights, state = self.host.weights, self.sgd_state

        def chain(sl: slice, scratch: Scratch) -> None:
            self.sgd.step_(weights[sl], [(total[sl], factor)], self.sgd.sliced(state, sl), out=scratch, **kwargs)
        return chain

    def snapshot(self, worker: int, copy: bool = True, slot: Optional[int] = None) -> None:
        """The current weights into ``worker``'s outbox slot (its backup ``w_bak(worker)``); with
        ``copy=False`` only note that the worker is reading the current version itself. Where the
        windows have no outbox, a pull's copy goes into the pull's inbox ``slot``."""
        if copy:
            if self.host.outbox is not None:
                self.host.outbox[worker].copy_(self.host.weights)
            elif slot is not None:
                self.host.inbox_raw[slot].copy_(self.host.weights)
        self.held[worker] = self.host.version

    def staleness(self, worker: int) -> int:
        return self.host.version - self.held[worker]

    def on_request(self, worker: int, request: window.Request) -> None:
        if not self.started:  # every worker starts from the published weights, version 0
            for m in range(self.host.spec.workers):
                self.snapshot(m)
            self.started = True
        kind = request.kind
        if kind is window.Kind.PUSH:
            self.active.add(worker)
            grad = self.host.inbox[worker if request.slot is None else request.slot]
            if self.uses_grad_norm:  # the check and the norm the program reports, in one pass
                grad_norm = norm_if_finite(grad)
                finite = grad_norm is not None
            else:  # (a sum: half a norm's time on the CPU)
                grad_norm, finite = None, all_finite([grad])
            if not finite:
                self.host.skipped_nonfinite += 1
                logger.warning("server %d: non-finite gradient from worker %d skipped (%d so far)",
                               self.host.shard, worker, self.host.skipped_nonfinite)
                self.snapshot(worker)
                self.host.answer(worker, 0, window.Status.SKIPPED)
                return
            self.on_push(worker, grad, self.Payload.decode(request.payload), grad_norm)
        elif kind is window.Kind.PULL:
            self.snapshot(worker, slot=request.slot)
            self.host.answer(worker, 0, window.Status.SNAPSHOT)
        elif kind is window.Kind.IDLE:
            self.on_leave(worker)
        else:  # Kind.RESUME (Request.decode refuses kinds that are none of these)
            self.active.add(worker)

    def state_dict(self) -> Dict:
        """What the program keeps besides the windows (a checkpoint holds it; see ShardHost): its own
        tensors, which ShardHost copies where the state outlives the moment (loading copies them)."""
        return {"held": list(self.held), "started": self.started, "active": sorted(self.active),
                "sgd_state": self.sgd_state}

    def load_state_dict(self, state: Dict) -> None:
        self.held = [int(v) for v in state["held"]]
        self.started = bool(state["started"])
        self.active = set(int(m) for m in state["active"])
        self.sgd_state = tensors_copy(state["sgd_state"])

    def on_push(self, worker, grad, payload, grad_norm: Optional[float] = None) -> None:
        """A finite gradient from ``worker``, with its decoded ``payload`` (``grad_norm``: its 2-norm
        under ``uses_grad_norm``, else None)."""
        raise NotImplementedError

    def on_leave(self, worker) -> None:
        self.active.discard(worker)

    def on_close(self, worker) -> None:
        """A worker gone for good no longer moves the weights: its momentum buffer leaves the
        look-ahead's sum, and is cleared so that a sum rebuilt after a checkpoint load agrees."""
        if self.momentum is not None:
            if self.lookahead is not None:
                self.lookahead.remove(self.momentum[worker])
            self.momentum[worker].clear()


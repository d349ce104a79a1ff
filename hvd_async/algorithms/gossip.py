"""gossip: local steps, then mixing with one peer through its MPI window; no server, no global barrier.

Jin, Yuan, Iandola, Keutzer, "How to scale distributed deep learning?" (arXiv 1611.04581): replace
the allreduce by gossip aggregation. Each ``step()`` runs the wrapped optimizer (any
``torch.optim`` optimizer; its state stays local) on the worker's own weights, then, every
``every`` steps, picks a peer (:class:`~hvd_async.algorithms.peers.PeerSchedule`: ``random``,
``ring`` or ``exponential``, seeded) and mixes through the
:class:`~hvd_async.transport.peer.PeerWindowTransport`:

- ``variant="pull"``: ``w_i <- (w_i + w_j) / 2`` with ``w_j`` read by one-sided ``Get`` from the
  peer's window, which holds the weights the peer published at its own last exchange (or the
  start); then ``w_i`` is published into this worker's window. ``j`` is not changed, so the mean
  over workers drifts (the spread still contracts).
- ``variant="push"`` (push-sum, as in Stochastic Gradient Push, Assran et al., ICML 2019): the
  window holds the numerator ``x_i`` and weight ``s_i`` (initially ``w`` and 1), and peers add into
  it at any time. At an exchange, under the exclusive lock on its own window, the worker folds in
  its local change since the last exchange, ``x_i += s_i * (w_i - w_i^last)``, halves ``x_i`` and
  ``s_i``, and sets its model to ``w_i = x_i / s_i`` (which takes in whatever peers pushed
  meanwhile); after releasing the lock it adds the other halves into the peer's window with
  ``MPI_Accumulate``. Mixing neither creates nor loses mass: ``sum_i x_i`` and ``sum_i s_i = N``
  stay fixed, and every model tends to ``sum x / sum s``. A worker's local change is folded scaled
  by its weight so that its model moves by exactly what its optimizer did. A worker that pushed
  many times without receiving (weight below ``MIN_PUSH_WEIGHT = 2**-20``: it ran far ahead of its
  peers) keeps everything at its exchange until pushes reach it again, so that its fp32 numerator
  cannot underflow (counted in ``stats()["mixes_held"]``).

``load_global_model()`` (collective over the workers; the training loop calls it at epoch ends before
evaluating) makes every worker hold the exact mean model, bit-identical everywhere (summed on
worker 0 and broadcast): pull: ``mean_i w_i``; push: ``sum x / sum s`` (after a barrier, so every
push has landed), and each window restarts at ``(x, s) = (mean, 1)``. Training goes on from there.

Gradients holding NaN or infinity skip the optimizer step (``stats()["skipped_nonfinite"]``); the
exchange still happens. With one worker nothing is exchanged.

Example::

    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  model.named_parameters(), algorithm="gossip", variant="push",
                                  topology="exponential")

Tuning: ``every`` > 1 saves bandwidth but lets the workers drift further apart; if the models'
spread grows (compare accuracy before and after ``load_global_model()``), mix more often. Across hosts
``progress_interval`` bounds how long a peer waits on a busy worker's window.
"""
import logging
from dataclasses import dataclass
from typing import Dict

import torch

from ..checks import is_finite_number, is_int_at_least
from ..options import option
from ..rules.mixing import pull_average_, push_sum_estimate_, push_sum_fold_, push_sum_split_
from .algorithm import Algorithm
from .base import ExchangeStats, Strategy
from .peers import TOPOLOGIES, PeerSchedule
from .flat import FlatModel, local_step_if_finite

logger = logging.getLogger(__name__)

VARIANTS = ("pull", "push")
# push-sum: a worker whose weight fell below this keeps its mass (skips the push) until peers' pushes
# raise it, so that its fp32 numerator x = s * w stays far from underflow
MIN_PUSH_WEIGHT = 2.0 ** -20


@dataclass
class GossipOptions:
    every: int = option(1, "local steps between mixes", flag="--gossip-every")
    variant: str = option("push", "pull (average with a peer's weights, one-sided Get) or push (push-sum, "
                          "half of the weights added into the peer's window)", flag="--gossip-variant",
                          choices=VARIANTS)
    topology: str = option("random", "how each worker picks its peer (random is seeded by --seed)",
                           flag="--gossip-topology", choices=TOPOLOGIES)
    seed: int = option(0, "seed of the random peers", from_job="seed")
    progress_interval: float = option(0.001, "seconds between the progress thread's calls into MPI")

    def __post_init__(self):
        if not is_int_at_least(self.every, 1):
            raise ValueError(f"every must be an integer >= 1 (mix with a peer every k steps), got {self.every!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)} (pull: average with a peer's "
                             f"weights; push: push-sum), got {self.variant!r}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
        if not is_int_at_least(self.seed, 0):
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        pi = self.progress_interval
        if not (is_finite_number(pi) and 0 < pi <= 1):
            raise ValueError(f"progress_interval must be in (0, 1] seconds, got {pi!r}")


class _PullMixer:
    """pull: this worker's window holds its weights as of its last exchange (peers read them)."""

    def __init__(self, transport, flat: torch.Tensor):
        self.transport = transport
        self.peer_w = torch.empty_like(flat)
        self.publish(flat)
        transport.barrier()  # every window holds the start before anyone reads one

    def publish(self, flat: torch.Tensor) -> None:
        with self.transport.own() as (buf, weight):
            buf.copy_(flat)
            weight[0] = 1.0

    def mix_(self, flat: torch.Tensor, peer: int) -> int:
        """``flat <- (flat + w_peer) / 2``, then publish it; returns the bytes read."""
        self.transport.get(peer, self.peer_w)
        pull_average_(flat, self.peer_w)
        self.publish(flat)
        return 4 * flat.numel() + 8

    def average_(self, flat: torch.Tensor) -> None:
        t = self.transport
        t.sum_(flat).div_(t.size)
        self.publish(flat)
        t.barrier()  # every window holds the mean before anyone reads one again

    def weight(self) -> float:
        return 1.0

    # (_PushSumMixer's window is saved and loaded by these two as well)
    def state_dict(self: "_PullMixer | _PushSumMixer") -> Dict:
        with self.transport.own() as (x, s):
            return {"window": x.clone(), "window_weight": float(s[0])}

    def load_state_dict(self: "_PullMixer | _PushSumMixer", state: Dict) -> None:
        with self.transport.own() as (x, s):
            x.copy_(state["window"])
            s[0] = float(state["window_weight"])


class _PushSumMixer:
    """push-sum: this worker's window holds ``(x_i, s_i)``; ``anchor`` is the model as last set from
    it, so ``flat - anchor`` is the optimizer's change not folded in yet."""

    def __init__(self, transport, flat: torch.Tensor):
        self.transport = transport
        self.anchor = flat.clone()
        self.send = torch.empty_like(flat)
        self.change = torch.empty_like(flat)
        self.sent_weight = self.last_weight = 1.0
        with transport.own() as (x, s):
            x.copy_(flat)
            s[0] = 1.0
        transport.barrier()  # nobody pushes into a window before its owner initialised it

    def _fold(self, flat, x, s) -> None:
        torch.sub(flat, self.anchor, out=self.change)
        push_sum_fold_(x, s[0], self.change)

    def mix_(self, flat: torch.Tensor, peer: int) -> int:
        """Fold, keep half, set the model to ``x / s``, push the other half; returns the bytes sent
        (0 when the weight is below ``MIN_PUSH_WEIGHT`` and everything is kept)."""
        with self.transport.own() as (x, s):
            self._fold(flat, x, s)
            hold = s[0] < MIN_PUSH_WEIGHT
            if not hold:
                s[0] = push_sum_split_(x, s[0], self.send)
                self.sent_weight = float(s[0])
            self.last_weight = float(s[0])
            push_sum_estimate_(x, s[0], flat)
        self.anchor.copy_(flat)
        if hold:
            return 0
        self.transport.accumulate(peer, self.send, weight=self.sent_weight)
        return 4 * flat.numel() + 8

    def average_(self, flat: torch.Tensor) -> None:
        t = self.transport
        t.barrier()  # every push has landed: each completes before its sender goes on
        with t.own() as (x, s):
            self._fold(flat, x, s)
            flat.copy_(x)
            total_s = torch.tensor([float(s[0])], dtype=torch.float64)
        t.sum_(flat)
        t.sum_(total_s)
        flat.div_(float(total_s[0]))
        with t.own() as (x, s):
            x.copy_(flat)
            s[0] = 1.0
        self.last_weight = 1.0
        self.anchor.copy_(flat)
        t.barrier()  # every window is reset before anyone pushes into one again

    def weight(self) -> float:
        """The push-sum weight as of this worker's last exchange."""
        return self.last_weight

    def state_dict(self) -> Dict:
        state = _PullMixer.state_dict(self)
        state.update(anchor=self.anchor.clone(), sent_weight=self.sent_weight, last_weight=self.last_weight)
        return state

    def load_state_dict(self, state: Dict) -> None:
        _PullMixer.load_state_dict(self, state)
        self.anchor.copy_(state["anchor"])
        self.sent_weight, self.last_weight = float(state["sent_weight"]), float(state["last_weight"])


class Gossip(Strategy):
    """gossip: local steps with the wrapped optimizer, mixing with one peer every ``every`` steps.

    Options:
        every: mix every k steps (default 1).
        variant: ``"push"`` (default: push-sum, which keeps the workers' mean exactly) or ``"pull"``
            (``w <- (w + w_peer) / 2``, which does not keep it; the guide's convergence section
            compares them).
        topology: ``"random"`` (default), ``"ring"`` or ``"exponential"``.
        seed: seeds the random peer choice, ``default_rng((seed, rank))`` (default 0).
        progress_interval: seconds between the window progress thread's MPI calls (default 0.001).
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self.model = FlatModel([p for _, p in named_parameters])
        self.peers = PeerSchedule(options.topology, rank=transport.rank, size=transport.size, seed=options.seed)
        self.mixer = None  # made in begin(), from the weights every worker starts from
        self.mixes = 0
        self.held = 0  # push-sum exchanges skipped at a low weight
        self.bytes_moved = 0
        self.wait_seconds = 0.0
        self.skipped_nonfinite = 0

    def begin(self) -> None:
        """Every worker starts from worker 0's weights as they are now; the windows hold them."""
        self.model.store_params()
        self.transport.broadcast_(self.model.flat, root=0)
        self.model.load_params()
        mixer = _PullMixer if self.options.variant == "pull" else _PushSumMixer
        self.mixer = mixer(self.transport, self.model.flat)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        local_step_if_finite(self, self.model)
        self.steps += 1
        if self.steps % self.options.every == 0:
            self.mix()
        return loss

    def mix(self) -> None:
        """One exchange with the next peer of the schedule (``step()`` calls it every ``every`` steps)."""
        peer = self.peers.next()
        if peer is None:
            return
        start = self.clock()
        moved = self.mixer.mix_(self.model.flat, peer)
        self.model.load_params()
        self.wait_seconds += self.clock() - start
        self.bytes_moved += moved
        if moved:
            self.mixes += 1
        else:
            self.held += 1

    def load_global_model(self) -> None:
        """Collective over the workers: every worker holds the exact mean model (see the module doc)."""
        start = self.clock()
        self.model.store_params()
        self.mixer.average_(self.model.flat)
        self.model.load_params()
        self.wait_seconds += self.clock() - start

    def stats(self) -> ExchangeStats:
        return ExchangeStats(exchange_wait_seconds=self.wait_seconds, skipped_nonfinite=self.skipped_nonfinite,
                             extra={"mixes": self.mixes, "mixes_held": self.held, "bytes_moved": self.bytes_moved,
                                    "push_sum_weight": self.mixer.weight() if self.mixer else 1.0})

    def state_dict(self):
        return {"steps": self.steps, "mixes": self.mixes, "bytes_moved": self.bytes_moved,
                "skipped_nonfinite": self.skipped_nonfinite, "peer_count": self.peers.count,
                "peer_rng": self.peers.rng.bit_generator.state, "mixer": self.mixer.state_dict()}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])
        self.mixes = int(state["mixes"])
        self.bytes_moved = int(state["bytes_moved"])
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.peers.count = int(state["peer_count"])
        self.peers.rng.bit_generator.state = state["peer_rng"]
        self.transport.barrier()  # nobody reads a window that is still being restored
        self.mixer.load_state_dict(state["mixer"])
        self.transport.barrier()


class GossipAlgorithm(Algorithm):
    """gossip's declaration: one-sided windows among the workers (peer windows, its registry row)."""

    Options = GossipOptions
    strategy = Gossip

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        numel = sum(p.numel() for _, p in named_parameters)
        if numel == 0:
            raise ValueError("the optimizer holds no parameter elements; nothing to train")
        return comms.peers(numel, cls.name, options.progress_interval)

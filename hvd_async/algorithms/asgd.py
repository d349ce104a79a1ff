"""asgd: each worker's optimizer step pushed as a delta, added atomically into the global weights
on the servers' windows (``MPI_Accumulate``); the servers do no arithmetic."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from .groups import PullEvery, PushRate, WorkerLookaheadOption
from .ps import PSAlgorithm, PSStrategy


@dataclass
class ASGDOptions(WorkerLookaheadOption, PushRate, PullEvery):
    """asgd's options: pull_every, push_rate, lookahead (the groups it takes; nothing of its own)."""


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

    Look-ahead (``lookahead=True``, the default): by the time this worker's next push lands, the
    other workers' pushes have moved the global weights on, and with momentum most of that move is
    known now: about ``momentum`` times the move the weights made since this worker's previous pull
    (every worker's momentum term carries its last step on). So after each pull the worker computes
    its next gradient at ``w + momentum * (w - w_prev) / pull_every`` rather than at ``w`` (``w_prev``:
    the weights of the previous pull; a per-group ``momentum`` per parameter). It is DANA's
    look-ahead (Hakimi et al., 2019), which dc-asgd's servers compute from the momentum buffers they
    hold, estimated here from the weights alone, since asgd's momentum lives in the workers'
    optimizers. The push is unchanged (the optimizer's step is the same wherever it starts) and
    ``load_global_model()`` loads the plain weights. Without momentum it changes nothing. After a
    checkpoint is loaded the first pull has no previous one and is not carried on.

    Options:
        pull_every: pull the global weights every k steps (default 1).
        push_rate: ``'average'`` (default) or ``'full'``, as above.
        lookahead: carry the pulled weights on by the momentum, as above (default True).
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self._before = torch.empty_like(self.model.flat)
        self._delta = torch.empty_like(self.model.flat)
        self._scale = options.push_scale(transport.size)
        self._previous = None  # the weights of the previous pull (lookahead)

    def _exchange(self, grad, loss) -> None:
        self._before.copy_(self.model.flat)
        self.optimizer.step()
        self.model.store_params()
        torch.sub(self.model.flat, self._before, out=self._delta)
        if self._scale != 1.0:
            self._delta.mul_(self._scale)
        pull = (self.steps + 1) % self.options.pull_every == 0
        if pull:  # push, then read the global weights (one call: it saves a round trip across hosts)
            self._record(self.transport.accumulate_and_pull(self._delta, self.model.flat))
        else:
            self._record(self.transport.accumulate(self._delta))
        self.global_pushes = int(self.transport.latest_versions[0])
        if pull:
            if self.options.lookahead:
                self._look_ahead()
            self.model.load_params()

    def _look_ahead(self) -> None:
        """``flat <- flat + momentum * (flat - previous) / pull_every``; ``previous <- the pulled flat``."""
        flat = self.model.flat
        if self._previous is None:
            self._previous = flat.clone()
            return
        move = self._before  # free until the next step
        torch.sub(flat, self._previous, out=move)
        self._previous.copy_(flat)
        every = self.options.pull_every
        groups = self.optimizer.param_groups
        momenta = {_momentum(g) for g in groups}
        if len(momenta) == 1:  # (the usual case: one momentum for every parameter)
            momentum = momenta.pop()
            if momentum:
                flat.add_(move, alpha=momentum / every)
            return
        group_of = {id(p): g for g in groups for p in g["params"]}  # (as the groups stand now)
        for p, part in zip(self.model.params, self.model.slices):
            momentum = _momentum(group_of.get(id(p), {}))
            if momentum:
                flat[part].add_(move[part], alpha=momentum / every)

    def load_global_model(self) -> None:
        """Collective over the workers: every worker loads the global weights (after all pushes)."""
        self.transport.barrier()
        self.transport.pull(self.model.flat)
        self.model.load_params()
        if self._previous is not None:
            self._previous.copy_(self.model.flat)
        self._settle_progress()
        self.transport.barrier()  # nobody pushes again before every worker has read the same state

    def state_dict(self):
        """As the family's, and whether the look-ahead had pulled before (its previous pull is then the
        global weights, which the model holds when the state is taken, after ``load_global_model()``,
        and again when it is loaded, after the model)."""
        return dict(super().state_dict(), lookahead_pulled=self._previous is not None)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._previous = self.model.flat.clone() if state.get("lookahead_pulled") else None



class ASGDAlgorithm(PSAlgorithm):
    """asgd's declaration: the workers' accumulates land by themselves on the servers."""

    Options: ClassVar[type] = ASGDOptions
    strategy: ClassVar[type] = ASGD


def _momentum(group) -> float:
    """A parameter group's SGD momentum (0 for optimizers without one, e.g. Adam)."""
    return float(group.get("momentum", 0.0) or 0.0)

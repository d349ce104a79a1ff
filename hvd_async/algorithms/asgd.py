"""asgd: each worker's optimizer step pushed as a delta, added atomically into the global weights
on the servers' windows (``MPI_Accumulate``); the servers do no arithmetic."""
from dataclasses import dataclass

import torch

from ..checks import is_int_at_least
from ..transport import window as W
from .ps import PUSH_RATE_HELP, PUSH_RATES, PSStrategy, check_push_rate, push_scale
from ..options import option


@dataclass
class ASGDOptions:
    pull_every: int = option(1, "pull the global weights every k steps", flag="--pull-every")
    push_rate: str = option("average", PUSH_RATE_HELP, flag="--push-rate", choices=PUSH_RATES)

    def __post_init__(self):
        if not is_int_at_least(self.pull_every, 1):
            raise ValueError(f"pull_every must be an integer >= 1 (pull the global weights every k "
                             f"steps), got {self.pull_every!r}")
        check_push_rate(self.push_rate)



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
        return AccumulateProgram(host)



class AccumulateProgram(W.ServerProgram):
    """asgd's servers do no arithmetic: the accumulates land by themselves; the loop keeps MPI moving."""


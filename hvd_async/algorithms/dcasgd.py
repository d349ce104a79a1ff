"""dc-asgd: the servers apply each worker's gradient with delay compensation
``lam * g * g * (w - w_bak(m))``, through a momentum buffer per worker, and answer with the
look-ahead weights (``lookahead``)."""
from dataclasses import dataclass
from typing import Any, Dict

import torch

from ..checks import is_finite_number
from ..horovod_options import compression_name
from ..options import option
from ..rules import DCRule
from ..rules.dc import SCRATCH_KEYS, scratch
from ..transport import window as W
from .flat import tensors_copy
from .ps import (LOOKAHEAD_HELP, PUSH_RATE_HELP, PUSH_RATES, Lookahead, MailboxProgram, MailboxStrategy,
                 check_lookahead, check_push_rate)

LAM_HELP = "delay-compensation strength (0: none); lam0 with --dc-adaptive"
ADAPTIVE_HELP = "adaptive lam / sqrt(mean square of gradients) (DC-ASGD-a)"
MS_MOMENTUM_HELP = "decay of the mean square of gradients that --dc-adaptive divides by, in [0, 1)"


@dataclass
class DCASGDOptions:
    lam: float = option(2.0, LAM_HELP, flag="--lam")
    adaptive: bool = option(True, ADAPTIVE_HELP, flag="--dc-adaptive", action="boolean")
    ms_momentum: float = option(0.95, MS_MOMENTUM_HELP, flag="--ms-momentum")
    compression: Any = option("none", "'fp16': gradients and weights cross the network in half precision (the "
                              "servers keep fp32 weights and arithmetic)")
    push_rate: str = option("average", PUSH_RATE_HELP, flag="--push-rate", choices=PUSH_RATES)
    lookahead: bool = option(True, LOOKAHEAD_HELP, flag="--lookahead", action="boolean")

    def __post_init__(self):
        self.compression = compression_name(self.compression)
        check_push_rate(self.push_rate)
        check_lookahead(self.lookahead)
        _check_dc_numbers(self.lam, self.ms_momentum)
        DCRule(self.lam, adaptive=self.adaptive, ms_momentum=self.ms_momentum)  # validates
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")



def _check_dc_numbers(lam, ms_momentum) -> None:
    """dc-asgd's and lc-asgd's numbers, as finite numbers in range (the rule checks the rest)."""
    if not (is_finite_number(lam) and lam >= 0):
        raise ValueError(f"lam must be a number >= 0 and finite (0 turns compensation off), got {lam!r}")
    if not (is_finite_number(ms_momentum) and 0 <= ms_momentum < 1):
        raise ValueError(f"ms_momentum must be in [0, 1), got {ms_momentum!r}")



class DCASGD(MailboxStrategy):
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
        lookahead: answer each push with ``w - lr * momentum * sum_k buf_k`` (DANA's look-ahead, Hakimi
            et al. 2019: where the workers' momentum will have carried the weights when this worker's
            next gradient lands; the backup ``w_bak(m)`` is that point) instead of ``w`` (default
            True; without momentum the two are the same).
    """

    name = "dc-asgd"
    Options = DCASGDOptions
    compensates = True

    @classmethod
    def server_options(cls, options) -> Dict:
        return {"lam": options.lam, "adaptive": options.adaptive, "ms_momentum": options.ms_momentum,
                "lookahead": options.lookahead}

    @classmethod
    def server_program(cls, host):
        return DCProgram(host, **host.spec.options)



class DCProgram(MailboxProgram):
    def __init__(self, host, lam, adaptive, ms_momentum, lookahead=False):
        super().__init__(host)
        self.setup(DCRule(lam, adaptive=adaptive, ms_momentum=ms_momentum), lookahead)

    def setup(self, rule, lookahead: bool) -> None:
        self.rule = rule
        self.state = rule.init(self.host.weights)
        self.state["backup"] = self.host.outbox  # what each worker received: with the look-ahead, that point
        self.momentum = [{} for _ in range(self.host.spec.workers)]  # one buffer per worker, as asgd's
        self.lookahead = Lookahead(self.host.weights) if lookahead else None

    def compensated(self, worker, grad, payload) -> torch.Tensor:
        return self.rule.compensated(self.host.weights, grad, self.state, worker)

    def looks_ahead(self, kwargs) -> bool:
        """Whether this program answers a push with these SGD settings with the look-ahead point."""
        return self.lookahead is not None and Lookahead.applies(kwargs)

    def state_dict(self) -> Dict:
        state = super().state_dict()
        rule_state = {k: v for k, v in self.state.items() if k not in ("backup", "predictors") + SCRATCH_KEYS}
        predictors = {int(m): p.state_dict() for m, p in self.state.get("predictors", {}).items()}
        state.update(momentum=[tensors_copy(buf) for buf in self.momentum], rule=tensors_copy(rule_state),
                     predictors=predictors)
        return state

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self.momentum = [tensors_copy(buf) for buf in state["momentum"]]
        if self.lookahead is not None:
            self.lookahead.rebuild(self.momentum)
        self.state.update(tensors_copy(state["rule"]))
        if "predictors" in self.state:
            self.state["predictors"] = {}
            for worker, saved in state["predictors"].items():
                predictor = self.state["predictors"][int(worker)] = self.rule.new_predictor()
                predictor.load_state_dict(saved)

    def on_push(self, worker, grad, payload) -> None:
        staleness = self.staleness(worker)
        step = self.compensated(worker, grad, payload)
        # the compensation's size, for the workers' stats (TensorBoard ``compensation/``)
        diff, = scratch(self.state, grad, 1, key="scratch_diff")  # (no temporary: see DCRule.compensated)
        self.host.add_sums(float(torch.sub(step, grad, out=diff).norm()) ** 2,
                           float(grad.norm()) ** 2)  # read by MailboxStrategy.stats
        kwargs, buffer = self.step_kwargs(payload), self.momentum[worker]
        if self.lookahead is not None:
            self.lookahead.remove(buffer)
        self.sgd.apply_(self.host.weights, step, buffer, **kwargs)
        self.host.bump([staleness])
        if self.lookahead is None:
            self.snapshot(worker)
        else:
            self.lookahead.add(buffer)
            self.snapshot(worker, copy=False)
            ahead = kwargs["lr"] * kwargs["momentum"] if self.looks_ahead(kwargs) else 0.0
            self.lookahead.answer(self.host.outbox[worker], self.host.weights, ahead)
        self.host.answer(worker, staleness, W.Status.APPLIED)


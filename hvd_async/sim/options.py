"""``hvd-async simulate``'s options: every option of ``hvd-async train`` plus the simulator's own.

The parser is :func:`hvd_async.job.config.build_parser` (so every algorithm flag means what it means for
``train``) with the simulator's options added; values are checked by :func:`hvd_async.job.config.validate`
with ``world_size = workers + servers`` and then by :func:`check`, which returns the job's
:class:`~hvd_async.job.jobspec.JobSpec` and the simulator's :class:`SimOptions`. Every bad value raises
:class:`~hvd_async.job.config.ConfigError` with one line.
"""
import argparse
import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import options, registry
from ..job import config
from ..options import option

DEFAULT_COMPUTE_MS = 10.0


@dataclasses.dataclass
class SimOptions:
    """The simulator's own options (beside every option of ``hvd-async train``)."""

    workers: int = option(4, "simulated workers", flag="--workers", metavar="N")
    latency_ms: float = option(0.0, "simulated time per round trip the transport waits for (a flush of its "
                               "one-sided reads and writes, a request and its answer, a collective)",
                               flag="--latency-ms", metavar="MS")
    slow_workers: int = option(0, "slow the first K workers down by --slow-factor", flag="--slow-workers",
                               metavar="K")
    slow_factor: float = option(4.0, "compute-time factor of the --slow-workers (>= 1; multiplies "
                                "--straggler's)", flag="--slow-factor", metavar="F")
    trace_out: Optional[str] = option(
        None, "write every worker's pushes and pulls (and final weights) here, in the format "
        "HVD_ASYNC_WINDOW_TRACE gives a real run (the parameter-server algorithms)", flag="--trace-out",
        metavar="DIR")
    replay: Optional[str] = option(
        None, "{replayable}: make the pushes land in the order a real run recorded "
        "(HVD_ASYNC_WINDOW_TRACE=DIR); needs the same --workers, --seed and options", flag="--replay",
        metavar="DIR")

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not 0 <= self.latency_ms < float("inf"):
            raise ValueError(f"latency_ms must be a finite number >= 0, got {self.latency_ms}")
        if not 0 <= self.slow_workers <= self.workers:
            raise ValueError(f"slow_workers must be between 0 and --workers ({self.workers}), "
                             f"got {self.slow_workers}")
        if not 1 <= self.slow_factor < float("inf"):
            raise ValueError(f"slow_factor must be >= 1 and finite (how many times longer a step takes), "
                             f"got {self.slow_factor}")
        if self.trace_out and os.path.exists(self.trace_out) and not os.path.isdir(self.trace_out):
            raise ValueError(f"trace_out {self.trace_out} exists and is not a folder; give a folder for the "
                             f"trace files")
        if self.replay is not None:
            if self.latency_ms:
                raise ValueError("replay needs --latency-ms 0 (the recorded order, not latency, "
                                 "decides when a push lands)")
            if not os.path.isdir(self.replay):
                raise ValueError(f"replay {self.replay} is not a folder; give the folder a real run wrote "
                                 f"with HVD_ASYNC_WINDOW_TRACE=DIR (worker-R.jsonl files)")

    def factors(self, stragglers) -> List[float]:
        """Each worker's compute-time factor: its --straggler's times --slow-factor for the first K."""
        return [stragglers.get(w, 1.0) * (self.slow_factor if w < self.slow_workers else 1.0)
                for w in range(self.workers)]


def build_parser(*, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    retuned: Dict[str, Dict[str, Any]] = {
        "np": {"help": "ignored by the simulator unless given: then it must equal --workers plus --servers"},
        "compute_ms": {"default": DEFAULT_COMPUTE_MS,
                       "help": "mean simulated device time per step of a nominal batch (virtual ms; > 0)"},
        "straggler": {"help": "multiply that worker's device times by FACTOR (repeatable; workers are "
                              "numbered 0..workers-1)"},
        "progress": {"help": "ignored: the simulator prints one line per epoch"},
    }
    p = config.build_parser(prog="hvd-async simulate", launcher=False, suppress_defaults=suppress_defaults,
                            retuned=retuned)
    p.description = ("Simulate the training job with N workers on one core: the real strategies and "
                     "server programs, a virtual clock, per-worker compute times drawn from a "
                     "distribution. Deterministic: the same seed gives the same metrics JSON. Times "
                     "in the output are simulated seconds (time_base: simulated).")
    options.add_options(p.add_argument_group("simulator"), SimOptions, suppress_defaults=suppress_defaults,
                        names={"replayable": registry.replayable()})
    return p


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Flags over the defaults and the ``--config`` file (flags win), as ``config.parse``."""
    return config.parse(list(argv or []), parser_for=lambda suppress_defaults: build_parser(
        suppress_defaults=suppress_defaults))


def check(args: argparse.Namespace) -> Tuple[config.JobSpec, SimOptions]:
    """``config.validate`` for ``workers + servers`` processes, then the simulator's own checks: the
    job's description and the simulator's options."""
    if args.replay is not None and args.algo in registry.names() and args.algo not in registry.replayable():
        raise config.ConfigError(f"--replay supports {', '.join(registry.replayable())} (the order of pushes "
                                 f"decides the run), not {args.algo}")
    sim = config.options_from(SimOptions, args)
    spec = config.validate(args, workers=sim.workers)
    job = spec.job
    for flag, given in (("--checkpoint-dir", job.checkpoint_dir), ("--resume", job.resume),
                        ("--worker-timeout", job.worker_timeout), ("--device cuda", job.device == "cuda")):
        if given:
            raise config.ConfigError(f"{flag} is an option of 'hvd-async train'; the simulator runs in one "
                                     f"process on the CPU, never checkpoints and has no worker to time out")
    if not spec.algorithm.declaration.simulated(spec.algorithm.given):
        raise config.ConfigError(f"--algo {spec.algo} {config.given_flags(args) or '(its default options)'} cannot "
                                 f"be simulated (its exchange runs on a thread of its own); the simulator runs: "
                                 f"{', '.join(_simulated())}")
    if not job.compute_ms > 0:
        raise config.ConfigError(f"--compute-ms must be > 0 in the simulator (mean virtual compute per step), "
                                 f"got {job.compute_ms}")
    return spec, sim


def _simulated() -> list:
    """The algorithms the simulator runs with their defaults, and those it runs with some options."""
    out = []
    for name, cls in registry.algorithms().items():
        if cls.simulated({}):
            out.append(name)
        else:
            other = [f"{how.flag} {v}" for field, how in options.declared(cls.Options) if how.choices
                     for v in how.choices if v != field.default and cls.simulated({field.name: v})]
            if other:
                out.append(f"{name} with {' or '.join(other)}")
    return out

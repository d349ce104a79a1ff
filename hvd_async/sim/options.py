"""``hvd-async simulate``'s options: every option of ``hvd-async train`` plus the simulator's own.

The parser is :func:`hvd_async.config.build_parser` (so every algorithm flag means what it means for
``train``) with the simulator's options added; values are checked by :func:`hvd_async.config.validate`
with ``world_size = workers + servers`` and then by :func:`check`. Every bad value raises
:class:`~hvd_async.config.ConfigError` with one line.
"""
import argparse
import os
from typing import Optional, Sequence

from .. import config, options, registry
from .delays import DEFAULT_SHAPE, DISTRIBUTIONS, check_shape

DEFAULT_COMPUTE_MS = 10.0


def _retune(parser, dest: str, **changes) -> None:
    """Change the default and help of one of train's options for the simulator."""
    for action in parser._actions:
        if action.dest == dest:
            for key, value in changes.items():
                setattr(action, key, value)
            return
    raise KeyError(dest)


def build_parser(*, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    d = (lambda value: argparse.SUPPRESS) if suppress_defaults else (lambda value: value)
    p = config.build_parser(prog="hvd-async simulate", launcher=False, suppress_defaults=suppress_defaults)
    p.description = ("Simulate the training job with N workers on one core: the real strategies and "
                     "server programs, a virtual clock, per-worker compute times drawn from a "
                     "distribution. Deterministic: the same seed gives the same metrics JSON. Times "
                     "in the output are simulated seconds (time_base: simulated).")
    _retune(p, "np", help="ignored by the simulator unless given: then it must equal --workers plus --servers")
    _retune(p, "compute_ms", default=d(DEFAULT_COMPUTE_MS),
            help="mean simulated compute time per step of a nominal batch (virtual ms; > 0)")
    _retune(p, "straggler", help="multiply that worker's compute times by FACTOR (repeatable; workers "
                                 "are numbered 0..workers-1)")
    _retune(p, "progress", help="ignored: the simulator prints one line per epoch")
    g = p.add_argument_group("simulator")
    g.add_argument("--workers", type=int, default=d(4), metavar="N", help="simulated workers")
    g.add_argument("--delay-dist", choices=DISTRIBUTIONS, default=d("constant"),
                   help="distribution of each step's compute time (mean --compute-ms)")
    g.add_argument("--delay-shape", type=float, default=d(None), metavar="X",
                   help="the distribution's shape: uniform half-width as a fraction of the mean "
                        f"(default {DEFAULT_SHAPE['uniform']}), lognormal sigma ({DEFAULT_SHAPE['lognormal']}), "
                        f"pareto alpha > 1 ({DEFAULT_SHAPE['pareto']}); constant and exponential take none")
    g.add_argument("--latency-ms", type=float, default=d(0.0), metavar="MS",
                   help="simulated time per exchange (a push, a pull, a request and its answer, a "
                        "collective, a peer's get or accumulate)")
    g.add_argument("--slow-workers", type=int, default=d(0), metavar="K",
                   help="slow the first K workers down by --slow-factor")
    g.add_argument("--slow-factor", type=float, default=d(4.0), metavar="F",
                   help="compute-time factor of the --slow-workers (>= 1; multiplies --straggler's)")
    g.add_argument("--trace-out", default=d(None), metavar="DIR",
                   help="write every worker's pushes and pulls (and final weights) here, in the format "
                        "HVD_ASYNC_WINDOW_TRACE gives a real run (the parameter-server algorithms)")
    g.add_argument("--replay", default=d(None), metavar="DIR",
                   help="asgd, dc-asgd, lc-asgd: make the pushes land in the order a real run recorded "
                        "(HVD_ASYNC_WINDOW_TRACE=DIR); needs the same --workers, --seed and options")
    return p


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Flags over the defaults and the ``--config`` file (flags win), as ``config.parse``."""
    argv = list(argv or [])
    config.load_plugins(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    given = vars(build_parser(suppress_defaults=True).parse_args(argv))
    from_file = {}
    if args.config:
        from_file = config._load_yaml(args.config, parser)
        merged = vars(args)
        merged.update(from_file)
        merged.update(given)
        args = argparse.Namespace(**merged)
    return config.apply_dataset_defaults(args, {*given, *from_file})


def check(args: argparse.Namespace) -> argparse.Namespace:
    """``config.validate`` for ``workers + servers`` processes, then the simulator's own checks."""
    if args.workers < 1:
        raise config.ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.servers is None:
        try:
            row = registry.get(args.algo)
        except ValueError:
            row = None  # validate() says what is accepted
        if row is not None:
            args.servers = int(registry.uses_servers(args.algo, config.algorithm_options(args)))
    config.validate(args, world_size=args.workers + (args.servers or 0))
    for flag, given in (("--checkpoint-dir", args.checkpoint_dir), ("--resume", args.resume),
                        ("--worker-timeout", args.worker_timeout), ("--device cuda", args.device == "cuda")):
        if given:
            raise config.ConfigError(f"{flag} is an option of 'hvd-async train'; the simulator runs in one "
                                     f"process on the CPU, never checkpoints and has no worker to time out")
    if not registry.strategy_class(args.algo).simulated(config.algorithm_options(args)):
        raise config.ConfigError(f"--algo {args.algo} {config.given_flags(args) or '(its default options)'} cannot "
                                 f"be simulated (its exchange runs on a thread of its own); the simulator runs: "
                                 f"{', '.join(_simulated())}")
    if not args.compute_ms > 0:
        raise config.ConfigError(f"--compute-ms must be > 0 in the simulator (mean virtual compute per step), "
                                 f"got {args.compute_ms}")
    if not 0 <= args.latency_ms < float("inf"):
        raise config.ConfigError(f"--latency-ms must be a finite number >= 0, got {args.latency_ms}")
    if not 0 <= args.slow_workers <= args.workers:
        raise config.ConfigError(f"--slow-workers must be between 0 and --workers ({args.workers}), "
                                 f"got {args.slow_workers}")
    if not 1 <= args.slow_factor < float("inf"):
        raise config.ConfigError(f"--slow-factor must be >= 1 and finite (how many times longer a step "
                                 f"takes), got {args.slow_factor}")
    if args.trace_out and os.path.exists(args.trace_out) and not os.path.isdir(args.trace_out):
        raise config.ConfigError(f"--trace-out {args.trace_out} exists and is not a folder; give a folder "
                                 f"for the trace files")
    try:
        args.delay_shape = check_shape(args.delay_dist, args.delay_shape)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from None
    if args.replay is not None:
        if args.algo not in registry.replayable():
            raise config.ConfigError(f"--replay supports {', '.join(registry.replayable())} (the order of pushes "
                                     f"decides the run), not {args.algo}")
        if args.latency_ms:
            raise config.ConfigError("--replay needs --latency-ms 0 (the recorded order, not latency, "
                                     "decides when a push lands)")
        if not os.path.isdir(args.replay):
            raise config.ConfigError(f"--replay {args.replay} is not a folder; give the folder a real run wrote "
                                     f"with HVD_ASYNC_WINDOW_TRACE=DIR (worker-R.jsonl files)")
    return args


def _simulated() -> list:
    """The algorithms the simulator runs with their defaults, and those it runs with some options."""
    out = []
    for name, cls in registry.strategies().items():
        if cls.simulated({}):
            out.append(name)
        else:
            other = [f"{how.flag} {v}" for field, how in options.declared(cls.Options) if how.choices
                     for v in how.choices if v != field.default and cls.simulated({field.name: v})]
            if other:
                out.append(f"{name} with {' or '.join(other)}")
    return out


def factors(args) -> list:
    """Each worker's compute-time factor: its --straggler's times --slow-factor for the first K."""
    return [args.stragglers.get(w, 1.0) * (args.slow_factor if w < args.slow_workers else 1.0)
            for w in range(args.workers)]

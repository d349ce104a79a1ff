"""The training job's options: one parser for the launcher and the job, YAML presets, and validation.

Every bad value raises :class:`ConfigError` with one line naming the value and what is accepted; the
command-line front ends print that line and exit with status 2.
"""
import argparse
import difflib
import math
import os
import shlex
import sys
from typing import Dict, List, Optional, Sequence

import yaml

from . import options, registry
from .data import DATASETS, EVAL_SPLITS, FILE_DATASETS
from .models import MODELS
from .progress import LINE_EVERY, MODES as PROGRESS_MODES


MAX_SEED = 2 ** 32 - 1  # numpy's and scikit-learn's seeds are 32-bit

# Where the job's defaults (chosen on digits) do not suit a dataset: options that --dataset NAME sets
# unless a flag or the --config file gives them, each chosen for ssgd on the dataset's validation split.
DATASET_DEFAULTS = {
    # the best rate of a sweep on the validation split (the guide's Fashion-MNIST section has it)
    "fashion-mnist": {"model": "lenet", "lr": 0.02},
}


class ConfigError(ValueError):
    """A bad option value; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump) and raise ConfigError."""

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            message += f"; '{self.prog} --help' lists the accepted options"
        elif "ignored explicit argument" in message:
            message += " (a flag: give it without a value)"
        raise ConfigError(message)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, except where there is none to show (None)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser(prog: str = "hvd-async train", *, launcher: bool = True,
                 suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """The job's parser; ``launcher`` adds the options only ``hvd-async train`` reads."""
    d = (lambda value: argparse.SUPPRESS) if suppress_defaults else (lambda value: value)
    p = _Parser(prog=prog, description="Train a model with a distributed SGD algorithm from the "
                "hvd_async registry (the reference training job).",
                formatter_class=_Help,
                argument_default=argparse.SUPPRESS if suppress_defaults else None)
    p.add_argument("--config", metavar="FILE.yaml", default=d(None),
                   help="YAML file of options (keys as the long options); flags given here win")
    p.add_argument("--algo", default=d("ssgd"), metavar="NAME",
                   help=f"algorithm, one of: {', '.join(registry.names())}")
    p.add_argument("--plugin", action="append", default=d([]), metavar="MODULE",
                   help="import this module (a name on PYTHONPATH or a .py file) before anything else: the "
                        "algorithms it registers (hvd_async.register_algorithm) become --algo names, and "
                        "their options flags (repeatable; every rank imports it)")
    p.add_argument("--np", type=int, default=d(4 if launcher else None),
                   help="MPI processes in all, servers included" +
                   ("" if launcher else " (checked against the MPI world when given)"))
    p.add_argument("--servers", type=int, default=d(None),
                   help="parameter-server ranks (default: 1 for parameter-server algorithms, else 0)")
    p.add_argument("--dataset", default=d("digits"), metavar="NAME",
                   help=f"one of: {', '.join(DATASETS)}; digits, synthetic and teacher need no files, "
                        f"fashion-mnist Debian's package dataset-fashion-mnist")
    p.add_argument("--data-dir", default=d(None), metavar="DIR",
                   help="folder with the standard files of mnist, cifar10 or imagenet (fashion-mnist: "
                        "instead of Debian's dataset-fashion-mnist)")
    p.add_argument("--eval-on", choices=EVAL_SPLITS, default=d("test"),
                   help="the split scored after each epoch: test (training on the whole training split; "
                        "for final tables), or val (training on it less a validation split carved from "
                        "it once, the same for every --seed; for choosing hyperparameters and defaults)")
    p.add_argument("--image-size", type=int, default=d(None),
                   help="resize images to this size (synthetic: 32, imagenet: 224 by default)")
    p.add_argument("--model", default=d("mlp"), metavar="NAME",
                   help=f"one of: {', '.join(MODELS)}{_per_dataset('model')}")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default=d("cpu"),
                   help="train on the CPU, or on one GPU per worker (local rank modulo the GPUs visible); "
                        "ssgd and hpsgd then reduce on the GPU (Horovod's NCCL operations where built); auto: "
                        "cuda where the process sees a GPU, else cpu (the launch recipes' choice)")
    p.add_argument("--epochs", type=int, default=d(10), help="passes over the training split")
    p.add_argument("--batch-size", type=int, default=d(32), help="samples per step on each worker")
    p.add_argument("--lr", type=float, default=d(0.1), help=f"learning rate{_per_dataset('lr')}")
    p.add_argument("--momentum", type=float, default=d(0.9), help="SGD momentum of the local optimizer")
    p.add_argument("--weight-decay", type=float, default=d(0.0), help="SGD weight decay")
    p.add_argument("--seed", type=int, default=d(0),
                   help="seed of the model's initialisation and the sampling order (and of synthetic's "
                        "and teacher's images); the train/validation/test splits are fixed")
    p.add_argument("--logdir", default=d(None), metavar="DIR", help="write TensorBoard event files here")
    p.add_argument("--metrics-out", default=d(None), metavar="PATH", help="write the run's metrics JSON here")
    p.add_argument("--straggler", action="append", default=d([]), metavar="WORKER=FACTOR",
                   help="make that worker's steps FACTOR times as long by sleeping (repeatable; "
                        "workers are numbered 0..workers-1, not by MPI rank)")
    p.add_argument("--compute-ms", type=float, default=d(0.0), metavar="MS",
                   help="simulated compute per step on every worker (sleep), to study protocol costs")
    p.add_argument("--checkpoint-dir", default=d(None), metavar="DIR",
                   help="write checkpoints here (ckpt-<updates>.pt and the folder of parts it names: each "
                        "worker's model, optimizer, algorithm state, batch position and RNG states, each server's "
                        "shard; every rank must reach DIR)")
    p.add_argument("--checkpoint-every", default=d("1"), metavar="N[epochs|steps]",
                   help="checkpoint every N epochs (N or Nepochs) or every N steps (Nsteps; for "
                        "parameter-server algorithms a step is one update of the global weights); the "
                        "last epoch is always saved")
    p.add_argument("--keep-checkpoints", type=int, default=d(2), metavar="K",
                   help="keep the K newest checkpoints in --checkpoint-dir")
    p.add_argument("--resume", action="store_true", default=d(False),
                   help="resume from the newest checkpoint in --checkpoint-dir (the same algorithm, "
                        "workers, servers, data, model, batch size and seed)")
    p.add_argument("--deterministic", action="store_true", default=d(False),
                   help="ssgd, hpsgd, od-sgd (allreduce): reduce tensor by tensor (Horovod fusion off) so "
                        "that sums run in the same order in every run and a resumed run repeats a straight "
                        "one bit for bit; slower on large models")
    p.add_argument("--worker-timeout", type=float, default=d(None), metavar="SECONDS",
                   help="a worker that makes no progress for this long is named: parameter-server "
                        "algorithms go on without it (the job then ends with exit status 4 after "
                        "writing its results); the others stop with exit status 5 (which "
                        "--max-restarts relaunches)")
    p.add_argument("--max-nonfinite", type=int, default=d(20), metavar="K",
                   help="stop (with a checkpoint of the last good state) after K gradients in a row held "
                        "NaN or infinity on a worker; none is ever applied (0: never stop)")
    p.add_argument("--progress", choices=PROGRESS_MODES, default=d("auto"),
                   help="progress inside an epoch on worker 0: auto (a bar on a terminal, elsewhere a line "
                        f"every {LINE_EVERY:g} s: samples, samples/s, loss), bar, or epochs (off: only the "
                        "per-epoch lines)")
    if launcher:
        p.add_argument("--max-restarts", type=int, default=d(0), metavar="K",
                       help="when the job fails (e.g. a process dies), relaunch it up to K times from "
                            "the newest checkpoint (needs --checkpoint-dir)")
        p.add_argument("--mpi-args", default=d(""), metavar="'ARGS'",
                       help="extra arguments for mpirun, e.g. '--hostfile hosts --map-by node'")
    taken = {opt for action in p._actions for opt in action.option_strings}
    try:
        options.add_flags(p, registry.strategies(), suppress_defaults=suppress_defaults, taken=taken)
    except ValueError as exc:  # a plugin's flag clashes with another
        raise ConfigError(str(exc)) from None
    return p


def _per_dataset(dest: str) -> str:
    """The help's note of the datasets whose own default of option ``dest`` replaces the one shown."""
    own = [f"{name}: {values[dest]}" for name, values in DATASET_DEFAULTS.items() if dest in values]
    return f" ({'; '.join(own)} by default)" if own else ""


def apply_dataset_defaults(args: argparse.Namespace, given) -> argparse.Namespace:
    """Set ``DATASET_DEFAULTS[args.dataset]``'s options that are not in ``given`` (the options a flag
    or the --config file gave)."""
    for dest, value in DATASET_DEFAULTS.get(args.dataset, {}).items():
        if dest not in given:
            setattr(args, dest, value)
    return args


def _load_yaml(path: str, parser) -> Dict:
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a mapping of option: value")
    known = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    out = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in known:
            close = difflib.get_close_matches(dest.replace("_", "-"), [k.replace("_", "-") for k in known], n=3,
                                              cutoff=0.75)  # (0.7 would offer merge-rate for learning_rate)
            hint = (f"did you mean {' or '.join(close)}?" if close else "no option is named like it;")
            raise ConfigError(f"--config {path}: unknown option {key!r}; {hint} the keys are the long options "
                              f"of '{parser.prog} --help' without their '--'")
        if dest in ("straggler", "plugin"):
            if isinstance(value, dict):
                value = [f"{k}={v}" for k, v in value.items()]
            value = [str(v) for v in (value if isinstance(value, list) else [value])]
        else:
            value = _yaml_value(path, key, value, known[dest])
        out[dest] = value
    return out


def _yaml_value(path: str, key, value, action: argparse.Action):
    """One value of a ``--config`` file, checked as the flag's own parsing checks it."""
    if value is None:
        if action.default is not None:
            raise ConfigError(f"--config {path}: {key} has no value; give one or leave the key out")
        return value
    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise ConfigError(f"--config {path}: {key}: invalid value {value!r}; accepted: true or false")
        return value
    if action.type is not None:
        try:
            if isinstance(value, (bool, list, dict)) or (action.type is int and isinstance(value, float)):
                raise TypeError(value)  # int() would take True or 2.5 as 1 or 2
            value = action.type(value)
        except (TypeError, ValueError):
            raise ConfigError(f"--config {path}: {key}: invalid value {value!r} "
                              f"(expected {action.type.__name__})") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"--config {path}: {key}: invalid choice {value!r}; choose from "
                          f"{', '.join(map(str, action.choices))}")
    return value


def load_plugins(argv: Sequence[str]) -> None:
    """Import the ``--plugin`` modules named in ``argv`` and in its ``--config`` file (key ``plugin``),
    before the parser is built: their algorithms' flags are then part of it."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(argv))
    specs = list(known.plugin)
    if known.config and os.path.isfile(known.config):
        try:
            with open(known.config) as f:
                data = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            data = None  # _load_yaml says what is wrong
        given = data.get("plugin") if isinstance(data, dict) else None
        for spec in (given if isinstance(given, list) else [given] if given else []):
            spec = str(spec)  # a file named in a preset: relative to the preset's folder
            beside = os.path.join(os.path.dirname(os.path.abspath(known.config)), spec)
            specs.append(beside if spec.endswith(".py") and not os.path.isabs(spec) and os.path.isfile(beside)
                         else spec)
    try:
        registry.load_plugins(specs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse(argv: Optional[Sequence[str]] = None, *, launcher: bool = True) -> argparse.Namespace:
    """Parse flags over the defaults and the ``--config`` file (flags win), without validating."""
    argv = list(sys.argv[1:] if argv is None else argv)
    load_plugins(argv)
    parser = build_parser(launcher=launcher)
    args = parser.parse_args(argv)
    given = vars(build_parser(launcher=launcher, suppress_defaults=True).parse_args(argv))
    from_file = {}
    if args.config:
        from_file = _load_yaml(args.config, parser)
        merged = vars(args)
        merged.update(from_file)
        merged.update(given)
        args = argparse.Namespace(**merged)
    return apply_dataset_defaults(args, {*given, *from_file})


def parse_stragglers(specs: List[str]) -> Dict[int, float]:
    out = {}
    for spec in specs:
        worker, sep, factor = str(spec).partition("=")
        try:
            worker_i, factor_f = int(worker), float(factor)
        except ValueError:
            raise ConfigError(f"--straggler {spec!r} must be WORKER=FACTOR, e.g. 2=3") from None
        if not sep or factor_f < 1.0:
            raise ConfigError(f"--straggler {spec!r}: FACTOR must be >= 1 (how many times longer "
                              f"that worker's step takes)")
        out[worker_i] = factor_f
    return out


def validate(args: argparse.Namespace, world_size: Optional[int] = None) -> argparse.Namespace:
    """Check every value; fill derived ones (``servers``, ``workers``, ``stragglers``)."""
    try:
        row = registry.get(args.algo)
    except ValueError as exc:
        raise ConfigError(f"--algo: {exc}") from None
    for name, choices in (("dataset", DATASETS), ("model", MODELS)):
        if getattr(args, name) not in choices:
            raise ConfigError(f"unknown {name} {getattr(args, name)!r}; choose one of: {', '.join(choices)}")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        raise ConfigError(f"--lr must be > 0, got {args.lr}")
    for name in ("momentum", "weight_decay", "compute_ms"):
        if not getattr(args, name) >= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not args.momentum < 1:
        raise ConfigError(f"--momentum must be < 1, got {args.momentum}")
    for name in ("lr", "weight_decay", "compute_ms"):
        if not math.isfinite(getattr(args, name)):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be in 0..{MAX_SEED} (2**32 - 1), got {args.seed}")
    if args.image_size is not None and args.image_size < 1:
        raise ConfigError(f"--image-size must be >= 1, got {args.image_size}")
    if args.np is not None and args.np < 1:
        raise ConfigError(f"--np must be >= 1, got {args.np}")
    if world_size is not None and args.np is not None and args.np != world_size:
        raise ConfigError(f"--np {args.np} does not match the {world_size} MPI processes this job was "
                          f"launched with; drop --np or launch with mpirun -np {args.np}")
    total = world_size if world_size is not None else args.np
    uses_servers = registry.uses_servers(args.algo, algorithm_options(args))
    if args.servers is None:
        args.servers = 1 if uses_servers else 0
    if args.servers < 0:
        raise ConfigError(f"--servers must be >= 0, got {args.servers}")
    if total is not None and args.servers >= total:
        raise ConfigError(f"--servers {args.servers} leaves no worker: --np {total} counts every MPI "
                          f"process, servers included; use --servers < {total} or a larger --np")
    if not uses_servers and args.servers:
        raise ConfigError(f"--servers {args.servers}: algorithm {args.algo!r}"
                          f"{' with ' + given_flags(args) if row.uses_servers else ''} uses no "
                          f"parameter server; use --servers 0")
    if uses_servers and args.servers < 1:
        raise ConfigError(f"--servers 0: algorithm {args.algo!r} needs at least one server rank")
    args.workers = None if total is None else total - args.servers
    _validate_algorithm_options(args)
    _validate_checkpoints(args)
    args.stragglers = parse_stragglers(args.straggler)
    for worker in args.stragglers:
        if args.workers is not None and not 0 <= worker < args.workers:
            raise ConfigError(f"--straggler {worker}=...: there is no worker {worker}; the job has "
                              f"{args.workers} worker(s), numbered 0..{args.workers - 1} "
                              f"(servers are not counted)")
    if args.dataset in FILE_DATASETS:
        if not args.data_dir:
            raise ConfigError(f"--dataset {args.dataset} needs --data-dir (a folder with its standard "
                              f"files); digits, synthetic and teacher need none")
        if not os.path.isdir(args.data_dir):
            raise ConfigError(f"--data-dir {args.data_dir} does not exist or is not a folder")
    _validate_outputs(args)
    return args


def _validate_outputs(args: argparse.Namespace) -> None:
    """What the job writes must be writable where it says, checked before any process starts."""
    if args.logdir and os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        raise ConfigError(f"--logdir {args.logdir} exists and is not a folder; give a folder for the "
                          f"TensorBoard files")
    if args.metrics_out and os.path.isdir(args.metrics_out):
        raise ConfigError(f"--metrics-out {args.metrics_out} is a folder; give a file path, e.g. "
                          f"{os.path.join(args.metrics_out, 'metrics.json')}")
    mpi_args = getattr(args, "mpi_args", "")
    if mpi_args:
        try:
            shlex.split(mpi_args)
        except ValueError as exc:
            raise ConfigError(f"--mpi-args {mpi_args!r} cannot be split into arguments ({exc}); "
                              f"quote as in a shell, e.g. '--hostfile hosts --map-by node'") from None


def _validate_checkpoints(args: argparse.Namespace) -> None:
    from .jobstate import parse_every

    try:
        parse_every(args.checkpoint_every)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.keep_checkpoints < 1:
        raise ConfigError(f"--keep-checkpoints must be >= 1, got {args.keep_checkpoints}")
    if args.worker_timeout is not None and not 0 < args.worker_timeout < float("inf"):
        raise ConfigError(f"--worker-timeout must be a number of seconds > 0, got {args.worker_timeout}")
    if args.max_nonfinite < 0:
        raise ConfigError(f"--max-nonfinite must be >= 0 (0: never stop), got {args.max_nonfinite}")
    restarts = getattr(args, "max_restarts", 0)
    if restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {restarts}")
    for flag, wanted in (("--resume", args.resume), (f"--max-restarts {restarts}", restarts > 0)):
        if wanted and not args.checkpoint_dir:
            raise ConfigError(f"{flag} needs --checkpoint-dir (the folder the checkpoints are in)")
    if args.checkpoint_dir and os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
        raise ConfigError(f"--checkpoint-dir {args.checkpoint_dir} exists and is not a folder")


def given_flags(args: argparse.Namespace) -> str:
    """The algorithm's flags whose values differ from its defaults, as typed (for error messages)."""
    options_cls = registry.strategy_class(args.algo).Options
    given = options.from_args(options_cls, args)
    return " ".join(f"{how.flag} {getattr(args, how.dest)}" for field, how in options.declared(options_cls)
                    if how.flag and field.name in given and given[field.name] != field.default
                    and how.action not in ("store_true", "store_false"))


def algorithm_options(args: argparse.Namespace) -> Dict:
    """The keyword options of DistributedOptimizer that the job's flags set (those left unset are left
    out: the algorithm's own defaults apply)."""
    return options.from_args(registry.strategy_class(args.algo).Options, args)


def _validate_algorithm_options(args: argparse.Namespace) -> None:
    """The checks of the algorithm's options that need the job's other values (its strategy's
    ``check_for_job``), then the options as its options dataclass checks them (the one place their
    ranges are written); the error under the flag's name."""
    _refuse_meaningless_flags(args)
    cls, given = registry.strategy_class(args.algo), algorithm_options(args)
    try:
        cls.check_for_job(given, workers=args.workers, lr=args.lr)  # first: its messages name the job's values
        cls.Options(**given)
    except (ValueError, TypeError) as exc:
        message = options.flag_message(cls.Options, str(exc).splitlines()[0] if str(exc) else repr(exc))
        raise ConfigError(message if message.startswith("--") else f"--algo {args.algo}: {message}") from None


def _refuse_meaningless_flags(args: argparse.Namespace) -> None:
    """Refuse, as the Python API does, a flag set (to other than its default) that the algorithm gives no
    meaning: another algorithm's option, which the job would drop without a word, or --deterministic
    where the exchange's order is not the allreduce's."""
    own = {how.flag for _, how in options.declared(registry.strategy_class(args.algo).Options)}
    users: Dict[str, List[str]] = {}
    for name, cls in registry.strategies().items():
        for _, how in options.declared(cls.Options):
            if how.flag and how.flag not in own:
                users.setdefault(how.flag, []).append(name)
    defaults = build_parser(launcher=False)
    for flag, names in users.items():
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest, None)
        if value is None or value == defaults.get_default(dest):
            continue
        shown = flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}"
        raise ConfigError(f"{shown} has no meaning under {args.algo}; it works with: {', '.join(names)} "
                          f"(leave it out here)")
    servers = registry.uses_servers(args.algo, algorithm_options(args))
    if args.deterministic and (servers or registry.strategy_class(args.algo).peer_windows):
        repeatable = [name for name, cls in registry.strategies().items()
                      if not (registry.uses_servers(name, {}) or cls.peer_windows)]
        raise ConfigError(f"--deterministic has no meaning under {args.algo}: the order in which the workers' "
                          f"{'pushes reach the servers' if servers else 'models reach their peers'} changes "
                          f"from run to run, and no flag fixes it; it fixes the allreduce's order under: "
                          f"{', '.join(repeatable)}, od-sgd --od-exchange allreduce ('hvd-async simulate' "
                          f"repeats a run of any algorithm)")

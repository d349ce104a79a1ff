"""The training job's options: one parser for the launcher and the job, YAML presets, and validation
into the job's description (:class:`~hvd_async.job.jobspec.JobSpec`), which is all the job's modules see.

The parser's flags come from declarations: the job's own options (:class:`~hvd_async.job.jobspec.JobOptions`),
the launcher's (:class:`LaunchOptions`) and every algorithm's options dataclass; each dataclass checks
its own ranges, and :func:`validate` adds the checks that span them (the layout of servers and workers,
an algorithm's options against the job's values).

Every bad value raises :class:`ConfigError` with one line naming the value and what is accepted; the
command-line front ends print that line and exit with status 2.
"""
import argparse
import dataclasses
import difflib
import os
import shlex
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, cast

import yaml

from .. import options, registry
from .jobspec import DATASET_DEFAULTS, JobAlgorithm, JobOptions, JobSpec, Layout
from ..options import option


@dataclasses.dataclass
class LaunchOptions:
    """The options of ``hvd-async train`` that the launcher reads and the job never sees."""

    max_restarts: int = option(0, "when the job fails (e.g. a process dies), relaunch it up to K times from "
                               "the newest checkpoint (needs --checkpoint-dir)", flag="--max-restarts",
                               metavar="K")
    mpi_args: str = option("", "extra arguments for mpirun, e.g. '--hostfile hosts --map-by node'",
                           flag="--mpi-args", metavar="'ARGS'")

    def __post_init__(self):
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        try:
            shlex.split(self.mpi_args)
        except ValueError as exc:
            raise ValueError(f"mpi_args {self.mpi_args!r} cannot be split into arguments ({exc}); quote as "
                             f"in a shell, e.g. '--hostfile hosts --map-by node'") from None


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


class _HelpWithExamples(argparse.RawDescriptionHelpFormatter, _Help):
    """_Help, with the description (which holds the examples) printed as written."""


# what ``hvd-async train --help`` says first, before its long list of options; every example is
# checked to parse and validate (tests/unit/test_config.py)
TRAIN_DESCRIPTION = """\
Train a model with a distributed SGD algorithm from the hvd_async registry (the reference training
job) on --np MPI processes, started by mpirun on this machine (--mpi-args for other hosts).

examples:
  hvd-async train --algo asgd --np 5 --straggler 2=3 --compute-ms 20  # 4 workers + 1 server; 2 slow
  hvd-async train --config dc-asgd --epochs 3 --logdir runs/tb        # a preset, flags win over it
  hvd-async train --algo dbs-asgd --np 5 --metrics-out m.json         # the result as JSON too
  hvd-async train --algo dc-asgd --np 9 --servers 2 --mpi-args '--hostfile hosts --map-by node'
  mpirun -np 4 python -m hvd_async.job.train --algo gossip                # under your own launcher

Every option below is also a key of a --config YAML file; docs/cli.md has this help."""


def build_parser(prog: str = "hvd-async train", *, launcher: bool = True, suppress_defaults: bool = False,
                 retuned: Optional[Dict[str, Dict[str, Any]]] = None) -> argparse.ArgumentParser:
    """The job's parser; ``launcher`` adds the options only ``hvd-async train`` reads (and the help's
    short usage line and examples); ``retuned`` gives another command's help and default for some of
    the job's options, by name (``{"np": {"help": ...}}``: the simulator's)."""
    retuned = retuned or {}
    d = (lambda value: argparse.SUPPRESS) if suppress_defaults else (lambda value: value)
    p = _Parser(prog=prog, description="Train a model with a distributed SGD algorithm from the "
                "hvd_async registry (the reference training job).",
                formatter_class=_Help,
                argument_default=argparse.SUPPRESS if suppress_defaults else None)
    if launcher:  # the usage argparse makes lists every option: 40 lines before any help
        p.usage = "%(prog)s [--config PRESET|FILE.yaml] [--algo NAME] [--np N] [OPTION ...]"
        p.description = TRAIN_DESCRIPTION
        p.formatter_class = _HelpWithExamples
    p.add_argument("--config", metavar="PRESET|FILE.yaml", default=d(None),
                   help=f"a packaged preset by name ({', '.join(preset_names())}) or a YAML file of options "
                        f"(keys as the long options); flags given here win")
    p.add_argument("--algo", default=d("ssgd"), metavar="NAME",
                   help=f"algorithm, one of: {', '.join(registry.names())}")
    p.add_argument("--plugin", action="append", default=d([]), metavar="MODULE",
                   help="import this module (a name on PYTHONPATH or a .py file) before anything else: the "
                        "algorithms it registers (hvd_async.register_algorithm) become --algo names, and "
                        "their options flags (repeatable; every rank imports it)")
    p.add_argument("--np", type=int, default=d(4 if launcher else None),
                   help=retuned.get("np", {}).get("help", "MPI processes in all, servers included" +
                                                   ("" if launcher else " (checked against the MPI world "
                                                                        "when given)")))
    p.add_argument("--servers", type=int, default=d(None),
                   help="parameter-server ranks (default: 1 for parameter-server algorithms, else 0)")
    added = options.add_options(p, JobOptions, suppress_defaults=suppress_defaults,
                                names={"repeatable": registry.repeatable()}, retuned=retuned)
    unknown = sorted(set(retuned) - set(added) - {"np"})
    if unknown:
        raise ValueError(f"retuned names {', '.join(unknown)}, not options of the job; give the names of "
                         f"JobOptions' fields or 'np'")
    if launcher:
        options.add_options(p.add_argument_group("launcher", "options only 'hvd-async train' reads"),
                            LaunchOptions, suppress_defaults=suppress_defaults)
    taken = {opt for action in p._actions for opt in action.option_strings}
    try:
        options.add_flags(p, registry.algorithms(), suppress_defaults=suppress_defaults, taken=taken)
    except ValueError as exc:  # a plugin's flag clashes with another
        raise ConfigError(str(exc)) from None
    return p


def apply_dataset_defaults(args: argparse.Namespace, given) -> argparse.Namespace:
    """Set ``DATASET_DEFAULTS[args.dataset]``'s options that are not in ``given`` (the options a flag
    or the --config file gave)."""
    for dest, value in DATASET_DEFAULTS.get(args.dataset, {}).items():
        if dest not in given:
            setattr(args, dest, value)
    return args


PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets")  # package data (setup.cfg)


def preset_names() -> List[str]:
    """The packaged presets' names (``hvd_async/presets/NAME.yaml``; ``launch/presets`` in the checkout)."""
    return sorted(name[:-len(".yaml")] for name in os.listdir(PRESETS) if name.endswith(".yaml"))


def config_file(value: str) -> str:
    """The file ``--config VALUE`` reads: the file if there is one, else the packaged preset named
    ``VALUE`` (so ``--config dc-asgd`` works from any folder and from an installed package)."""
    if os.path.isfile(value):
        return value
    if os.sep in value or value.endswith((".yaml", ".yml")):
        raise ConfigError(f"--config {value}: no such file")
    if value not in preset_names():
        raise ConfigError(f"--config {value}: no such file or preset; the presets are: {', '.join(preset_names())}")
    return os.path.join(PRESETS, value + ".yaml")


def _load_yaml(path: str, parser) -> Dict:
    path = config_file(path)
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
        convert = cast(Callable[[str], Any], action.type)  # (this parser's types are callables, never names)
        try:
            if isinstance(value, (bool, list, dict)) or (action.type is int and isinstance(value, float)):
                raise TypeError(value)  # int() would take True or 2.5 as 1 or 2
            value = convert(value)
        except (TypeError, ValueError):
            raise ConfigError(f"--config {path}: {key}: invalid value {value!r} "
                              f"(expected {convert.__name__})") from None
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
    preset = config_file(known.config) if known.config else None
    if preset:
        try:
            with open(preset) as f:
                data = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            data = None  # _load_yaml says what is wrong
        given = data.get("plugin") if isinstance(data, dict) else None
        for spec in (given if isinstance(given, list) else [given] if given else []):
            spec = str(spec)  # a file named in a preset: relative to the preset's folder
            beside = os.path.join(os.path.dirname(os.path.abspath(preset)), spec)
            specs.append(beside if spec.endswith(".py") and not os.path.isabs(spec) and os.path.isfile(beside)
                         else spec)
    try:
        registry.load_plugins(specs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse(argv: Optional[Sequence[str]] = None, *, launcher: bool = True, parser_for=None) -> argparse.Namespace:
    """Parse flags over the defaults and the ``--config`` file (flags win), without validating.
    ``parser_for(suppress_defaults)``: another front end's parser (the simulator's); by default the job's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    load_plugins(argv)
    if parser_for is None:
        def parser_for(suppress_defaults: bool):
            return build_parser(launcher=launcher, suppress_defaults=suppress_defaults)
    parser = parser_for(False)
    args = parser.parse_args(argv)
    given = vars(parser_for(True).parse_args(argv))
    from_file = {}
    if args.config:
        from_file = _load_yaml(args.config, parser)
        merged = vars(args)
        merged.update(from_file)
        merged.update(given)
        args = argparse.Namespace(**merged)
    return apply_dataset_defaults(args, {*given, *from_file})


def options_from(options_cls, args: argparse.Namespace):
    """``options_cls`` (the job's or the launcher's options) from the parsed flags, checked by its own
    ``__post_init__``; its error under the flag's name."""
    values = {field.name: getattr(args, field.name) for field, _ in options.declared(options_cls)}
    try:
        return options_cls(**values)
    except ValueError as exc:
        raise ConfigError(options.flag_message(options_cls, str(exc))) from None


def validate(args: argparse.Namespace, world_size: Optional[int] = None, *, workers: Optional[int] = None) -> JobSpec:
    """Check every value of the parsed flags and build the job they describe (the launcher's own
    options are :func:`launch_options`'s). ``world_size``: the MPI processes the job runs in (servers
    included); ``workers`` instead: the workers it runs with, the servers the flags or the algorithm's
    default add (the simulator's form)."""
    try:
        named = JobAlgorithm.named(args.algo)
    except ValueError as exc:
        raise ConfigError(f"--algo: {exc}") from None
    algorithm, row = dataclasses.replace(named, given=options.from_args(named.declaration.Options, args)), named.row
    job = options_from(JobOptions, args)
    if args.np is not None and args.np < 1:
        raise ConfigError(f"--np must be >= 1, got {args.np}")
    _check_np(args, world_size)
    total = world_size if world_size is not None else args.np
    uses_servers = algorithm.uses_servers
    servers = (1 if uses_servers else 0) if args.servers is None else args.servers
    if servers < 0:
        raise ConfigError(f"--servers must be >= 0, got {servers}")
    if workers is not None:
        total = workers + servers
        _check_np(args, total)
    if total is not None and servers >= total:
        if args.servers is None:  # the algorithm's default server: the fix is more processes
            raise ConfigError(f"--np {total} leaves no worker: algorithm {args.algo!r} needs {servers} "
                              f"parameter-server rank(s) beside its workers, and --np counts both; use "
                              f"--np {servers + 1} or more")
        fix = (f"--servers < {total} or a larger --np" if total > 1 or not uses_servers
               else f"--np {servers + 1} or more")  # (not --servers 0: the algorithm needs a server)
        raise ConfigError(f"--servers {servers} leaves no worker: --np {total} counts every MPI "
                          f"process, servers included; use {fix}")
    if not uses_servers and servers:
        raise ConfigError(f"--servers {servers}: algorithm {args.algo!r}"
                          f"{' with ' + given_flags(args) if row.uses_servers else ''} uses no "
                          f"parameter server; use --servers 0")
    if uses_servers and servers < 1:
        raise ConfigError(f"--servers 0: algorithm {args.algo!r} needs at least one server rank")
    spec = JobSpec(algorithm=algorithm, job=job,
                   layout=Layout(servers=servers, workers=None if total is None else total - servers))
    _validate_algorithm_options(args, spec)
    workers = spec.layout.workers
    for worker in job.stragglers:
        if workers is not None and not 0 <= worker < workers:
            raise ConfigError(f"--straggler {worker}=...: there is no worker {worker}; the job has "
                              f"{workers} worker(s), numbered 0..{workers - 1} (servers are not counted)")
    return spec


def _check_np(args: argparse.Namespace, world_size: Optional[int]) -> None:
    if world_size is not None and args.np is not None and args.np != world_size:
        raise ConfigError(f"--np {args.np} does not match the {world_size} MPI processes this job was "
                          f"launched with; drop --np or launch with mpirun -np {args.np}")


def launch_options(args: argparse.Namespace, spec: JobSpec) -> LaunchOptions:
    """The launcher's own options (``hvd-async train``'s parser only), checked, also against the job
    ``spec`` that :func:`validate` built from the same flags."""
    launch = options_from(LaunchOptions, args)
    if launch.max_restarts and not spec.job.checkpoint_dir:
        raise ConfigError(f"--max-restarts {launch.max_restarts} needs --checkpoint-dir (the folder the "
                          f"checkpoints are in)")
    return launch


def given_flags(args: argparse.Namespace) -> str:
    """The algorithm's flags whose values differ from its defaults, as typed (for error messages)."""
    options_cls = registry.algorithm(args.algo).Options
    given = options.from_args(options_cls, args)
    return " ".join(f"{how.flag} {getattr(args, cast(str, how.dest))}" for field, how in options.declared(options_cls)
                    if how.flag and field.name in given and given[field.name] != field.default
                    and how.action not in ("store_true", "store_false"))


def algorithm_options(args: argparse.Namespace) -> Dict:
    """The keyword options of DistributedOptimizer that the job's flags set (those left unset are left
    out: the algorithm's own defaults apply)."""
    return options.from_args(registry.algorithm(args.algo).Options, args)


def _validate_algorithm_options(args: argparse.Namespace, spec: JobSpec) -> None:
    """The checks of the algorithm's options that need the job's other values (its declaration's
    ``check_for_job``), then the options as its options dataclass checks them (the one place their
    ranges are written); the error under the flag's name."""
    cls, given = spec.algorithm.declaration, spec.algorithm.given
    _refuse_meaningless_flags(args, spec, cls)
    try:
        # first: its messages name the job's values
        cls.check_for_job(given, workers=spec.layout.workers, lr=spec.job.lr)
        cls.Options(**given)
    except (ValueError, TypeError) as exc:
        message = options.flag_message(cls.Options, str(exc).splitlines()[0] if str(exc) else repr(exc))
        raise ConfigError(message if message.startswith("--") else f"--algo {args.algo}: {message}") from None


def _refuse_meaningless_flags(args: argparse.Namespace, spec: JobSpec, cls) -> None:
    """Refuse, as the Python API does, a flag set (to other than its default) that the algorithm gives no
    meaning: another algorithm's option, which the job would drop without a word, or --deterministic
    where the exchange's order is not the allreduce's."""
    own = {how.flag for _, how in options.declared(cls.Options)}
    users: Dict[str, List[str]] = {}
    for name, other in registry.algorithms().items():
        for _, how in options.declared(other.Options):
            if how.flag and how.flag not in own:
                users.setdefault(how.flag, []).append(name)
    defaults = build_parser(launcher=False)
    for flag, names in users.items():
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest, None)
        if value is None or value == defaults.get_default(dest):
            continue
        shown = flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}"
        raise ConfigError(f"{shown} has no meaning under {spec.algo}; it works with: {', '.join(sorted(names))} "
                          f"(leave it out here)")
    servers = spec.algorithm.uses_servers
    if spec.job.deterministic and (servers or spec.algorithm.row.peer_windows):
        raise ConfigError(f"--deterministic has no meaning under {spec.algo}: the order in which the workers' "
                          f"{'pushes reach the servers' if servers else 'models reach their peers'} changes "
                          f"from run to run, and no flag fixes it; it fixes the allreduce's order under: "
                          f"{', '.join(registry.repeatable())}, od-sgd --od-exchange allreduce "
                          f"('hvd-async simulate' repeats a run of any algorithm)")

"""An algorithm's options, declared once: each field of its options dataclass carries its command-line
form, and the flags (so the YAML keys of ``--config``), the job's validation and the CLI reference are
made from those declarations.

    @dataclass
    class MyOptions:
        period: int = option(4, "local steps between averagings", flag="--my-period")
        seed: int = option(0, "seed of the peer choice", from_job="seed")   # the job's --seed
        hook: object = None                                                  # Python only

A flag that several algorithms declare is one option of the parser, whose help names them all. A
field without ``flag`` (or ``from_job``) is set from Python only. Ranges are checked once, by the
dataclass's own ``__post_init__``; the command line reports its error under the flag's name.
"""
import argparse
import dataclasses
import re
import typing
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

_KEY = "hvd_async"
_BOOL_ACTIONS = ("store_true", "store_false", "boolean")
_ACTIONS = _BOOL_ACTIONS + ("append",)


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one option field appears on the command line.

    Attributes:
        flag: the long option, e.g. ``"--pull-every"`` (None: no flag of its own).
        help: one line on what it does (the algorithms that declare it are prefixed).
        choices: the accepted values, where they are a fixed list.
        action: for bool fields: ``"store_true"`` (the flag sets True), ``"store_false"`` (the flag
            sets False, e.g. ``--no-overlap``) or ``"boolean"`` (``--x`` / ``--no-x``, unset keeps
            the algorithm's default); for list fields ``"append"`` (a repeatable flag).
        from_job: the field is the job's option of this name (e.g. ``"seed"``), with no flag.
        convert: the parsed value -> the option's value (e.g. a switch -> ``'fp16'``).
        type: the parsed type where the field's annotation does not say it.
        metavar: the value's name in the help.
    """

    flag: Optional[str]
    help: str
    choices: Optional[Tuple] = None
    action: Optional[str] = None
    from_job: Optional[str] = None
    convert: Optional[Callable[[Any], Any]] = None
    type: Optional[type] = None
    metavar: Optional[str] = None

    @property
    def dest(self) -> Optional[str]:
        return None if self.flag is None else self.flag.lstrip("-").replace("-", "_")


def option(default: Any, help: str, *, flag: Optional[str] = None, **how) -> Any:
    """A field of an algorithm's options dataclass with its command-line form (see :class:`Flag`)."""
    if how.get("action") not in (None,) + _ACTIONS:
        raise ValueError(f"action must be one of {', '.join(_ACTIONS)}, got {how['action']!r}")
    if flag is not None and not flag.startswith("--"):
        raise ValueError(f"flag must be a long option such as '--my-period', got {flag!r}")
    metadata = {_KEY: Flag(flag, help, **how)}
    if isinstance(default, list):  # a fresh list for each instance
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared(options_cls) -> List[Tuple[dataclasses.Field, Flag]]:
    """The fields of ``options_cls`` that the command line sets, with their declarations."""
    if options_cls is None or not dataclasses.is_dataclass(options_cls):
        return []
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(options_cls) if _KEY in f.metadata]


def _parsed_type(options_cls, field: dataclasses.Field, how: Flag):
    if how.type is not None:
        return how.type
    hint = typing.get_type_hints(options_cls).get(field.name, str)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        hint = args[0]
    return hint if hint in (int, float, str) else str


def add_flags(parser: argparse.ArgumentParser, algorithms: Dict[str, Any], *, suppress_defaults: bool,
              taken: Optional[set] = None) -> None:
    """Add every declared flag of ``algorithms`` (name -> declaration, with its ``Options``) to ``parser``, one
    option per flag. Its help names the algorithms that declare it, before each of their help texts
    where these differ (``asgd, dbs-asgd: ... / dc-asgd, lc-asgd, softsync: ...``), so no help text
    lists algorithms by hand; where their defaults differ the flag's default is None and the help
    lists each algorithm's."""
    by_flag: Dict[str, List[Tuple[str, type, dataclasses.Field, Flag]]] = {}
    for name, cls in algorithms.items():
        options_cls = cls.Options
        for field, how in declared(options_cls):
            if how.flag is not None:
                by_flag.setdefault(how.flag, []).append((name, options_cls, field, how))
    taken = set(taken or ())
    group = parser.add_argument_group("algorithm options", "each applies to the algorithms it names")
    for flag, users in by_flag.items():
        if flag in taken:
            raise ValueError(f"algorithm {users[0][0]!r} declares {flag}, an option of the job itself; "
                             f"rename it (e.g. --{users[0][0]}-{flag[2:]})")
        _, options_cls, field, how = users[0]
        for other_name, other_cls, other_field, other in users[1:]:
            if (other.action, _parsed_type(other_cls, other_field, other)) != (
                    how.action, _parsed_type(options_cls, field, how)):
                raise ValueError(f"{flag} is declared by {users[0][0]} and {other_name} with different "
                                 f"kinds of value; give one of them another flag")
        helps: Dict[str, List[str]] = {}  # each help text -> the algorithms that declare the flag with it
        for user in users:
            names = helps.setdefault(user[3].help, [])
            if user[0] not in names:
                names.append(user[0])
        text = " / ".join(f"{', '.join(names)}: {help}" for help, names in helps.items())
        d = (lambda value: argparse.SUPPRESS) if suppress_defaults else (lambda value: value)
        if how.action in ("store_true", "store_false"):  # the flag's presence (from_args gives its value)
            _add_argument(group, dataclasses.replace(how, action="store_true"), None, default=d(False), help=text)
            continue
        defaults = {u[0]: u[2].default for u in users}
        default = next(iter(defaults.values())) if len(set(map(repr, defaults.values()))) == 1 else None
        if default is None and len(defaults) > 1 and len(set(map(repr, defaults.values()))) > 1:
            text += " (default: " + ", ".join(f"{n} {v}" for n, v in defaults.items()) + ")"
        _add_argument(group, how, _parsed_type(options_cls, field, how), default=d(default), help=text)


def add_options(group, options_cls, *, suppress_defaults: bool,
                names: Optional[Dict[str, Sequence[str]]] = None,
                retuned: Optional[Dict[str, Dict[str, Any]]] = None) -> List[str]:
    """Add the flags of one options dataclass (e.g. the job's own) to ``group``, in declaration order,
    each parsed into its field's name. ``names`` fills the help texts' ``{KEY}`` with a list of
    algorithms the registry gives (``{"replayable": registry.replayable()}``), so that no help lists
    them by hand; a help naming a key ``names`` lacks is refused. ``retuned`` gives another command's
    ``help`` and ``default`` for some fields (the simulator's, by field name). Returns the fields added."""
    added = []
    for field, how in declared(options_cls):
        change = (retuned or {}).get(field.name, {})
        factory = typing.cast(Callable[[], Any], field.default_factory)  # option() gives a default or a factory
        default = factory() if field.default is dataclasses.MISSING else field.default
        default = change.get("default", default)
        _add_argument(group, how, _parsed_type(options_cls, field, how),
                      default=argparse.SUPPRESS if suppress_defaults else default,
                      help=_filled(change.get("help", how.help), names or {}), dest=field.name)
        added.append(field.name)
    return added


def _filled(help: str, names: Dict[str, Sequence[str]]) -> str:
    """``help`` with each ``{KEY}`` of ``names`` replaced by its algorithms, comma-separated."""
    for key, listed in names.items():
        help = help.replace("{" + key + "}", ", ".join(listed))
    left = re.findall(r"\{([a-z_]+)\}", help)
    if left:
        raise ValueError(f"help text {help[:40]!r}... names {{{left[0]}}}, which no list fills; "
                         f"pass names={{{left[0]!r}: ...}} to add_options")
    return help


def _add_argument(group, how: Flag, kind, *, default, help: str, **more) -> None:
    """``how.flag`` on the parser: a switch (``store_true``/``store_false``), a repeatable flag
    (``append``), ``--x``/``--no-x`` (``boolean``), or one value of type ``kind``."""
    if how.action in ("store_true", "store_false"):
        group.add_argument(how.flag, action=how.action, default=default, help=help, **more)
    elif how.action == "append":
        group.add_argument(how.flag, action="append", default=default, metavar=how.metavar, help=help, **more)
    elif how.action == "boolean":
        group.add_argument(how.flag, action=argparse.BooleanOptionalAction, default=default, help=help, **more)
    else:
        group.add_argument(how.flag, type=kind, choices=how.choices, default=default, metavar=how.metavar,
                           help=help, **more)


def from_args(options_cls, args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword options of an algorithm that the parsed job options set (unset flags are left out,
    so the algorithm's own defaults apply)."""
    out = {}
    for field, how in declared(options_cls):
        if how.from_job is not None:
            value = getattr(args, how.from_job, None)
        elif how.dest is not None:  # (as how.flag is not None)
            value = getattr(args, how.dest, None)
            if how.action in ("store_true", "store_false"):
                value = (how.action == "store_true") if value else None
        else:
            continue
        if value is not None:
            out[field.name] = how.convert(value) if how.convert is not None else value
    return out


def flag_message(options_cls, message: str) -> str:
    """An options dataclass's error as the command line says it: a message that starts with a field's
    name starts with its flag instead; one that starts with "give " names the fields by their flags
    up to its first parenthesis, and a parenthesis of ``field=value`` pairs becomes ``(got --flag
    value ...)``: ``give alpha or rho, not both (alpha=0.1, rho=1.0)`` -> ``give --alpha or --rho,
    not both (got --alpha 0.1 --rho 1.0)``."""
    flags = {}
    for field, how in declared(options_cls):
        name = how.flag or (f"--{how.from_job.replace('_', '-')}" if how.from_job else None)
        if name:
            flags[field.name] = name
        if name and (message.startswith(field.name + " ") or message.startswith(field.name + ":")):
            return name + message[len(field.name):]
    if message.startswith("give "):
        head, paren, rest = message.partition("(")
        head = "".join(flags.get(word, word) for word in re.split(r"(\W+)", head))
        inside, close, tail = rest.partition(")")
        pairs = [item.strip().split("=", 1) for item in inside.split(",")]
        if close and all(len(pair) == 2 and pair[0] in flags for pair in pairs):
            inside = "got " + " ".join(f"{flags[name]} {value}" for name, value in pairs)
        return head + paren + inside + close + tail
    return message


def markdown_table(options_cls) -> str:
    """The options of one algorithm as a Markdown table (option, default, flag, meaning), for the guide."""
    rows = ["| option | default | flag | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(options_cls):
        how = field.metadata.get(_KEY)
        default = "(required)" if field.default is dataclasses.MISSING else f"`{field.default!r}`"
        if how is None:
            rows.append(f"| `{field.name}` | {default} | | |")
            continue
        if how.from_job:
            flag = f"`--{how.from_job.replace('_', '-')}` (the job's)"
        elif how.flag and how.action == "store_false":
            flag = f"`{how.flag}` (sets False)"
        elif how.flag and how.action == "boolean":
            flag = f"`{how.flag}`, `--no-{how.flag[2:]}`"
        else:
            flag = f"`{how.flag}`" if how.flag else ""
        choices = f" ({', '.join(map(repr, how.choices))})" if how.choices else ""
        rows.append(f"| `{field.name}` | {default} | {flag} | {how.help}{choices} |")
    return "\n".join(rows)

"""The package's contracts, read from its source with ``ast`` (issue 44): an algorithm is never decided
by its name outside the registry, nor its capabilities by ``getattr`` on a strategy; algorithm modules
share only public names; and no two modules import each other, directly or around a loop (imports
inside functions count: a lazy import is still a dependency).

Each rule's checker is also run on a planted violation, so that a checker that finds nothing because
it looks at nothing fails here."""
import ast
import importlib
import glob
import os

import pytest

from hvd_async import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "hvd_async")
# Module -> the lists of algorithm names it still holds, with who is to derive them; may only shrink.
NAME_LISTS_LEFT: dict = {}


def _sources():
    """``(dotted module name, is a package's __init__, source)`` of every module of the package."""
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
        init = rel[-1] == "__init__"
        with open(path) as f:
            yield ".".join(rel[:-1] if init else rel), init, f.read()


MODULES = {name: (init, text) for name, init, text in _sources()}
NAMES = set(registry.NAMES)


# --- algorithm names ------------------------------------------------------------------------------

def _names_in(node) -> set:
    """The algorithm names a constant or a literal collection of constants holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def name_comparisons(source: str) -> list:
    """``line: names`` of every comparison with an algorithm's name (``x == "softsync"``, ``x in
    ("asgd", "dc-asgd")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = set().union(*(_names_in(operand) for operand in [node.left, *node.comparators]))
            if names:
                found.append(f"{node.lineno}: {sorted(names)}")
    return found


def name_lists(source: str) -> list:
    """``line: names`` of every literal collection naming two algorithms or more."""
    return [f"{node.lineno}: {sorted(_names_in(node))}" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(_names_in(node)) >= 2]


def test_no_algorithm_name_comparison_outside_the_registry():
    found = {name: hits for name, (_, text) in MODULES.items() if name != "hvd_async.registry"
             for hits in [name_comparisons(text)] if hits}
    assert not found, (f"an algorithm decided by its name: {found}; give Strategy a hook with a default "
                       f"(hvd_async/algorithms/base.py) and override it in the algorithm")


def test_no_list_of_algorithm_names_outside_the_registry():
    found = {name: hits for name, (_, text) in MODULES.items() if name != "hvd_async.registry"
             for hits in [name_lists(text)] if hits}
    assert set(found) <= set(NAME_LISTS_LEFT), (f"lists of algorithm names: "
                                                f"{ {k: v for k, v in found.items() if k not in NAME_LISTS_LEFT} }; "
                                                f"derive them from hvd_async.registry")
    assert set(NAME_LISTS_LEFT) <= set(found), f"derived now: drop {sorted(set(NAME_LISTS_LEFT) - set(found))}"


def test_replay_takes_the_algorithms_whose_strategies_say_so():
    replayable = set(registry.replayable())  # (each push one update, where it lands; a new algorithm may join)
    assert {"asgd", "dc-asgd", "lc-asgd"} <= replayable
    assert not replayable & {"ssgd", "dbs-asgd", "softsync", "backup-sgd", "gossip"}


def test_the_convergence_grid_is_the_registrys():
    """benchmarks/study/convergence.py's default grid is the registry's (a pre-registered grid names its
    algorithms in its command's --algos, and a protocol's criteria their baselines): not a list."""
    with open(os.path.join(ROOT, "benchmarks", "study", "convergence.py")) as f:
        tree = ast.parse(f.read())
    (grid,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["ALGORITHMS"]]
    assert not _names_in(grid) and ast.unparse(grid) == "registry.names()", ast.unparse(grid)


def test_an_option_shared_by_algorithms_is_declared_once():
    """A flag several algorithms take comes from one declaration (an option group, hvd_async/algorithms/
    groups.py), not a copy per class: two declarations of one flag must at least say different things."""
    import dataclasses

    from hvd_async.options import declared

    declarations = {}
    for name in registry.NAMES:
        options_cls = registry.algorithm(name).Options
        for field, how in declared(options_cls):
            if how.flag is not None:
                declarations.setdefault(how.flag, {})[id(how)] = how.help
    copies = {flag: helps for flag, helps in declarations.items() if len(set(helps.values())) < len(helps)}
    assert not copies, f"flags declared again with the same help: {sorted(copies)}; inherit the option group"
    assert dataclasses.is_dataclass(options_cls)


# --- getattr for contracts ------------------------------------------------------------------------

def _is_strategy(node) -> bool:
    """``strategy``, ``cls``, ``x.strategy`` (what a getattr probes a contract on)."""
    if isinstance(node, ast.Name):
        return node.id in ("strategy", "cls", "strategy_cls")
    return isinstance(node, ast.Attribute) and node.attr in ("strategy", "strategy_cls")


def contract_getattrs(source: str) -> list:
    """``line: getattr(...)`` probing an attribute of a strategy (or of a class method's ``cls``) with
    a default: a contract nobody declared."""
    return [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
            and node.args and _is_strategy(node.args[0])]


def test_no_getattr_on_a_strategy():
    found = {name: hits for name, (_, text) in MODULES.items() for hits in [contract_getattrs(text)] if hits}
    assert not found, f"contracts probed with getattr: {found}; declare them on Strategy with a default"


# --- private names of algorithm modules -----------------------------------------------------------

def _resolve(module: str, init: bool, level: int, target) -> str:
    """The dotted name of ``from <level dots><target> import ...`` in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".") if init else module.split(".")[:-1]
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def imports(module: str, init: bool, source: str, known=None):
    """``(line, imported module, names)`` of every import in ``source``, in functions too; ``from
    pkg import sub`` of a submodule (one of ``known``, default: the package's) yields ``pkg.sub``."""
    known = MODULES if known is None else known
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, init, node.level, node.module)
            names = [alias.name for alias in node.names]
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            for sub in subs:
                yield node.lineno, sub, ()
            rest = [n for n in names if f"{base}.{n}" not in known]
            if rest or not subs:
                yield node.lineno, base, tuple(rest)


def algorithm_modules() -> set:
    return {registry.algorithm(name).__module__ for name in registry.NAMES}


def private_imports(module: str, init: bool, source: str, algorithms: set) -> list:
    """``line: module.name`` of every underscore name imported from another algorithm's module."""
    return [f"{line}: {target}.{name}" for line, target, names in imports(module, init, source)
            if target in algorithms and target != module for name in names if name.startswith("_")]


def test_no_import_of_another_algorithms_private_name():
    algorithms = algorithm_modules()
    found = {name: hits for name, (init, text) in MODULES.items()
             for hits in [private_imports(name, init, text, algorithms)] if hits}
    assert not found, (f"private names of another algorithm's module imported: {found}; move what is shared "
                       f"into the family's public modules (algorithms/ps.py, payload.py, options)")


def private_attributes_of_package_modules(source: str) -> list:
    """``line: module.name`` of each private name read off a module of the package (``W._pushes``,
    ``config._load_yaml``): a module uses another's public names only."""
    tree, local = ast.parse(source), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:  # the package's own modules
            local |= {alias.asname or alias.name for alias in node.names}
    return [f"{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in local
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def test_no_private_name_of_another_module_of_the_package():
    found = {name: hits for name, (_, text) in MODULES.items()
             for hits in [private_attributes_of_package_modules(text)] if hits}
    assert not found, f"private names of another module read: {found}; make what is shared public"


# --- import cycles --------------------------------------------------------------------------------

def import_graph(modules) -> dict:
    graph = {name: set() for name in modules}
    for name, (init, text) in modules.items():
        for _, target, _ in imports(name, init, text, modules):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_the_package():
    # a package's __init__ re-exporting its modules is not a dependency of theirs: leave the edges
    # from an __init__ to its own submodules out (they are the package's face, not a loop)
    graph = import_graph(MODULES)
    for name, (init, _) in MODULES.items():
        if init:
            graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    found = cycles(graph)
    assert not found, f"modules that import each other (directly or around a loop): {found}"


# --- the library and the job ------------------------------------------------------------------------

# What sits on the library: the reference job and its commands, and the simulator that runs the job's loop.
ABOVE_THE_LIBRARY = ("hvd_async.job", "hvd_async.sim")


def _above(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in ABOVE_THE_LIBRARY)


def library_imports_of_the_job(modules) -> list:
    """``module -> job module`` for every import of the job or the simulator by a library module."""
    graph = import_graph(modules)
    return sorted(f"{name} -> {target}" for name, targets in graph.items() if not _above(name)
                  for target in targets if _above(target))


def test_the_library_imports_nothing_of_the_job():
    """A user's own script imports the library alone (optimizer, runtime, server, registry, algorithms,
    transports): the reference job (hvd_async.job) and the simulator build on it, never under it."""
    assert "hvd_async.job.train" in MODULES and "hvd_async.optimizer" in MODULES
    found = library_imports_of_the_job(MODULES)
    assert not found, f"library modules importing the job or the simulator: {found}"


def test_the_layering_checker_sees_a_planted_import():
    planted = {"hvd_async.optimizer": (False, "def f():\n    from .job.config import ConfigError\n"),
               "hvd_async.job.config": (False, "from .. import registry\n"), "hvd_async.registry": (False, "")}
    assert library_imports_of_the_job(planted) == ["hvd_async.optimizer -> hvd_async.job.config"]


# --- the job's description -------------------------------------------------------------------------

# The command-line front ends: they parse flags and build the typed job (hvd_async.job.jobspec) from them;
# hvd_async.sim's simulate() takes an argv list or a Namespace as its public form of the same;
# hvd_async.job.doctor is a command of its own, which builds no job.
FRONT_ENDS = {"hvd_async.job.cli", "hvd_async.job.config", "hvd_async.options", "hvd_async.sim", "hvd_async.sim.options",
              "hvd_async.sim.runner", "hvd_async.job.doctor"}


def namespace_readers(source: str) -> list:
    """``line: what`` of each sign of a module taking parsed flags: an import of argparse, or a function
    parameter named ``args`` (the name the Namespace travelled under)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(alias.name == "argparse" for alias in node.names):
            found.append(f"{node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
            found.append(f"{node.lineno}: from argparse import")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{node.lineno}: parameter {p.arg}" for p in params if p.arg == "args"]
    return found


def test_below_the_front_ends_no_module_takes_parsed_flags():
    """The CLI and YAML build one JobSpec (validated once); the loop, the simulator's job, the metrics,
    the checkpoints and the servers take its typed parts, never an argparse Namespace."""
    found = {name: hits for name, (_, text) in MODULES.items() if name not in FRONT_ENDS
             for hits in [namespace_readers(text)] if hits}
    assert not found, f"modules below the front ends taking parsed flags: {found}; take hvd_async.job.jobspec's parts"
    assert FRONT_ENDS <= set(MODULES), f"front ends renamed: {sorted(FRONT_ENDS - set(MODULES))}"


# --- constructors --------------------------------------------------------------------------------

def explicit_init_calls(source: str) -> list:
    """``line: call`` of each ``SomeClass.__init__(self, ...)``: a constructor chosen by hand, which
    skips the others of the class's bases (their constructors run through ``super().__init__``)."""
    return [f"{node.lineno}: {ast.unparse(node)[:60]}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
            and not (isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", None) == "super")]


def test_no_constructor_is_called_by_hand():
    found = {name: hits for name, (_, text) in MODULES.items() for hits in [explicit_init_calls(text)] if hits}
    assert not found, f"constructors called by hand (skipping the bases' own): {found}; call super().__init__"


def test_the_simulator_defines_no_transport_of_its_own():
    """The simulator's stand-ins are below the transports (MPI, Horovod, the servers' memory), never a
    transport class: one that subclassed a real transport and skipped its constructor, or that
    imitated one, would let the simulator run other code than the job."""
    import inspect
    import pkgutil

    import hvd_async.sim
    from hvd_async.transport.base import Transport

    found = []
    for info in pkgutil.iter_modules(hvd_async.sim.__path__):
        module = importlib.import_module(f"hvd_async.sim.{info.name}")
        found += [f"{module.__name__}.{name}" for name, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Transport) and cls.__module__ == module.__name__]
    assert not found, f"transport classes in the simulator: {found}; give the real one a simulated carrier"


@pytest.mark.parametrize("algo, extra", [("asgd", []), ("dc-asgd", []), ("softsync", []), ("gossip", []),
                                         ("ssgd", []), ("od-sgd", ["--od-exchange", "allreduce"])])
def test_the_simulator_opens_the_real_transports_through_the_algorithms_factory(monkeypatch, algo, extra):
    from hvd_async import registry
    from hvd_async.sim import simulate
    from hvd_async.transport.horovod import HorovodTransport
    from hvd_async.transport.peer import PeerWindowTransport
    from hvd_async.transport.window import WindowTransport

    opened, made = [], []
    cls = registry.algorithm(algo)
    factory = cls.make_transport.__func__

    def make_transport(klass, named, options, comms):
        made.append(type(comms).__name__)
        transport = factory(klass, named, options, comms)
        opened.append(type(transport))
        return transport

    monkeypatch.setattr(cls, "make_transport", classmethod(make_transport))
    simulate(["--algo", algo, "--workers", "2", "--epochs", "1", "--dataset", "digits", *extra])
    assert made == ["SimComms"] * 2
    assert set(opened) <= {WindowTransport, PeerWindowTransport, HorovodTransport} and len(opened) == 2, opened


CARRIERS = {"WindowTransport", "PeerWindowTransport", "HorovodTransport"}


def transports_built_by_hand(source: str) -> list:
    """``line: name`` of each MPI or Horovod transport class an algorithm names in code (not in its
    docstring): an algorithm asks ``comms`` for the kind of transport it needs, so that the simulator's
    stand-in can open a simulated one through the same ``make_transport``."""
    return [f"{node.lineno}: {name}" for node in ast.walk(ast.parse(source))
            for name in [node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                         else node.name if isinstance(node, ast.alias) else None] if name in CARRIERS]


def test_algorithms_open_their_transports_through_comms_and_the_simulator_through_the_factory():
    found = {name: hits for name, (_, text) in MODULES.items() if name.startswith("hvd_async.algorithms")
             for hits in [transports_built_by_hand(text)] if hits}
    assert not found, f"algorithms building a transport class themselves: {found}; ask comms.windows/peers/collectives"
    sim_job = ast.parse(MODULES["hvd_async.sim.job"][1])
    calls = [node for node in ast.walk(sim_job) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "DistributedOptimizer"]
    assert calls and all("comms" in {k.arg for k in call.keywords} and "transport" not in {k.arg for k in call.keywords}
                         for call in calls), "the simulator must build its transports through make_transport (comms=)"


# --- the checkers find what they look for ---------------------------------------------------------

PLANTED = {
    "comparison": ('def f(self):\n    return self.name == "softsync"\n', name_comparisons),
    "membership": ('def f(algo):\n    return algo in ("asgd", "dc-asgd")\n', name_comparisons),
    "list": ('REPLAYS = ("asgd", "dc-asgd")\n', name_lists),
    "getattr": ('def f(strategy):\n    return getattr(strategy, "skipped_nonfinite", 0)\n', contract_getattrs),
    "getattr-cls": ('def f(cls):\n    return getattr(cls, "mode", "accumulate")\n', contract_getattrs),
    "namespace": ('def run_job(args, splits):\n    return args.epochs\n', namespace_readers),
    "argparse": ('import argparse\n', namespace_readers),
    "transport-by-hand": ('def make_transport(cls, named, options, comms):\n'
                          '    return W.WindowTransport.open(s, comms)\n', transports_built_by_hand),
    "private-attribute": ('from ..transport import window as W\nx = W._pushes\n',
                          private_attributes_of_package_modules),
    "init-by-hand": ('class A(B):\n    def __init__(self):\n        Transport.__init__(self)\n', explicit_init_calls),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_checker_catches_a_planted_violation(case):
    source, check = PLANTED[case]
    assert check(source), case


def test_the_private_import_and_cycle_checkers_catch_planted_violations():
    algorithms = algorithm_modules()
    source = "from .dcasgd import _check_dc_numbers\n"
    assert private_imports("hvd_async.algorithms.lcasgd", False, source, algorithms)
    assert not private_imports("hvd_async.algorithms.lcasgd", False, "from .dcasgd import DCProgram\n", algorithms)
    planted = {"hvd_async.a": (False, "from . import b\n"), "hvd_async.b": (False, "def f():\n    from .a import x\n"),
               "hvd_async.c": (False, "from .a import x\n")}
    assert cycles(import_graph(planted)) == [["hvd_async.a", "hvd_async.b"]]


# --- the strategy interface --------------------------------------------------------------------------

STRATEGY_MEMBERS_AT_MOST = 20  # issue 60: what is not every worker's step lives on the declaration or its one user


def _class_members(source: str, class_name: str) -> list:
    """Methods and class attributes of ``class_name`` in ``source`` (instance attributes set in methods
    do not count)."""
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == class_name)
    found = []
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(item.name)
        elif isinstance(item, ast.Assign):
            found += [t.id for t in item.targets if isinstance(t, ast.Name)]
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.append(item.target.id)
    return found


def test_the_strategy_base_is_small_and_the_declarations_hold_the_rest():
    members = _class_members(MODULES["hvd_async.algorithms.base"][1], "Strategy")
    assert len(members) <= STRATEGY_MEMBERS_AT_MOST, (len(members), members)
    declared = set(_class_members(MODULES["hvd_async.algorithms.algorithm"][1], "Algorithm"))
    assert not declared & set(members) - {"name"}, declared & set(members)  # each in one of the two
    from hvd_async.algorithms.algorithm import Algorithm
    from hvd_async.algorithms.base import Strategy

    for name, declaration in registry.algorithms().items():
        assert issubclass(declaration, Algorithm) and issubclass(declaration.strategy, Strategy), name
        assert declaration.name == name
        leaked = declared & set(vars(declaration.strategy)) - {"name"}
        assert not leaked, f"{name}: {declaration.strategy.__name__} declares {sorted(leaked)}; its declaration does"


def test_the_member_count_sees_a_planted_member():
    source = "class Strategy:\n    a = 1\n    b: int = 2\n    def c(self):\n        self.d = 3\n"
    assert _class_members(source, "Strategy") == ["a", "b", "c"]

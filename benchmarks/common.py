"""What every benchmark script shares: relaunching itself under mpirun, running the training job,
and writing its JSON (with its provenance: commit, tree state, machine, versions, command, date)
and plot.

The scripts sit in folders by what they measure: ``speed/`` (costs and ratios), ``study/`` (the
convergence and reproduction studies), ``faults/`` (the fault matrix) and ``device/`` (the GPU
machine's); this module stays in ``benchmarks/``, and ``results/`` holds the records. Each script's
line after its standard-library imports puts ``benchmarks/`` on ``sys.path`` (``sys.path.insert(0,
os.path.dirname(os.path.dirname(os.path.abspath(__file__))))``) so that ``from common import ...``
works run from anywhere or imported; a script's own folder is on the path as the script's (a test
puts the group's folder there), so scripts of one group import each other by name."""
import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def under_mpirun() -> bool:
    """Whether this process is an MPI rank (otherwise the script launches itself)."""
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def program(script: str):
    """The command that reruns ``script`` with this process's arguments."""
    return [sys.executable, os.path.abspath(script), *sys.argv[1:]]


def relaunch(script: str, np: int, mpi_args: str = "") -> int:
    """Run ``script`` with the same arguments on ``np`` ranks through the project's launcher."""
    sys.path.insert(0, ROOT)
    from hvd_async.job.launcher import mpirun_command, run

    return run(mpirun_command(np, program(script), mpi_args=mpi_args)).code


NETNS_TOOL = os.environ.get("HVD_ASYNC_NETNS_TOOL",
                            os.path.join(os.path.dirname(ROOT), "shared", "tools", "netns-cluster"))
NETNS_ENV = {"NETNS_PREFIX": "hvdbench", "NETNS_SUBNET": "10.77.0"}  # apart from the tests' cluster
MODES = ("shm", "no-shm", "netns")
NO_SHM_MPI_ARGS = "--mca btl self,tcp --mca osc ^sm"  # one node, talking as separate nodes do (TCP only)
MODES_HELP = "shm: one node; no-shm: one node over TCP; netns: 3 hosts of ../shared/tools/netns-cluster (needs root)"


def launch_mode(script: str, np: int, mode: str, link_mbit: float = None) -> int:
    """Run ``script`` with the same arguments on ``np`` ranks: on this node with windows in shared
    memory (``shm``) or over TCP only (``no-shm``), or across the 3 hosts of the netns cluster
    (``netns``: brought up for the run and down after it). ``link_mbit``: each netns host's link
    limited to that many Mbit/s each way (a token bucket, ``tc tbf``), as a slower network would."""
    if mode != "netns":
        return relaunch(script, np, NO_SHM_MPI_ARGS if mode == "no-shm" else "")
    name = os.path.splitext(os.path.basename(script))[0]
    if not os.path.isfile(NETNS_TOOL):
        print(f"{name}: error: {NETNS_TOOL} not found (set HVD_ASYNC_NETNS_TOOL)", file=sys.stderr)
        return 2
    env = dict(os.environ, **NETNS_ENV)
    if subprocess.run(["bash", NETNS_TOOL, "up", "3"], env=env).returncode != 0:
        print(f"{name}: error: could not build the netns cluster (needs root and iproute2)", file=sys.stderr)
        return 2
    try:
        if link_mbit and not limit_links(link_mbit):
            print(f"{name}: error: could not limit the netns links to {link_mbit:g} Mbit/s (tc tbf)", file=sys.stderr)
            return 2
        return subprocess.run(["bash", NETNS_TOOL, "mpirun", "-np", str(np), *program(script)], env=env).returncode
    finally:
        subprocess.run(["bash", NETNS_TOOL, "down"], env=env)


def mpi_main(script: str, args, bench) -> int:
    """A benchmark's entry: launch ``script`` on ``args.np`` ranks in ``args.mode`` (see
    :func:`launch_mode`), or, on a rank, run ``bench(args)``."""
    if not under_mpirun():
        return launch_mode(script, args.np, args.mode)
    return bench(args)


def limit_links(mbit: float) -> bool:
    """Put a token bucket of ``mbit`` Mbit/s on the link of each netns host of the benchmarks' cluster
    (its burst: a hundredth of a second of the rate, 512 KB at least)."""
    burst = max(512 * 1024, int(mbit * 1e6 / 8 / 100))
    hosts = [f"{NETNS_ENV['NETNS_PREFIX']}{i}" for i in (1, 2, 3)]
    return all(subprocess.run(["ip", "netns", "exec", host, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                               "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "50ms"]).returncode == 0
               for host in hosts)


SPIN_YIELD = {"auto": None, "on": True, "off": False}  # --spin-yield: ha.serve()'s spin_yield


def add_spin_yield(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spin-yield", choices=tuple(SPIN_YIELD), default="auto",
                   help="whether the server gives its core away while it spins (ha.serve's spin_yield; auto: "
                        "where the node is oversubscribed)")


def add_slots(p: argparse.ArgumentParser) -> None:
    """``--slots``: ranks per netns host (``--mode netns``; 1 puts every rank on a host of its own, so
    every push crosses a link). :func:`use_slots` passes it on to the cluster's hostfile."""
    p.add_argument("--slots", type=int, default=2, help="ranks per netns host (--mode netns; 1: every rank "
                                                          "on a host of its own)")


def use_slots(args) -> None:
    """Before ``launch_mode``: the netns hosts' slots from ``--slots`` (:func:`add_slots`)."""
    os.environ["NETNS_SLOTS"] = str(args.slots)


def dc_pushes(numel: int):
    """What ``fp16_push.py`` and ``push_phases.py`` time, on a worker: ``(grad, out, header,
    transports)``, a dc-asgd push of ``numel`` fp32 elements (plain SGD on the server, no compensation)
    through a window transport per wire, ``transports["fp32"]`` and ``["fp16"]``, each opened, published
    and warmed by one push (collective over the job's ranks, as the transports are)."""
    import torch

    import hvd_async as ha
    from hvd_async.algorithms.payload import SGDPayload
    from hvd_async.transport import window as W

    header = SGDPayload(lr=1e-3).encode()
    options = {"lam": 0.0, "adaptive": False, "ms_momentum": 0.95, "lookahead": False, "push_clip": 0.0}
    grad, out = torch.full((numel,), 1e-3), torch.zeros(numel)
    transports = {}
    for wire in ("fp32", "fp16"):
        t = transports[wire] = W.WindowTransport(numel, comms=ha.runtime.comms(), algorithm="dc-asgd",
                                                 mode="mailbox", options=options, wire=wire)
        t.publish_(out)
        t.push(grad, out, header)  # warm
    return grad, out, header, transports


def save(summary: dict, out: str, plot) -> None:
    """Write ``summary`` as JSON to ``out`` (see :func:`write_record`) and ``plot(summary, path)``
    beside it as PNG."""
    write_record(summary, out)
    plot(summary, os.path.splitext(out)[0] + ".png")


def write_record(summary: dict, out: str, command: str = None) -> dict:
    """Write ``summary`` as JSON to ``out`` with a ``provenance`` block (:func:`provenance`; ``command``
    in place of this process's own, where that is not what reruns it) added; warns loudly on stderr
    when the tree was not clean (the record is written all the same)."""
    summary["provenance"] = provenance()
    if command:
        summary["provenance"]["command"] = command
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    if not summary["provenance"]["tree_clean"]:
        warn_dirty(summary["provenance"], out)
    return summary


# --- provenance: what a reader needs to tie a figure to the code and the machine ---------------------

RESULTS_DIR = os.path.join("benchmarks", "results")  # written by the runs themselves: never counts as dirty
PACKAGES = ("torch", "horovod", "mpi4py", "numpy")


def git(*args: str) -> str:
    """Output of ``git ARGS`` in the repository ('' when git or the repository is missing)."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip("\n") if done.returncode == 0 else ""


def dirty_files() -> list:
    """Why the tree differs from its commit: tracked files changed (outside benchmarks/results/),
    untracked modules of the package, and the running script itself when git does not track it."""
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS_DIR}")
    found = [line[3:] for line in changed.splitlines() if line.strip()]
    found += [f"{p} (untracked)" for p in git("ls-files", "--others", "--exclude-standard", "--",
                                               "hvd_async").splitlines() if p.endswith(".py")]
    script = _script()  # (one git ignores, such as pytest's own under .venv/, is not the project's)
    if os.path.isfile(os.path.join(ROOT, script)) and git("ls-files", "--others", "--exclude-standard", "--", script):
        found.append(f"{script} (untracked)")
    return found


def _script() -> str:
    """The running script's path relative to the repository (as given when outside it)."""
    given = sys.argv[0] if sys.argv else ""
    path = os.path.abspath(given)
    return os.path.relpath(path, ROOT) if os.path.isfile(path) and path.startswith(ROOT + os.sep) else given


def command_line() -> str:
    """This process's command as one shell-quoted line, the script relative to the repository root
    (under mpirun: the command each rank runs, the same arguments the user gave)."""
    return shlex.join(["python", _script(), *sys.argv[1:]])


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Processor", "cpu model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """Cores (usable by this process, and in all), CPU model, architecture, OS, memory: no host name."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024 ** 3, 1)
    except (AttributeError, ValueError, OSError):
        memory_gb = None
    return {"cores_usable": usable, "cores_total": os.cpu_count(), "cpu_model": cpu_model(),
            "arch": platform.machine(), "os": f"{platform.system()} {platform.release()}", "memory_gb": memory_gb}


def versions() -> dict:
    """Python's and the main packages' versions (read from their metadata: nothing is imported),
    and the first line of ``mpirun --version``."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    mpirun, text = shutil.which("mpirun"), ""
    try:
        if mpirun:
            text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        pass
    out["mpi"] = text.strip().splitlines()[0] if text.strip() else None
    return out


def source_state():
    """(commit, tree_clean, dirty files, where the commit came from). On the device machine the commit
    is DEVICE_COMMIT, as scripts/device_check.sh names it (benchmarks/device/device_info.py: a sha, '+dirty'
    when the tree differed where it was set): the device tool's copy of the tree may carry no .git, or
    the session's starting one (seen: its HEAD an older commit, the newer ones' files 'dirty')."""
    named = os.environ.get("DEVICE_COMMIT", "")
    if named:
        sha = named.split("+")[0]
        return sha, named == sha, ([] if named == sha else ["(DEVICE_COMMIT says +dirty)"]), "DEVICE_COMMIT"
    head = git("rev-parse", "HEAD")
    if head:
        dirty = dirty_files()
        return head, not dirty, dirty, "git"
    return None, False, ["(no git repository and no DEVICE_COMMIT: the tree cannot be checked)"], "none"


def provenance() -> dict:
    """Where a record came from: the commit (``git rev-parse HEAD``), whether the tree was clean
    (:func:`dirty_files`), the machine, the versions, the command and the UTC date."""
    commit, clean, dirty, where = source_state()
    return {"commit": commit, "tree_clean": clean, "dirty_files": dirty[:50], "commit_from": where,
            "machine": machine(), "versions": versions(), "command": command_line(),
            "mpi_ranks": int(os.environ["OMPI_COMM_WORLD_SIZE"]) if "OMPI_COMM_WORLD_SIZE" in os.environ else None,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def warn_dirty(prov: dict, out: str) -> None:
    """The loud warning for a record written from a tree that differs from its commit."""
    bar = "!" * 100
    files = ", ".join(prov["dirty_files"][:8]) + (" ..." if len(prov["dirty_files"]) > 8 else "")
    print(f"{bar}\n!! WARNING: {out} was written from a tree that is NOT its commit "
          f"({str(prov['commit'])[:10]}): {files}\n!! Its figures cannot be quoted: commit the change, "
          f"then rerun:\n!!   {prov['command']}\n{bar}", file=sys.stderr, flush=True)


SIZE_UNITS = {"KB": 1024, "MB": 1024 ** 2}


def parse_size(text: str) -> int:
    """``256KB``, ``4MB``: a buffer size in bytes (argparse's ``type``; a clear error otherwise)."""
    for unit, factor in SIZE_UNITS.items():
        if text.upper().endswith(unit) and text[:-2].isdigit():
            return int(text[:-2]) * factor
    raise argparse.ArgumentTypeError(f"size {text!r} must look like 256KB or 4MB")


def spread(values) -> dict:
    """min, quartiles, median and max of ``values`` (the quartiles: ``statistics.quantiles``, n=4,
    exclusive method; with one value all equal it)."""
    values = sorted(values)
    if not values:
        return {"n": 0, "min": None, "q1": None, "median": None, "q3": None, "max": None}
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {"n": len(values), "min": values[0], "q1": q[0], "median": statistics.median(values), "q3": q[2],
            "max": values[-1]}


def train_job(flags, *, timeout: float = 1800) -> dict:
    """Run ``hvd-async train FLAGS --metrics-out ...`` and return its metrics record (exits on failure)."""
    return cli_job("train", [*flags, "--progress", "epochs"], timeout=timeout)


def cli_job(command: str, flags, *, timeout: float = 1800) -> dict:
    """Run ``hvd-async COMMAND FLAGS --metrics-out ...`` (train, simulate) and return its metrics record
    (exits on failure)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        cmd = [sys.executable, "-m", "hvd_async.job.cli", command, *map(str, flags), "--metrics-out", metrics]
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}")
        with open(metrics) as f:
            return json.load(f)


def pyplot():
    """matplotlib's pyplot on the file-only backend (benchmarks run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run_parts(args, table: dict, prefix: str) -> int:
    """Run the parts ``args.part`` names ("all": every one in ``table``, a dict of part -> (run, plot)),
    saving each result as ``{outdir}/{prefix}_{part}.json`` with its plot."""
    for part in (table if args.part == "all" else (args.part,)):
        run, plot = table[part]
        print(f"== {part}", flush=True)
        save(run(args), os.path.join(args.outdir, f"{prefix}_{part}.json"), plot)
    return 0


def apply_quick(parser, args, quick: dict) -> None:
    """With ``--quick``: each option in ``quick`` (dest -> value) that was left at its default takes
    the quick value (options given on the command line win)."""
    if getattr(args, "quick", False):
        for dest, value in quick.items():
            if getattr(args, dest) == parser.get_default(dest):
                setattr(args, dest, value)


def quick_help(quick: dict) -> str:
    """``--quick``'s help: the options it changes, as flags."""
    return "the quick form (bench_check.py): " + " ".join(
        f"--{dest.replace('_', '-')} {value}" for dest, value in quick.items()) + " unless given"

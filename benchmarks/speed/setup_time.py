"""The first day's waits, as a newcomer meets them: the README's first command, ``make train``, on a
fresh clone with an empty environment cache and pip's cache off.

It times the setup (``make setup``: the virtual environment from PyPI, Horovod's build, the editable
install), then the main job as ``make train`` runs it, several times: when its first line reaches the
screen, when worker 0 takes its first training step (the job's ``seconds_to_first_step``: the ranks'
imports, MPI's and Horovod's start, the data) and when it ends.

What it cannot make fresh: Debian's packages (OpenMPI, the compilers, Fashion-MNIST), whose install
needs root and would disturb the machine. The record lists the ones the machine already had; their
install is not in the figure.

    python benchmarks/speed/setup_time.py [--repeats 3] [--out benchmarks/results/setup_time.json]

``--job-only`` leaves the setup out and times the main job alone, from this checkout and its
environment (made by ``make setup``), as a user who has already set up meets it every day:

    python benchmarks/speed/setup_time.py --job-only --repeats 5 --out benchmarks/results/start_time.json
"""
import argparse
import json
import os
import pty
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT, provenance, spread, write_record  # noqa: E402

# the main job, as the Makefile's train target runs it (checked against the Makefile below)
TRAIN = ["--np", "4"]


def packages() -> list:
    """The Debian packages scripts/setup.sh installs when missing (read from the script)."""
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        found = re.search(r"^packages=\(([^)]*)\)", f.read(), re.M)
    return found.group(1).split()


def installed(package: str) -> bool:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return status.stdout == "install ok installed"


def clean_env(cache: str) -> dict:
    """This environment without the virtual environment this script runs in (the setup makes its own
    from the system's python3), with the fresh cache and pip's cache off."""
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None) or sys.prefix
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not os.path.realpath(p).startswith(os.path.realpath(venv)))
    env.update(HVD_ASYNC_CACHE=cache, PIP_NO_CACHE_DIR="1")
    env.pop("PYTHONPATH", None)
    return env


def timed_setup(clone: str, env: dict, log: str) -> float:
    print(f"[setup_time] make setup in a fresh clone ({clone}); the first run takes minutes, its output "
          f"goes to {log}", flush=True)
    began = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(["make", "-C", clone, "setup"], env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"setup_time: error: make setup failed with status {done.returncode}; see {log}")
    return seconds


def _output(proc, read) -> tuple:
    """Read ``proc``'s output to its end with ``read()`` (bytes, b"" at the end): the seconds from
    ``proc``'s start to its first visible character, and the text."""
    began, first, chunks = proc.began, None, []
    while True:
        data = read()
        if not data:
            break
        if first is None and data.strip():
            first = time.monotonic() - began
        chunks.append(data)
    return first, b"".join(chunks).decode(errors="replace")


def timed_train(clone: str, env: dict, metrics: str, terminal: bool = False) -> dict:
    """One run of the main job, its output read as it comes: seconds to its first visible output, its
    end, and the job's own seconds to the first step. Its output goes to a pipe (as into a log file), or
    (``terminal``) to a pseudo-terminal, as a user at a terminal sees it."""
    cmd = [os.path.join(clone, ".venv", "bin", "hvd-async"), "train", *TRAIN, "--metrics-out", metrics,
           "--logdir", metrics + ".tb"]
    if terminal:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(cmd, cwd=clone, env=env, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
        proc.began = time.monotonic()
        os.close(follower)

        def read() -> bytes:
            try:
                return os.read(leader, 65536)
            except OSError:  # EIO: every process that had the terminal has closed it
                return b""
        try:
            first, text = _output(proc, read)
        finally:
            os.close(leader)
    else:
        proc = subprocess.Popen(cmd, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        proc.began = time.monotonic()
        first, text = _output(proc, lambda: proc.stdout.read1(65536))
    code = proc.wait()
    total = time.monotonic() - proc.began
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    if code != 0:
        sys.exit(f"setup_time: error: the main job exited with status {code}:\n" + "\n".join(lines[-20:]))
    with open(metrics) as f:
        record = json.load(f)
    return {"first_line_seconds": round(first, 2), "first_line": lines[0] if lines else "",
            "seconds_to_first_step": record["seconds_to_first_step"], "total_seconds": round(total, 2),
            "train_seconds": record["train_seconds"], "final_test_accuracy": record["final_test_accuracy"]}


def timed_runs(clone: str, env: dict, work: str, repeats: int, terminal: bool = False) -> list:
    """``repeats`` runs of the main job (:func:`timed_train`), each reported as it ends."""
    runs = []
    for k in range(repeats):
        runs.append(timed_train(clone, env, os.path.join(work, f"metrics{k}-{int(terminal)}.json"), terminal))
        where = "on a terminal" if terminal else "to a pipe"
        print(f"[setup_time] run {k + 1} ({where}): first line {runs[-1]['first_line_seconds']} s, first step "
              f"{runs[-1]['seconds_to_first_step']} s, done at {runs[-1]['total_seconds']} s", flush=True)
    return runs


MEASURES = ("first_line_seconds", "seconds_to_first_step", "total_seconds")


def job_only(args) -> int:
    """The main job alone, ``args.repeats`` times to a pipe and as many on a terminal, from this
    checkout's environment."""
    if not os.path.exists(os.path.join(ROOT, ".venv", "bin", "hvd-async")):
        sys.exit(f"setup_time: error: {os.path.join(ROOT, '.venv')} has no hvd-async; run make setup first")
    env = dict(os.environ)
    env.pop("HVD_ASYNC_LAUNCHED_AT", None)
    if args.no_data_cache:  # a cache under a file cannot be made: each run draws digits as a first job does
        env["HVD_ASYNC_CACHE"] = os.path.join(os.devnull, "cache")
    with tempfile.TemporaryDirectory(prefix="hvd-start-time-") as work:
        runs = {"pipe": timed_runs(ROOT, env, work, args.repeats),
                "terminal": timed_runs(ROOT, env, work, args.repeats, terminal=True)}
    summary = {
        "benchmark": "start_time",
        "what": ("the Makefile's main job (hvd-async train " + " ".join(TRAIN) + ") from a checkout already set "
                 "up, run after run, its output to a pipe (a log file) and to a pseudo-terminal (a user's "
                 "screen): seconds to its first visible line, to worker 0's first training step (the job's "
                 "seconds_to_first_step) and to its end"
                 + ("; every run without the data cache (digits drawn with scikit-learn each time, as on a "
                    "machine's first job)" if args.no_data_cache else "")),
        "data_cache": not args.no_data_cache,
        "runs": runs,
        "median": {where: {key: statistics.median(r[key] for r in found) for key in MEASURES}
                   for where, found in runs.items()},
        "spread": {where: {key: spread([r[key] for r in found]) for key in MEASURES} for where, found in runs.items()},
    }
    write_record(summary, args.out)
    for where, median in summary["median"].items():
        print(f"[setup_time] {where}: median first line {median['first_line_seconds']} s, first step "
              f"{median['seconds_to_first_step']} s, done at {median['total_seconds']} s")
    print(f"[setup_time] written {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the main job after the setup (default 3)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "setup_time.json"))
    parser.add_argument("--keep", action="store_true", help="keep the clone and its environment")
    parser.add_argument("--job-only", action="store_true",
                        help="no setup: time the main job from this checkout's environment (.venv)")
    parser.add_argument("--no-data-cache", action="store_true",
                        help="with --job-only: no data cache for the job (it draws the digits split each run, "
                             "as a machine's first job does)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, got {args.repeats}")
    if args.no_data_cache and not args.job_only:
        parser.error("--no-data-cache times the job alone: add --job-only")
    with open(os.path.join(ROOT, "Makefile")) as f:
        if "hvd-async train " + " ".join(TRAIN) + " --metrics-out runs/metrics.json --logdir runs/tb" not in f.read():
            sys.exit("setup_time: error: the Makefile's train target no longer runs `hvd-async train "
                     f"{' '.join(TRAIN)}`; update TRAIN in {__file__}")
    if args.job_only:
        return job_only(args)
    prov = provenance()
    present = {p: installed(p) for p in packages()}
    work = tempfile.mkdtemp(prefix="hvd-setup-time-")
    try:
        clone = os.path.join(work, "clone")
        subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
        if head != prov["commit"]:
            sys.exit(f"setup_time: error: the clone is at {head[:10]}, this checkout at {str(prov['commit'])[:10]}: "
                     "commit first")
        env = clean_env(os.path.join(work, "cache"))
        setup = timed_setup(clone, env, os.path.join(work, "setup.log"))
        print(f"[setup_time] setup took {setup:.0f} s; now the main job, {args.repeats} time(s)", flush=True)
        runs = timed_runs(clone, env, work, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary = {
        "benchmark": "setup_time",
        "what": ("make setup on a fresh clone with an empty HVD_ASYNC_CACHE and PIP_NO_CACHE_DIR=1, then the "
                 "Makefile's main job (hvd-async train " + " ".join(TRAIN) + ") run after it; Debian's "
                 "packages as the machine had them (debian_packages_present)"),
        "debian_packages_present": present,
        "setup_seconds": round(setup, 1),
        "first_make_train_seconds": round(setup + runs[0]["total_seconds"], 1),
        "runs": runs,
        "median": {key: statistics.median(r[key] for r in runs) for key in MEASURES},
    }
    write_record(summary, args.out)
    print(f"[setup_time] make setup {setup:.0f} s; first make train {summary['first_make_train_seconds']:.0f} s; "
          f"median first line {summary['median']['first_line_seconds']} s, first step "
          f"{summary['median']['seconds_to_first_step']} s; written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

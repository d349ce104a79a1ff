"""What every benchmark script shares: relaunching itself under mpirun, running the training job,
and writing its JSON and plot."""
import json
import os
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
    from hvd_async.launcher import mpirun_command, run

    return run(mpirun_command(np, program(script), mpi_args=mpi_args))


def save(summary: dict, out: str, plot) -> None:
    """Write ``summary`` as JSON to ``out`` and ``plot(summary, path)`` beside it as PNG."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    plot(summary, os.path.splitext(out)[0] + ".png")


def train_job(flags, *, timeout: float = 1800) -> dict:
    """Run ``hvd-async train FLAGS --metrics-out ...`` and return its metrics record (exits on failure)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        cmd = [sys.executable, "-m", "hvd_async.cli", "train", *map(str, flags), "--progress", "epochs",
               "--metrics-out", metrics]
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

"""What every benchmark script shares: relaunching itself under mpirun, and writing its JSON and plot."""
import json
import os
import sys

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

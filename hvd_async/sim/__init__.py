"""A deterministic discrete-event simulator of the training job: many workers on one core, virtual time.

``hvd-async simulate --algo asgd --workers 64 --delay-dist pareto ...`` or, in-process,
``hvd_async.sim.simulate(["--algo", "asgd", "--workers", "64"])`` returns the metrics record of
``hvd-async train`` with simulated times (``"time_base": "simulated"``). The strategies, rules and
server programs are the real ones, and so are the transports: they run over the simulator's MPI
(:mod:`.mpi`: memory instead of windows and messages) and Horovod (:mod:`.horovod`), with the
parameter servers' real hosts on memory (:mod:`.windows`), on a virtual clock (:mod:`.clock`) with
per-worker compute times (:mod:`.delays`). The same seed gives the same record, byte for byte.
"""


def simulate(args) -> dict:
    """Run one simulated job; ``args`` is an argv list or an ``argparse.Namespace`` (missing options
    take their defaults). Returns the metrics record (also written to ``--metrics-out``). Raises
    ``ConfigError`` on a bad option and ``hvd_async.job.train.TrainingStopped`` after ``--max-nonfinite``
    non-finite gradients in a row (as ``hvd-async train`` stops)."""
    from .runner import simulate as _simulate

    return _simulate(args)


def main(argv=None) -> int:
    """``hvd-async simulate``: returns the exit status (2 on a bad option, 3 on a streak of non-finite
    gradients, each with one line saying why)."""
    from .runner import main as _main

    return _main(argv)

"""``hvd-async simulate``: parse, check, run the simulated job, print the result (``python -m hvd_async.sim.runner``)."""
import argparse
import sys
from typing import List, Optional, Tuple, Union

from ..job.config import ConfigError
from ..job.jobspec import JobSpec
from . import options


def described(args: Union[List[str], argparse.Namespace]) -> Tuple[JobSpec, options.SimOptions]:
    """The job and the simulator's options from an argv list or a Namespace of some options (the
    others take their defaults), checked."""
    if isinstance(args, argparse.Namespace):
        full = vars(options.build_parser().parse_args([]))
        full.update(vars(args))
        return options.check(argparse.Namespace(**full))
    return options.check(options.parse(list(args)))


def simulate(args: Union[List[str], argparse.Namespace]) -> dict:
    """See :func:`hvd_async.sim.simulate`. Bad options raise ConfigError (one line)."""
    return run(*described(args))


def run(spec: JobSpec, sim: options.SimOptions) -> dict:
    """Simulate the described job; returns its metrics record."""
    import torch

    from .. import data
    from .job import run_job

    job = spec.job
    splits = data.for_evaluation(data.load_dataset(job.dataset, job.data_dir, seed=job.seed,
                                                   image_size=job.image_size), job.dataset, job.eval_on)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core, and the same kernels on every run
    try:
        return run_job(spec, sim, splits)
    finally:
        torch.set_num_threads(threads)


def main(argv: Optional[List[str]] = None) -> int:
    from ..data import DataError
    from ..models import ModelError
    from ..job.job_process import TrainingStopped

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        spec, sim = described(argv)
        record = run(spec, sim)
    except (ConfigError, DataError, ModelError) as exc:
        print(f"hvd-async simulate: error: {exc}", file=sys.stderr)
        return 2
    except TrainingStopped as exc:  # as hvd-async train: exit 3
        print(f"hvd-async simulate: error: {exc}", file=sys.stderr)
        return 3
    from ..metrics import print_result

    print_result(spec, record, simulated=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

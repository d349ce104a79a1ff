"""The training job's description: what ``hvd-async train`` and ``hvd-async simulate`` build once from
their flags and ``--config`` file, validate once, and hand to the job.

:class:`JobOptions` declares the job's own options the way an algorithm declares its options
(:func:`hvd_async.options.option`): the parser's flags, the YAML keys, the CLI reference and the range
checks all come from its fields. :class:`JobSpec` holds the parts the job's modules take: the
algorithm (:class:`JobAlgorithm`: resolved from the registry once, with the options its flags set), the
job's options and the cluster's layout.
"""
import dataclasses
import functools
import math
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Type

from .. import registry
from ..data import DATASETS, EVAL_SPLITS, FILE_DATASETS
from ..delays import DEFAULT_SHAPE, DISTRIBUTIONS, check_shape
from ..models import MODELS
from ..options import option
from ..progress import LINE_EVERY, MODES as PROGRESS_MODES

if TYPE_CHECKING:
    from ..algorithms.algorithm import Algorithm

MAX_SEED = 2 ** 32 - 1  # numpy's and scikit-learn's seeds are 32-bit

# Where the job's defaults (chosen on digits) do not suit a dataset: options that --dataset NAME sets
# unless a flag or the --config file gives them, each chosen for ssgd on the dataset's validation split.
DATASET_DEFAULTS = {
    # the best rate of a sweep on the validation split (the guide's Fashion-MNIST section has it)
    "fashion-mnist": {"model": "lenet", "lr": 0.02},
}


def _per_dataset(name: str) -> str:
    """The help's note of the datasets whose own default of option ``name`` replaces the one shown."""
    own = [f"{dataset}: {values[name]}" for dataset, values in DATASET_DEFAULTS.items() if name in values]
    return f" ({'; '.join(own)} by default)" if own else ""


def parse_stragglers(specs: List[str]) -> Dict[int, float]:
    """``--straggler``'s WORKER=FACTOR forms as worker -> factor (a later form of one worker wins)."""
    out = {}
    for spec in specs:
        worker, sep, factor = str(spec).partition("=")
        try:
            worker_i, factor_f = int(worker), float(factor)
        except ValueError:
            raise ValueError(f"--straggler {spec!r} must be WORKER=FACTOR, e.g. 2=3") from None
        if not sep or not factor_f >= 1.0:
            raise ValueError(f"--straggler {spec!r}: FACTOR must be >= 1 (how many times longer "
                             f"that worker's step takes)")
        out[worker_i] = factor_f
    return out


@dataclasses.dataclass
class JobOptions:
    """The options of the reference job itself (not of its algorithm, nor how many processes run it)."""

    dataset: str = option("digits", f"one of: {', '.join(DATASETS)}; digits, synthetic and teacher need no "
                          f"files, fashion-mnist Debian's package dataset-fashion-mnist",
                          flag="--dataset", metavar="NAME")
    data_dir: Optional[str] = option(None, "folder with the standard files of mnist, cifar10 or imagenet "
                                     "(fashion-mnist: instead of Debian's dataset-fashion-mnist)",
                                     flag="--data-dir", metavar="DIR")
    eval_on: str = option("test", "the split scored after each epoch: test (training on the whole training "
                          "split; for final tables), or val (training on it less a validation split carved "
                          "from it once, the same for every --seed; for choosing hyperparameters and defaults)",
                          flag="--eval-on", choices=EVAL_SPLITS)
    image_size: Optional[int] = option(None, "resize images to this size (synthetic: 32, imagenet: 224 by "
                                       "default)", flag="--image-size")
    model: str = option("mlp", f"one of: {', '.join(MODELS)}{_per_dataset('model')}", flag="--model",
                        metavar="NAME")
    device: str = option("cpu", "train on the CPU, or on one GPU per worker (local rank modulo the GPUs "
                         "visible); ssgd and hpsgd then reduce on the GPU (Horovod's NCCL operations where "
                         "built); auto: cuda where the process sees a GPU, else cpu (the launch recipes' "
                         "choice)", flag="--device", choices=("cpu", "cuda", "auto"))
    epochs: int = option(10, "passes over the training split", flag="--epochs")
    batch_size: int = option(32, "samples per step on each worker", flag="--batch-size")
    lr: float = option(0.1, f"learning rate{_per_dataset('lr')}", flag="--lr")
    momentum: float = option(0.9, "SGD momentum of the local optimizer", flag="--momentum")
    weight_decay: float = option(0.0, "SGD weight decay", flag="--weight-decay")
    seed: int = option(0, "seed of the model's initialisation and the sampling order (and of synthetic's and "
                       "teacher's images); the train/validation/test splits are fixed", flag="--seed")
    logdir: Optional[str] = option(None, "write TensorBoard event files here", flag="--logdir", metavar="DIR")
    metrics_out: Optional[str] = option(None, "write the run's metrics JSON here", flag="--metrics-out",
                                        metavar="PATH")
    straggler: List[str] = option([], "make that worker's device time (--compute-ms) FACTOR times as long; "
                                  "its real forward and backward are not stretched (repeatable; needs "
                                  "--compute-ms > 0; workers are numbered 0..workers-1, not by MPI rank)",
                                  flag="--straggler", action="append", metavar="WORKER=FACTOR")
    compute_ms: float = option(0.0, "emulated accelerator: device time slept before each step's real "
                               "forward and backward on every worker (0: none; the CPU's own time only)",
                               flag="--compute-ms", metavar="MS")
    delay_dist: str = option("constant", "distribution of each step's device time around --compute-ms (its "
                             "mean), drawn per worker from --seed: transient stragglers", flag="--delay-dist",
                             choices=DISTRIBUTIONS)
    delay_shape: Optional[float] = option(
        None, f"the distribution's shape: uniform half-width as a fraction of the mean (default "
        f"{DEFAULT_SHAPE['uniform']}), lognormal sigma ({DEFAULT_SHAPE['lognormal']}), pareto alpha > 1 "
        f"({DEFAULT_SHAPE['pareto']}); constant and exponential take none", flag="--delay-shape", metavar="X")
    checkpoint_dir: Optional[str] = option(
        None, "write checkpoints here (ckpt-<updates>.pt and the folder of parts it names: each worker's "
        "model, optimizer, algorithm state, batch position and RNG states, each server's shard; every rank "
        "must reach DIR)", flag="--checkpoint-dir", metavar="DIR")
    checkpoint_every: str = option(
        "1", "checkpoint every N epochs (N or Nepochs) or every N steps (Nsteps; for parameter-server "
        "algorithms a step is one update of the global weights); the last epoch is always saved",
        flag="--checkpoint-every", metavar="N[epochs|steps]")
    keep_checkpoints: int = option(2, "keep the K newest checkpoints in --checkpoint-dir",
                                   flag="--keep-checkpoints", metavar="K")
    resume: bool = option(False, "resume from the newest checkpoint in --checkpoint-dir (the same algorithm, "
                          "workers, servers, data, model, batch size and seed)", flag="--resume",
                          action="store_true")
    deterministic: bool = option(
        False, "{repeatable}, od-sgd --od-exchange allreduce: reduce tensor by tensor (Horovod fusion off) so that sums "
        "run in the same order in every run and a resumed run repeats a straight one bit for bit; slower "
        "on large models", flag="--deterministic", action="store_true")
    worker_timeout: Optional[float] = option(
        None, "a worker that makes no progress for this long is named: parameter-server algorithms go on "
        "without it (the job then ends with exit status 4 after writing its results); the others stop "
        "with exit status 5 (which --max-restarts relaunches)", flag="--worker-timeout", metavar="SECONDS")
    server_threads: Optional[int] = option(
        None, "torch threads each parameter-server rank runs its rule on (default: the rank's share of its "
        "node's cores, as every rank's; a server on a node of its own can take them all)",
        flag="--server-threads", metavar="N")
    max_nonfinite: int = option(
        20, "stop (with a checkpoint of the last good state) after K gradients in a row held NaN or infinity "
        "on a worker; none is ever applied (0: never stop)", flag="--max-nonfinite", metavar="K")
    evals_per_epoch: int = option(
        1, "evaluate the held-out split at K evenly spaced points of each epoch (the last at its end); "
        "their time is kept off the training clock (train_seconds) and recorded, and time to target is "
        "read at them (the metrics' evaluations)", flag="--evals-per-epoch", metavar="K")
    progress: str = option(
        "auto", f"progress inside an epoch on worker 0: auto (a bar on a terminal, elsewhere a line every "
        f"{LINE_EVERY:g} s: samples, samples/s, loss), bar, or epochs (off: only the per-epoch lines)",
        flag="--progress", choices=PROGRESS_MODES)

    def __post_init__(self):
        for name, choices in (("dataset", DATASETS), ("model", MODELS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of: {', '.join(choices)}")
        for name in ("epochs", "batch_size", "keep_checkpoints", "evals_per_epoch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("momentum", "weight_decay", "compute_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "weight_decay", "compute_ms"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if not self.momentum < 1:
            raise ValueError(f"momentum must be < 1, got {self.momentum}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in 0..{MAX_SEED} (2**32 - 1), got {self.seed}")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {self.image_size}")
        if self.worker_timeout is not None and not 0 < self.worker_timeout < math.inf:
            raise ValueError(f"worker_timeout must be a number of seconds > 0, got {self.worker_timeout}")
        if self.server_threads is not None and self.server_threads < 1:
            raise ValueError(f"server_threads must be >= 1 (or unset: the rank's share of its node's cores), "
                             f"got {self.server_threads}")
        if self.max_nonfinite < 0:
            raise ValueError(f"max_nonfinite must be >= 0 (0: never stop), got {self.max_nonfinite}")
        self._check_files()
        if self.stragglers and not self.compute_ms > 0:  # (which workers exist: the layout's)
            raise ValueError(f"straggler {' '.join(self.straggler)} stretches the emulated device time, and "
                             f"--compute-ms is {self.compute_ms:g}; give --compute-ms MS > 0 (e.g. 20)")
        self.delay_shape = check_shape(self.delay_dist, self.delay_shape)
        if self.delay_dist != "constant" and not self.compute_ms > 0:
            raise ValueError(f"delay_dist {self.delay_dist} draws each step's device time around --compute-ms, "
                             f"and --compute-ms is {self.compute_ms:g}; give --compute-ms MS > 0 (e.g. 20)")

    def _check_files(self) -> None:
        from .jobstate import parse_every

        parse_every(self.checkpoint_every)
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume needs --checkpoint-dir (the folder the checkpoints are in)")
        if self.checkpoint_dir and os.path.exists(self.checkpoint_dir) and not os.path.isdir(self.checkpoint_dir):
            raise ValueError(f"checkpoint_dir {self.checkpoint_dir} exists and is not a folder")
        if self.dataset in FILE_DATASETS:
            if not self.data_dir:
                raise ValueError(f"--dataset {self.dataset} needs --data-dir (a folder with its standard "
                                 f"files); digits, synthetic and teacher need none")
            if not os.path.isdir(self.data_dir):
                raise ValueError(f"data_dir {self.data_dir} does not exist or is not a folder")
        if self.logdir and os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise ValueError(f"logdir {self.logdir} exists and is not a folder; give a folder for the "
                             f"TensorBoard files")
        if self.metrics_out and os.path.isdir(self.metrics_out):
            raise ValueError(f"metrics_out {self.metrics_out} is a folder; give a file path, e.g. "
                             f"{os.path.join(self.metrics_out, 'metrics.json')}")

    @functools.cached_property
    def stragglers(self) -> Dict[int, float]:
        """``straggler`` as worker -> factor, parsed once (by the check, when the options are built)."""
        return parse_stragglers(self.straggler)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The job's processes: ``servers`` parameter-server ranks and ``workers`` training ranks
    (``workers`` is None where the launcher is not told how many processes run)."""

    servers: int
    workers: Optional[int]

    @property
    def world_size(self) -> Optional[int]:
        return None if self.workers is None else self.workers + self.servers


@dataclasses.dataclass(frozen=True)
class JobAlgorithm:
    """The job's algorithm, looked up in the registry once, where the flags are checked: its row (name
    and capabilities), its declaration (options class and hooks) and the keyword options the flags set
    (those left out take the declaration's defaults)."""

    row: registry.AlgorithmInfo
    declaration: Type["Algorithm"]
    given: Dict[str, Any]

    @classmethod
    def named(cls, name: str, given: Optional[Dict[str, Any]] = None) -> "JobAlgorithm":
        """The registered algorithm ``name`` with these options (``ValueError``: no such algorithm)."""
        return cls(registry.get(name), registry.algorithm(name), dict(given or {}))

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def uses_servers(self) -> bool:
        """Whether it needs server ranks with these options (the declaration decides, from the row)."""
        return self.declaration.uses_servers(self.given, self.row.uses_servers)


@dataclasses.dataclass
class JobSpec:
    """One validated job: the algorithm, the job's options and the cluster's layout."""

    algorithm: JobAlgorithm
    job: JobOptions
    layout: Layout

    @property
    def algo(self) -> str:
        """The algorithm's registry name."""
        return self.algorithm.name

    def meta(self, parameters: Optional[Dict[str, List[int]]] = None) -> Dict[str, Any]:
        """What a checkpoint's ``meta`` names of the job: a resume with other values is refused.
        ``parameters`` (name -> shape) only where the model is built."""
        job = self.job
        meta: Dict[str, Any] = {"algorithm": self.algo, "workers": self.layout.workers,
                                "servers": self.layout.servers, "dataset": job.dataset, "model": job.model,
                                "batch_size": job.batch_size, "seed": job.seed}
        if parameters is not None:
            meta["parameters"] = parameters
        return meta

    def info(self) -> Dict[str, Any]:
        """The job's values at the head of its metrics record."""
        job = self.job
        return {"algorithm": self.algo, "world_size": self.layout.world_size, "workers": self.layout.workers,
                "servers": self.layout.servers, "dataset": job.dataset, "evaluated_on": job.eval_on,
                "model": job.model, "epochs": job.epochs, "batch_size": job.batch_size, "lr": job.lr,
                "seed": job.seed, "compute_ms": job.compute_ms, "delay_dist": job.delay_dist,
                "delay_shape": job.delay_shape, "evals_per_epoch": job.evals_per_epoch,
                "stragglers": {str(k): v for k, v in job.stragglers.items()}}

"""The reference training job: ``python -m hvd_async.job.train`` on every MPI rank.

Runs as-is under ``mpirun``, ``horovodrun`` or ``hvd-async train`` (which launches it). Server
ranks serve; workers train on their shard of the data, evaluate the model on the held-out split
after each epoch, and the first worker prints the result, writes TensorBoard scalars (``--logdir``)
and the metrics JSON (``--metrics-out``). This module builds what a real worker trains with and its
host (wall clock, injected compute, ``--worker-timeout``); the loop is
:mod:`hvd_async.job.worker_loop`, shared with the simulator; the process around it (options, MPI and
Horovod start, servers, exit statuses) is :mod:`hvd_async.job.job_process`.
"""
import os
import time
from typing import Optional

from ..delays import DelayModel
from ..progress import progress_mode
from .job_process import TrainingStopped, Watchdog as _Watchdog, device as _device, say as _say
from .launcher import LAUNCHED_AT
from .worker_loop import NONFINITE_CHECK_EVERY, Host, WorkerLoop

__all__ = ["NONFINITE_CHECK_EVERY", "TrainingStopped", "main", "train_worker"]


class _Pacer:
    """The emulated accelerator's time: before each step, the device time of worker ``worker`` drawn
    around ``--compute-ms`` (``--delay-dist``; the simulator draws the same, :mod:`hvd_async.delays`)
    times its straggler factor, slept. Only that device time is stretched; the real forward and
    backward on the CPU are not (on shared cores their time is the other processes' as much as this
    one's)."""

    def __init__(self, job, worker: int):
        self.delay = DelayModel.of_job(job, worker, job.stragglers.get(worker, 1.0)) if job.compute_ms > 0 else None

    def before_step(self, scale: float) -> None:
        # ``scale``: this batch's size over the nominal one (dbs-asgd's batches vary)
        if self.delay is not None:
            time.sleep(self.delay.draw(scale))


class _JobHost(Host):
    """A real worker: wall-clock time, its device time slept (:class:`_Pacer`), and
    ``--worker-timeout``'s watchdog and dropping of stalled workers."""

    def __init__(self, job, comm, rank: int):
        from mpi4py import MPI

        super().__init__(MPI.MAX)
        self.timeout = job.worker_timeout
        self.pacer = _Pacer(job, rank)
        self.live = list(range(comm.size))  # worker numbers still in the workers' communicator
        self.watchdog: Optional[_Watchdog] = None
        self.first_step_at: Optional[float] = None

    def start(self, loop: WorkerLoop) -> None:
        self.first_step_at = time.time()
        if self.timeout:
            self.watchdog = _Watchdog(self.timeout, loop.comm, list(self.live))

    def before_step(self, scale: float) -> float:
        self.pacer.before_step(scale)
        return 0.0  # the sleep is not counted as compute (compute_ms_per_step: the real forward/backward)

    def beat(self) -> None:
        if self.watchdog is not None:
            self.watchdog.beat()

    def after_segment(self, loop: WorkerLoop) -> None:
        """``--worker-timeout``: name a worker that stopped making progress instead of hanging on it;
        parameter-server jobs go on without it, the others stop (:class:`WorkerStalled`)."""
        from .jobstate import WorkerStalled, rendezvous

        timeout = self.timeout
        if not timeout:
            return
        missing = rendezvous(loop.comm, timeout)
        if not missing:
            return
        gone = [self.live[r] for r in missing]
        transport = loop.opt.strategy.transport
        if not transport.can_drop_workers or 0 in gone:
            stalled = WorkerStalled(gone, timeout, "stopping the job" + (
                " (worker 0 writes the reports)" if transport.can_drop_workers else ""))
            stalled.printer = self.live[loop.rank] == min(w for w in self.live if w not in gone)
            raise stalled
        comm = loop.comm = loop.comm.Create_group(loop.comm.Get_group().Excl(missing))
        self.live = [w for w in self.live if w not in gone]
        loop.rank, loop.workers = comm.rank, comm.size
        transport.drop_workers(gone, comm, tell_servers=loop.rank == 0)
        if loop.saver is not None:
            loop.saver.comm = comm
        loop.dropped.extend(gone)
        if loop.reporter:
            _say(f"worker(s) {', '.join(map(str, gone))} made no progress for {timeout:g} s "
                 f"(--worker-timeout): going on with {loop.workers} worker(s)")

    def finish(self, loop: WorkerLoop) -> dict:
        if self.watchdog is not None:
            self.watchdog.stop(free=not loop.dropped)
        return {**super().finish(loop), "seconds_to_first_step": seconds_since_launch(self.first_step_at)}


def seconds_since_launch(at: Optional[float]):
    """Seconds from the ``hvd-async train`` command's launch of this run of the job (mpirun started,
    ranks not yet) to wall-clock time ``at``, or None outside that launcher. ``hvd-async train`` puts
    the launch time in ``HVD_ASYNC_LAUNCHED_AT`` (time.time(), each restart anew); across hosts it
    includes the clocks' offset."""
    launched = os.environ.get(LAUNCHED_AT)
    try:
        return None if launched is None or at is None else round(at - float(launched), 3)
    except ValueError:
        return None


def job_sgd(spec, params, device):
    """The job's SGD. ssgd on CUDA gets torch's fused kernel (``fused=True``), which skips a
    non-finite step itself, so ssgd's guard reads nothing on the host (docs/reliability.md; the
    guide's "Running on a cluster" has the H100 figures); elsewhere the plain one."""
    import torch


    job = spec.job
    fused = {"fused": True} if device.type == "cuda" and spec.algorithm.declaration.fused_sgd else {}
    return torch.optim.SGD(params, lr=job.lr, momentum=job.momentum, weight_decay=job.weight_decay, **fused)


def _build(spec) -> WorkerLoop:
    """What a worker builds: the data (read on worker 0, broadcast), the model (broadcast), the wrapped
    optimizer, the metrics and checkpoints; then the loop (which resumes from ``--resume``)."""
    import horovod.torch as hvd
    import torch

    import hvd_async as ha
    from .. import data, models
    from .jobstate import JobCheckpoints
    from ..metrics import RunMetrics

    rank, job = ha.rank(), spec.job
    comm = ha.worker_comm()
    torch.manual_seed(job.seed)
    splits = data.for_evaluation(data.load_dataset_on(comm, job.dataset, job.data_dir, seed=job.seed,
                                                      image_size=job.image_size), job.dataset, job.eval_on)
    model = models.build_model(job.model, splits.input_shape, splits.num_classes)
    device = _device(job.device, ha)
    model.to(device)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = ha.DistributedOptimizer(job_sgd(spec, model.parameters(), device), named_parameters=model.named_parameters(),
                                  algorithm=spec.algo, **spec.algorithm.given)
    opt.begin()  # parameters were broadcast above: start the exchange now, not at step 1
    host = _JobHost(job, comm, rank)
    metrics = RunMetrics(spec.info(), logdir=job.logdir, reporter=rank == 0)
    saver = None
    if job.checkpoint_dir:
        saver = JobCheckpoints(job.checkpoint_dir, keep=job.keep_checkpoints, comm=comm, meta=spec.meta(
            {name: list(p.shape) for name, p in model.named_parameters()}))
    return WorkerLoop(spec, model=model, opt=opt, splits=splits, comm=comm, host=host, metrics=metrics,
                      servers=spec.layout.servers > 0, device=device, saver=saver,
                      progress=progress_mode(job.progress, rank == 0))


def train_worker(spec) -> dict:
    """One worker's training loop of the described job (a :class:`~hvd_async.job.jobspec.JobSpec`);
    returns the metrics record (complete on worker 0)."""
    return _build(spec).run()


def main(argv=None) -> int:
    """The job on this rank (see :mod:`hvd_async.job.job_process`): the exit status."""
    from .job_process import main as run

    return run(argv, train_worker)


if __name__ == "__main__":
    from .job_process import exit_process

    exit_process(main())

"""One worker's training loop, the same for the training job (:mod:`hvd_async.job.train`) and the
simulator (:mod:`hvd_async.sim.job`): its epochs of steps, the workers' agreement on why they left
them, and checkpoints; what it reports of them (the epoch's figures, the evaluations, the final
metrics record) is :mod:`hvd_async.job.epoch_report`'s.

What differs between a real worker and a simulated one is handed in as a :class:`Host`: the clock
(wall or virtual), the compute time injected before each step (a sleep, or the virtual clock moved
on), the reduction op for a maximum over the communicator, a liveness beat and what to do about a
stalled worker (``--worker-timeout``), and what the final record adds (its wall time, the
simulator's settings). What an algorithm needs from the loop is asked of its strategy (progress,
``batch_cursor()``, ``after_evaluation()``, ``skipped_nonfinite``), never decided by its name.
"""
import logging
import time
from typing import Any, Dict, List

import numpy as np

from .config import ConfigError
from .epoch_report import EpochReport
from .job_process import TrainingStopped, say

logger = logging.getLogger(__name__)
NONFINITE_CHECK_EVERY = 10  # synchronous algorithms agree on a non-finite streak every so many steps


class Host:
    """A real worker's side of the loop (the simulator's overrides it).

    Args:
        max_op: the communicator's reduction op for a maximum (``MPI.MAX`` for mpi4py).
    """

    seconds = "s"  # how an epoch line names its times
    server_time = True  # whether the servers' time per push is measured (not in the simulator)
    can_checkpoint = True

    def __init__(self, max_op):
        self.MAX = max_op

    def clock(self) -> float:
        return time.perf_counter()

    def before_step(self, scale: float) -> float:
        """The device time injected before a step of ``scale`` nominal batches; returns the seconds
        of it to count as compute."""
        return 0.0

    def start(self, loop: "WorkerLoop") -> None:
        """The loop begins its epochs (after any resume)."""

    def beat(self) -> None:
        """The loop moved on (the stall watchdog's heartbeat)."""

    def after_segment(self, loop: "WorkerLoop") -> None:
        """Every worker left its loop; before the global weights are loaded (``--worker-timeout``)."""

    def finish(self, loop: "WorkerLoop") -> dict:
        """After ``opt.close()`` on every worker (collective): what the final record adds or overrides.
        Here the wall time and each worker process's CPU time (user and system, ``os.times``; the
        server ranks' is not counted): ``cpu_utilisation`` is their sum over worker 0's wall time
        (since a resume, for a resumed run), in cores kept busy. That counts MPI's polling while a
        worker waits in a collective, which on a cluster spins on the waiting worker's own cores.
        Whether the cores held the work back is ``worker_core_wait``: the share of each worker's
        training time that its device time and compute waited for a core (``core_wait``, their
        largest)."""
        wall = round(loop.metrics.elapsed(), 4)
        cpu, since = loop.metrics.cpu_use()
        acc = loop.acc
        gathered = loop.comm.gather((cpu, acc.core_wait / max(acc.train_seconds, 1e-9)), root=0)
        if not loop.reporter:
            return {"wall_seconds": wall}
        waits = [round(w, 4) for _, w in gathered]
        return {"wall_seconds": wall, "worker_cpu_seconds": [round(c, 3) for c, _ in gathered],
                "cpu_utilisation": round(sum(c for c, _ in gathered) / max(since, 1e-9), 3),
                "worker_core_wait": waits, "core_wait": max(waits)}


class Counters:
    """One worker's running counts; a checkpoint holds them, so a resumed epoch reports as a whole one."""

    def __init__(self):
        self.steps = self.samples = self.dropped_samples = self.streak = self.skipped_seen = 0
        self.train_seconds = self.wait_total = 0.0
        self.core_wait = 0.0  # seconds this worker's device time and compute waited for a core (RunQueue)
        self.new_epoch()

    def new_epoch(self) -> None:
        self.epoch_steps = self.epoch_samples = self.epoch_dropped = 0  # (dropped: samples of gradients not applied)
        self.epoch_evals = 0  # --evals-per-epoch: the points inside this epoch evaluated so far
        self.epoch_wait = self.epoch_compute = self.epoch_seconds = self.loss_sum = 0.0


class WorkerLoop:
    """One worker's epochs (:meth:`run`): train until this worker has a reason to stop
    (:meth:`_train`), let the host deal with stalled workers, ``load_global_model()``, agree on why the
    workers stopped (:meth:`_agree`), then stop on non-finite gradients, report the epoch
    (:class:`~hvd_async.job.epoch_report.EpochReport`) and write a checkpoint when one is due
    (:meth:`_checkpoint_due`).

    Args:
        spec: the job (a :class:`~hvd_async.job.jobspec.JobSpec`, ``hvd-async train``'s or the simulator's).
        model, opt, splits: the model, its :class:`~hvd_async.DistributedOptimizer`, the data.
        comm: the workers' communicator (mpi4py's or the simulator's): ``allreduce`` and ``gather``.
        host: see :class:`Host`.
        metrics: a :class:`~hvd_async.metrics.RunMetrics`.
        servers: whether the algorithm runs on parameter servers (epochs end on their progress).
        device: where batches go (None: where the data is).
        saver: a :class:`~hvd_async.job.jobstate.JobCheckpoints`, or None.
        progress: worker 0's display inside an epoch, ``"bar"`` or ``"lines"`` (:mod:`hvd_async.progress`),
            or None.
    """

    def __init__(self, spec, *, model, opt, splits, comm, host: Host, metrics, servers: bool, device=None,
                 saver=None, progress=None):
        import torch

        from .jobstate import WorkerBatches, parse_every

        self.spec, self.options = spec, spec.job  # (self.job: the record of the job's progress)
        self.model, self.opt, self.splits, self.host = model, opt, splits, host
        options = spec.job
        self.comm, self.rank, self.workers = comm, comm.rank, comm.size
        self.metrics, self.device, self.saver, self.uses_servers = metrics, device, saver, servers
        self.reporter = self.rank == 0
        self.source = WorkerBatches(len(splits.train), options.batch_size, rank=self.rank, workers=self.workers,
                                    seed=options.seed, strategy=opt.strategy, servers=servers,
                                    fetch_add=opt.strategy.batch_cursor())
        self.steps_per_epoch = (-(-self.source.global_steps // self.workers) if servers
                                else self.source.batches.per_epoch)  # this worker's share (the bar's total)
        self.progress = None
        if self.reporter and progress:
            from ..progress import EpochProgress

            self.progress = EpochProgress(progress, share=self.steps_per_epoch, epochs=options.epochs,
                                          desc=f"{spec.algo} x{self.workers}")
        self.acc = Counters()  # this worker's counters (a checkpoint holds them)
        self.job: Dict[str, Any] = {"epoch": 1, "history": [], "elapsed": 0.0, "staleness_seen": [],
                                    "next_checkpoint": None}
        self.every, self.unit = parse_every(options.checkpoint_every)
        self.job["next_checkpoint"] = self.every
        if options.resume:
            self._resume()
        self.report = EpochReport(spec, opt=opt, metrics=metrics, host=host, model=model, test=splits.test,
                                  device=device, servers=servers, batch_sizes=self.source.shared is not None,
                                  progress=self.progress, staleness_seen=self.job.get("staleness_seen", []))
        self.dropped: List[int] = []  # workers a --worker-timeout dropped
        self.loss_sum = torch.zeros((), device=device)  # (summed where the losses are: no host read a step)

    def _count(self) -> int:
        """What ``--checkpoint-every N steps`` counts: the servers' updates, or this worker's steps."""
        return self.opt.progress() if self.uses_servers else self.acc.steps

    def _resume(self) -> None:
        from .. import checkpoint

        path, part, saved_job, folder = self.saver.restore()
        self.model.load_state_dict(part["model"])
        self.opt.load_state_dict(part["optimizer"])  # (a checkpoint of an earlier version: both parts)
        if "algorithm" in part:
            self.opt.load_algorithm_state_dict(part["algorithm"], shard_dir=folder)
        self.source.batches.load_state_dict(part["batches"])
        checkpoint.set_rng_state(part["rng"])
        self.acc.__dict__.update(part["counters"])
        self.source.drawn = part["drawn"]
        self.source.last_epoch = part.get("last_epoch")
        job = self.job = (saved_job if self.reporter else
                          {"epoch": saved_job["epoch"], "next_checkpoint": saved_job["next_checkpoint"]})
        if self.reporter:
            self.metrics.history[:] = job["history"]
            self.metrics.evaluations[:] = job.get("evaluations", [])
            self.metrics.start -= job["elapsed"]
            say(f"resumed from {path}: epoch {job['epoch']}, {self.opt.progress()} updates so far")
        job["next_checkpoint"] = (self._count() // self.every + 1) * self.every
        if job["epoch"] > self.options.epochs:
            raise ConfigError(f"--resume: checkpoint {path} has finished {job['epoch'] - 1} epoch(s) and "
                              f"--epochs is {self.options.epochs}: give a larger --epochs to train on")

    def save_checkpoint(self, progress: int) -> str:
        """Collective: every worker's part and worker 0's job record, after opt.load_global_model()."""
        from .. import checkpoint

        folder = self.saver.parts_dir(progress)

        def part():  # the servers write their shards into the folder as worker 0 takes the state
            return {"model": self.model.state_dict(), "algorithm": self.opt.algorithm_state_dict(shard_dir=folder),
                    "optimizer": self.opt.state_dict(),
                    "batches": self.source.batches.state_dict(), "rng": checkpoint.rng_state(),
                    "counters": dict(vars(self.acc)), "drawn": self.source.drawn,
                    "last_epoch": self.source.last_epoch}

        if self.reporter:
            self.job.update(history=self.metrics.history, evaluations=self.metrics.evaluations,
                            elapsed=self.metrics.elapsed(),
                            staleness_seen=self.report.staleness_seen.tolist())
        return self.saver.save(progress, folder, part, self.job if self.reporter else None)

    def _next_batch(self, epoch: int):
        """The next (x, y) of this epoch, or None when the epoch is over for this worker."""
        from torch.utils.data import default_collate

        indices = self.source.next(epoch)
        if indices is None:
            return None
        x, y = default_collate([self.splits.train[i] for i in indices])
        if self.device is None:
            return x, y
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _pause_reason(self, epoch: int):
        """Why this worker leaves its loop before the epoch ends ("checkpoint", "nonfinite", "evaluate")
        or None.

        With parameter servers each worker decides alone (the others join at their own pause or epoch
        end: nobody waits inside an epoch; a worker whose every push is refused would never see its
        epoch end); synchronous algorithms decide at the same steps, together. An evaluation point is
        a fraction of the epoch as :meth:`_epoch_fraction` reads it, a count every worker sees grow
        alike (the servers' pushes, the shared cursor, or each worker's own steps of equal shares):
        every worker reaches it, so none waits forever for another's pause.
        """
        acc, limit = self.acc, self.options.max_nonfinite
        due = self.saver is not None and self.unit == "steps" and self._count() >= self.job["next_checkpoint"]
        evaluate = "evaluate" if self._eval_point(epoch) > acc.epoch_evals else None
        if self.uses_servers:
            if limit and acc.streak >= limit:
                return "nonfinite"
            return "checkpoint" if due else evaluate
        reason = "checkpoint" if due else evaluate
        if limit and acc.steps % NONFINITE_CHECK_EVERY == 0 and self.comm.allreduce(int(acc.streak >= limit),
                                                                                     op=self.host.MAX):
            reason = "nonfinite"
        return reason

    def _train(self, epoch: int) -> str:
        """Train until this worker has a reason to leave its loop: "end" of the epoch, "checkpoint"
        or "nonfinite". Times are on the host's clock; the host's injected compute counts as compute."""
        import torch
        import torch.nn.functional as F

        from ..metrics import RunQueue

        acc, opt, progress, host, clock = self.acc, self.opt, self.progress, self.host, self.host.clock
        run_queue = RunQueue()  # this thread's (a simulated worker may be a thread of its own)
        segment_start = clock()
        if progress is not None:
            progress.start(epoch, acc.epoch_samples)
        self.loss_sum.fill_(acc.loss_sum)
        reason = None
        while reason is None:
            batch = self._next_batch(epoch)
            if batch is None:
                reason = "end"
                break
            x, y = batch
            queued = run_queue.seconds()
            injected = host.before_step(len(y) / self.options.batch_size)
            t0 = clock()
            loss = F.cross_entropy(self.model(x), y)
            opt.zero_grad()
            loss.backward()
            t1 = clock()
            acc.core_wait += run_queue.seconds() - queued
            dropped = opt.strategy.dropped_gradients
            opt.step(loss=loss.detach())  # time in here: waiting for the exchange, then the local update
            t2 = clock()
            acc.epoch_compute += injected + (t1 - t0)
            acc.epoch_wait += t2 - t1
            if bool(torch.isfinite(loss)):
                self.loss_sum += loss.detach()
            acc.steps += 1
            acc.epoch_steps += 1
            acc.epoch_samples += len(y)
            if opt.strategy.dropped_gradients != dropped:  # computed, and not applied (backup-sgd's late ones)
                acc.epoch_dropped += len(y)
            skipped = opt.strategy.skipped_nonfinite
            acc.streak = acc.streak + 1 if skipped > acc.skipped_seen else 0
            acc.skipped_seen = skipped
            if progress is not None:
                progress.update(epoch, self._epoch_fraction(epoch), samples=acc.epoch_samples,
                                loss=lambda: float(self.loss_sum) / acc.epoch_steps)
            reason = self._pause_reason(epoch)
            host.beat()
        acc.epoch_seconds += clock() - segment_start
        acc.loss_sum = float(self.loss_sum)
        if progress is not None and reason == "end":
            progress.update(epoch, 1.0, samples=acc.epoch_samples, loss=lambda: acc.loss_sum / max(1, acc.epoch_steps))
        return reason

    def _epoch_fraction(self, epoch: int) -> float:
        """How much of ``epoch`` the job has done as this worker sees it: its own steps of its share
        (synchronous algorithms), the shared cursor (dbs-asgd), or the servers' pushes this epoch (the
        other parameter-server algorithms, whose workers each draw at their own pace)."""
        source = self.source
        if not self.uses_servers:
            return self.acc.epoch_steps / max(1, source.batches.per_epoch)
        if source.shared is not None:
            return source.shared.claimed / source.shared.num_samples - (epoch - 1)
        return self.opt.progress() / source.global_steps - (epoch - 1)

    def _eval_point(self, epoch: int) -> int:
        """How many of ``--evals-per-epoch`` K's points inside ``epoch`` (at 1/K, 2/K, ... of it; its end
        is evaluated anyway) this worker has seen the job pass."""
        per_epoch = self.options.evals_per_epoch
        if per_epoch == 1:
            return 0
        fraction = self._epoch_fraction(epoch)
        return 0 if fraction >= 1.0 else min(per_epoch - 1, int(fraction * per_epoch))

    def _agree(self, reason: str):
        """The workers left their loops for their own reasons (asynchronous ones see progress at
        different times): from here on they agree. Returns (ended, pause, nonfinite, progress)."""
        flags = np.array([reason == "end", reason == "checkpoint", reason == "nonfinite"], dtype=np.int64)
        ended, pause, nonfinite = (bool(flag) for flag in self.comm.allreduce(flags) > 0)
        return ended, pause, nonfinite, self.comm.allreduce(self.opt.progress(), op=self.host.MAX)

    def _stop_nonfinite(self, epoch: int, progress: int) -> None:
        limit = self.options.max_nonfinite
        where = self.save_checkpoint(progress) if self.saver else None
        hint = "lower --lr"
        if self.host.can_checkpoint:
            hint = ((f"the last good state is in {where}" if where else
                     "no checkpoint was written (give --checkpoint-dir to keep one)")
                    + "; lower --lr or check the data, then --resume")
        raise TrainingStopped(f"stopped in epoch {epoch}: {limit} gradients in a row held NaN or infinity on a "
                              f"worker (--max-nonfinite {limit}); none was applied; {hint}")

    def _checkpoint_due(self, ended: bool, pause: bool, epoch: int, progress: int) -> bool:
        """After the agreement (``epoch``: the next one to train): whether to save now."""
        if self.saver is None:
            return False
        every, unit, count = self.every, self.unit, progress if self.uses_servers else self.acc.steps
        due = (pause or (ended and epoch > self.options.epochs)
               or (unit == "epochs" and ended and (epoch - 1) % every == 0)
               or (unit == "steps" and count >= self.job["next_checkpoint"]))
        if due:
            self.job["next_checkpoint"] = (count // every + 1) * every if unit == "steps" else None
        return due

    def run(self) -> dict:
        """The epochs; returns the metrics record (complete on worker 0)."""
        opt, host = self.opt, self.host
        host.start(self)
        epoch = self.job["epoch"]
        while epoch <= self.options.epochs:
            reason = self._train(epoch)
            host.after_segment(self)
            host.beat()
            # first thing after the loop: finish the exchange in flight; the parameter-server
            # algorithms tell the servers this worker stopped pushing (softsync must not wait for its
            # gradients); then every worker holds the global weights to evaluate (ssgd's already do)
            opt.load_global_model()
            ended, pause, nonfinite, progress = self._agree(reason)
            host.beat()
            if nonfinite:
                self._stop_nonfinite(epoch, progress)
            point = (0 if ended or self.options.evals_per_epoch == 1
                     else self.comm.allreduce(self._eval_point(epoch), op=host.MAX))
            if ended:
                self.report.end_epoch(self.comm, epoch, self.acc, self.loss_sum)
                self.acc.new_epoch()
                self.loss_sum.zero_()
                epoch += 1
                self.job["epoch"] = epoch
            elif point > self.acc.epoch_evals:  # the furthest point any worker passed: one evaluation
                self.acc.epoch_evals = point
                self.report.evaluate(self.comm, epoch, point / self.options.evals_per_epoch,
                                     self.acc.train_seconds + self.acc.epoch_seconds)
            if self._checkpoint_due(ended, pause, epoch, progress):
                host.beat()
                path = self.save_checkpoint(progress)
                host.beat()
                if self.reporter:
                    logger.info("checkpoint %s written", path)
            opt.strategy.after_evaluation()
        return self._finish()

    def _finish(self) -> dict:
        """Collective: close the optimizer; the final metrics record (complete on worker 0)."""
        if self.progress is not None:
            self.progress.close()
        totals = self.report.totals(self.comm, self.acc)
        self.opt.close()
        record = self.report.record(totals, self.acc, workers=self.workers, reporter=self.reporter,
                                    dropped_workers=self.dropped)
        record.update(self.host.finish(self))
        return self.report.finish(record)

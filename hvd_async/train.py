"""The reference training job: ``python -m hvd_async.train`` on every MPI rank.

Runs as-is under ``mpirun``, ``horovodrun`` or ``hvd-async train`` (which launches it). Server
ranks serve; workers train on their shard of the data, evaluate the model on the held-out split
after each epoch, and the first worker prints the result, writes TensorBoard scalars (``--logdir``)
and the metrics JSON (``--metrics-out``). This module is the worker's loop; the process around it
(options, MPI and Horovod start, servers, exit statuses) is :mod:`hvd_async.job_process`.
"""
import logging
import os
import sys
import time

import numpy as np

from .config import ConfigError
from .job_process import TrainingStopped, Watchdog as _Watchdog, device as _device, say as _say

logger = logging.getLogger(__name__)
NONFINITE_CHECK_EVERY = 10  # synchronous algorithms agree on a non-finite streak every so many steps


class _Pacer:
    """Injected compute: ``--compute-ms`` on every worker, stretched by this worker's straggler factor."""

    def __init__(self, compute_ms: float, factor: float):
        self.compute_s, self.factor = compute_ms / 1000.0, factor
        self.last_work = 0.0

    def before_step(self, scale: float = 1.0) -> None:
        # ``scale``: this batch's size over the nominal one (dbs-asgd's batches vary). The straggler
        # sleeps (factor-1) x its real forward/backward time of the last step on top.
        delay = self.compute_s * self.factor * scale + (self.factor - 1.0) * self.last_work
        if delay > 0:
            time.sleep(delay)


class _Counters:
    """One worker's running counts; a checkpoint holds them, so a resumed epoch reports as a whole one."""

    def __init__(self):
        self.steps = self.samples = self.streak = self.skipped_seen = 0
        self.train_seconds = self.wait_total = self.last_work = 0.0
        self.new_epoch()

    def new_epoch(self) -> None:
        self.epoch_steps = self.epoch_samples = 0
        self.epoch_wait = self.epoch_compute = self.epoch_seconds = self.loss_sum = 0.0


class _Job:
    """One worker's side of the training job: what it builds, its epoch loop and its reports.

    The loop (:meth:`run`): train until this worker has a reason to stop (:meth:`_train`), let
    ``--worker-timeout`` name a worker that never came (:meth:`_drop_stalled`), ``synchronize()``,
    agree on why the workers stopped (:meth:`_agree`), then stop on non-finite gradients, report the
    epoch (:meth:`_end_epoch`) and write a checkpoint when one is due (:meth:`_checkpoint_due`).
    """

    def __init__(self, args):
        import horovod.torch as hvd
        import torch

        import hvd_async as ha
        from . import data, models
        from .config import algorithm_options
        from .jobstate import JobCheckpoints, WorkerBatches, parse_every
        from .metrics import RunMetrics

        self.args = args
        rank, workers = self.rank, self.workers = ha.rank(), ha.size()
        self.comm = ha.worker_comm()
        self.reporter = rank == 0
        torch.manual_seed(args.seed)
        self.splits = splits = data.load_dataset_on(self.comm, args.dataset, args.data_dir, seed=args.seed,
                                                    image_size=args.image_size)
        self.model = model = models.build_model(args.model, splits.input_shape, splits.num_classes)
        self.device = _device(args.device, ha)
        model.to(self.device)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.opt = ha.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                            weight_decay=args.weight_decay),
            named_parameters=model.named_parameters(), algorithm=args.algo, **algorithm_options(args))
        self.opt.begin()  # parameters were broadcast above: start the exchange now, not at step 1
        self.uses_servers = ha.num_servers() > 0
        self.source = WorkerBatches(len(splits.train), args.batch_size, rank=rank, workers=workers, seed=args.seed,
                                    strategy=self.opt.strategy, servers=self.uses_servers,
                                    fetch_add=self.opt.strategy.batch_cursor())
        self.steps_per_epoch = (-(-self.source.global_steps // workers) if self.uses_servers
                                else self.source.batches.per_epoch)  # for the bar
        self.pacer = _Pacer(args.compute_ms, args.stragglers.get(rank, 1.0))
        self.metrics = RunMetrics({
            "algorithm": args.algo, "world_size": ha.world_size(), "workers": workers,
            "servers": ha.num_servers(), "dataset": args.dataset, "model": args.model,
            "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "compute_ms": args.compute_ms, "stragglers": {str(k): v for k, v in args.stragglers.items()},
        }, logdir=args.logdir, reporter=self.reporter)
        self.bar = None
        if self.reporter and (args.progress == "bar" or (args.progress == "auto" and (
                sys.stderr.isatty() or os.environ.get("HVD_ASYNC_PROGRESS") == "1"))):
            from tqdm import tqdm

            self.bar = tqdm(total=args.epochs * self.steps_per_epoch, desc=f"{args.algo} x{workers}", unit="step",
                            file=sys.stderr, dynamic_ncols=True)
        self.acc = _Counters()  # this worker's counters (a checkpoint holds them)
        self.job = {"epoch": 1, "history": [], "elapsed": 0.0, "staleness_seen": [], "next_checkpoint": None}
        self.saver = None
        if args.checkpoint_dir:
            self.saver = JobCheckpoints(args.checkpoint_dir, keep=args.keep_checkpoints, comm=self.comm, meta={
                "algorithm": args.algo, "workers": workers, "servers": ha.num_servers(), "dataset": args.dataset,
                "model": args.model, "batch_size": args.batch_size, "seed": args.seed,
                "parameters": {name: list(p.shape) for name, p in model.named_parameters()}})
        self.every, self.unit = parse_every(args.checkpoint_every)
        self.job["next_checkpoint"] = self.every
        if args.resume:
            self._resume()
        self.staleness_seen = np.asarray(self.job.get("staleness_seen", []), dtype=np.int64)
        self.live, self.dropped = list(range(workers)), []  # worker numbers still in ``comm``; those gone
        self.watchdog = _Watchdog(args.worker_timeout, self.comm, list(self.live)) if args.worker_timeout else None
        self.beat = self.watchdog.beat if self.watchdog else (lambda: None)
        self.loss_sum = torch.zeros(())
        self.blocked_before = self.opt.stats().get("exchange_wait_seconds")
        self.stats, self.train_loss, self.batch_sizes = {}, None, None  # the last epoch's, for the record

    def _count(self) -> int:
        """What ``--checkpoint-every N steps`` counts: the servers' updates, or this worker's steps."""
        return self.opt.progress() if self.uses_servers else self.acc.steps

    def _resume(self) -> None:
        from . import checkpoint

        path, part, saved_job = self.saver.restore()
        self.model.load_state_dict(part["model"])
        self.opt.load_state_dict(part["optimizer"])  # (a checkpoint of an earlier version: both parts)
        if "algorithm" in part:
            self.opt.load_algorithm_state_dict(part["algorithm"])
        self.source.batches.load_state_dict(part["batches"])
        checkpoint.set_rng_state(part["rng"])
        self.acc.__dict__.update(part["counters"])
        self.pacer.last_work = self.acc.last_work
        self.source.drawn = part["drawn"]
        self.source.last_epoch = part.get("last_epoch")
        job = self.job = (saved_job if self.reporter else
                          {"epoch": saved_job["epoch"], "next_checkpoint": saved_job["next_checkpoint"]})
        if self.reporter:
            self.metrics.history[:] = job["history"]
            self.metrics.start -= job["elapsed"]
            _say(f"resumed from {path}: epoch {job['epoch']}, {self.opt.progress()} updates so far")
        job["next_checkpoint"] = (self._count() // self.every + 1) * self.every
        if job["epoch"] > self.args.epochs:
            raise ConfigError(f"--resume: checkpoint {path} has finished {job['epoch'] - 1} epoch(s) and "
                              f"--epochs is {self.args.epochs}: give a larger --epochs to train on")
        if self.bar is not None:
            self.bar.update(min(self.bar.total, (job["epoch"] - 1) * self.steps_per_epoch + self.acc.epoch_steps))

    def save_checkpoint(self, progress: int) -> str:
        """Collective: every worker's part and worker 0's job record, after opt.load_global_model()."""
        from . import checkpoint

        self.acc.last_work = self.pacer.last_work
        part = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "algorithm": self.opt.algorithm_state_dict(),
                "batches": self.source.batches.state_dict(), "rng": checkpoint.rng_state(),
                "counters": dict(vars(self.acc)), "drawn": self.source.drawn,
                "last_epoch": self.source.last_epoch}
        if self.reporter:
            self.job.update(history=self.metrics.history, elapsed=self.metrics.elapsed(),
                            staleness_seen=self.staleness_seen.tolist())
        return self.saver.save(progress, part, self.job if self.reporter else None)

    def _next_batch(self, epoch: int):
        """The next (x, y) of this epoch, or None when the epoch is over for this worker."""
        from torch.utils.data import default_collate

        indices = self.source.next(epoch)
        if indices is None:
            return None
        x, y = default_collate([self.splits.train[i] for i in indices])
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _pause_reason(self):
        """Why this worker leaves its loop before the epoch ends ("checkpoint", "nonfinite") or None.

        With parameter servers each worker decides alone (the others join at their own pause or epoch
        end: nobody waits inside an epoch); synchronous algorithms decide at the same steps, together.
        """
        from mpi4py import MPI

        args, acc, limit = self.args, self.acc, self.args.max_nonfinite
        due = bool(args.checkpoint_dir) and self.unit == "steps" and self._count() >= self.job["next_checkpoint"]
        if self.uses_servers:
            if limit and acc.streak >= limit:
                return "nonfinite"
            return "checkpoint" if due else None
        reason = "checkpoint" if due else None
        if limit and acc.steps % NONFINITE_CHECK_EVERY == 0 and self.comm.allreduce(int(acc.streak >= limit),
                                                                                     op=MPI.MAX):
            reason = "nonfinite"
        return reason

    def _train(self, epoch: int) -> str:
        """Train until this worker has a reason to leave its loop: "end" of the epoch, "checkpoint"
        or "nonfinite"."""
        import torch
        import torch.nn.functional as F

        acc, opt, bar = self.acc, self.opt, self.bar
        segment_start = time.perf_counter()
        self.loss_sum.fill_(acc.loss_sum)
        reason = None
        while reason is None:
            batch = self._next_batch(epoch)
            if batch is None:
                reason = "end"
                break
            x, y = batch
            self.pacer.before_step(len(y) / self.args.batch_size)
            t0 = time.perf_counter()
            loss = F.cross_entropy(self.model(x), y)
            opt.zero_grad()
            loss.backward()
            t1 = time.perf_counter()
            opt.step(loss=loss.detach())  # time in here: waiting for the exchange, then the local update
            t2 = time.perf_counter()
            self.pacer.last_work = t1 - t0
            acc.epoch_compute += t1 - t0
            acc.epoch_wait += t2 - t1
            if bool(torch.isfinite(loss)):
                self.loss_sum += loss.detach()
            acc.steps += 1
            acc.epoch_steps += 1
            acc.epoch_samples += len(y)
            skipped = getattr(opt.strategy, "skipped_nonfinite", 0)
            acc.streak = acc.streak + 1 if skipped > acc.skipped_seen else 0
            acc.skipped_seen = skipped
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}", epoch=epoch, refresh=False)
            reason = self._pause_reason()
            self.beat()
        acc.epoch_seconds += time.perf_counter() - segment_start
        acc.loss_sum = float(self.loss_sum)
        return reason

    def _drop_stalled(self) -> None:
        """``--worker-timeout``: name a worker that stopped making progress instead of hanging on it;
        parameter-server jobs go on without it, the others stop (:class:`WorkerStalled`)."""
        from .jobstate import WorkerStalled, rendezvous

        args = self.args
        missing = rendezvous(self.comm, args.worker_timeout)
        if not missing:
            return
        gone = [self.live[r] for r in missing]
        drop = getattr(self.opt.strategy.transport, "drop_workers", None)
        if drop is None or 0 in gone:
            stalled = WorkerStalled(gone, args.worker_timeout, "stopping the job" + (
                "" if drop is None else " (worker 0 writes the reports)"))
            stalled.printer = self.live[self.rank] == min(w for w in self.live if w not in gone)
            raise stalled
        self.comm = self.comm.Create_group(self.comm.Get_group().Excl(missing))
        self.live = [w for w in self.live if w not in gone]
        self.rank, self.workers = self.comm.rank, self.comm.size
        drop(gone, self.comm, tell_servers=self.rank == 0)
        if self.saver is not None:
            self.saver.comm = self.comm
        self.dropped.extend(gone)
        if self.reporter:
            _say(f"worker(s) {', '.join(map(str, gone))} made no progress for {args.worker_timeout:g} s "
                 f"(--worker-timeout): going on with {self.workers} worker(s)")

    def _agree(self, reason: str):
        """The workers left their loops for their own reasons (asynchronous ones see progress at
        different times): from here on they agree. Returns (ended, pause, nonfinite, progress)."""
        from mpi4py import MPI

        flags = np.array([reason == "end", reason == "checkpoint", reason == "nonfinite"], dtype=np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
        ended, pause, nonfinite = (bool(flag) for flag in flags)
        return ended, pause, nonfinite, self.comm.allreduce(self.opt.progress(), op=MPI.MAX)

    def _stop_nonfinite(self, progress: int) -> None:
        args = self.args
        where = self.save_checkpoint(progress) if self.saver else None
        raise TrainingStopped(
            f"stopped: {args.max_nonfinite} gradients in a row held NaN or infinity on a worker "
            f"(--max-nonfinite {args.max_nonfinite}); none was applied; "
            + (f"the last good state is in {where}" if where else
               "no checkpoint was written (give --checkpoint-dir to keep one)")
            + "; lower --lr or check the data, then --resume")

    def _end_epoch(self, epoch: int) -> None:
        """Collective: evaluate, reduce the epoch's figures; worker 0 records and prints them."""
        from .metrics import evaluate_accuracy, pooled_staleness

        acc, comm, workers, opt = self.acc, self.comm, self.workers, self.opt
        steps = max(1, acc.epoch_steps)
        acc.samples += acc.epoch_samples
        acc.train_seconds += acc.epoch_seconds
        acc.wait_total += acc.epoch_wait
        stats = self.stats = opt.stats()
        timing = {}
        if self.blocked_before is not None:  # od-sgd, hpsgd: time step() sat waiting for the exchange
            timing["exchange_blocked_ms_per_step"] = comm.allreduce(
                1000.0 * (stats["exchange_wait_seconds"] - self.blocked_before) / steps) / workers
        worker_loss = float(self.loss_sum) / steps
        self.train_loss = comm.allreduce(worker_loss) / workers
        losses = comm.gather(worker_loss, root=0)
        rates = comm.gather(acc.epoch_samples / acc.epoch_seconds, root=0)
        self.beat()
        accuracy = evaluate_accuracy(self.model, self.splits.test, self.rank, workers, comm, self.device)
        self.beat()
        waits = comm.gather(1000.0 * acc.epoch_wait / steps, root=0)
        staleness = pooled_staleness(stats, comm)
        timing = {"compute_ms_per_step": comm.allreduce(1000.0 * acc.epoch_compute / steps) / workers, **timing}
        self.batch_sizes = comm.gather(stats.get("batch_size", self.args.batch_size), root=0)
        if self.reporter:
            self._report(epoch, accuracy, rates, losses, waits, timing, staleness, acc.epoch_seconds)
        self.staleness_seen = staleness
        self.blocked_before = stats.get("exchange_wait_seconds")
        acc.new_epoch()
        self.loss_sum.zero_()

    def _report(self, epoch, accuracy, rates, losses, waits, timing, staleness, seconds) -> None:
        metrics, args = self.metrics, self.args
        entry = metrics.epoch(epoch, test_accuracy=accuracy, train_loss=self.train_loss,
                              worker_samples_per_second=rates, exchange_wait_ms=sum(waits) / self.workers,
                              timing=timing, worker_losses=losses, worker_exchange_wait_ms=waits)
        if self.source.shared is not None:
            entry["batch_sizes"] = self.batch_sizes
            metrics.per_worker("batch_size", self.batch_sizes, epoch)
        if self.uses_servers:  # apply rate, server time per push, compensation norms (dc-asgd, lc-asgd)
            entry.update(metrics.server(epoch, pushes=self.opt.progress(), seconds=seconds, stats=self.stats))
        if staleness.sum() > self.staleness_seen.sum():
            metrics.staleness_histogram(staleness, self.staleness_seen, epoch)
        line = (f"epoch {epoch}/{args.epochs}  train loss {self.train_loss:.4f}  test accuracy "
                f"{accuracy:.4f}  {sum(rates):.0f} samples/s  {entry['wall_seconds']:.1f} s")
        if self.bar is not None:
            self.bar.write(line)
        else:
            _say(line)

    def _checkpoint_due(self, ended: bool, pause: bool, epoch: int, progress: int) -> bool:
        """After the agreement (``epoch``: the next one to train): whether to save now."""
        if self.saver is None:
            return False
        every, unit, count = self.every, self.unit, progress if self.uses_servers else self.acc.steps
        due = (pause or (ended and epoch > self.args.epochs)
               or (unit == "epochs" and ended and (epoch - 1) % every == 0)
               or (unit == "steps" and count >= self.job["next_checkpoint"]))
        if due:
            self.job["next_checkpoint"] = (count // every + 1) * every if unit == "steps" else None
        return due

    def run(self) -> dict:
        """The epochs; returns the metrics record (complete on worker 0)."""
        args, opt = self.args, self.opt
        epoch = self.job["epoch"]
        while epoch <= args.epochs:
            reason = self._train(epoch)
            if args.worker_timeout:
                self._drop_stalled()
            self.beat()
            # first thing after the loop: finish the exchange in flight; the parameter-server
            # algorithms tell the servers this worker stopped pushing (softsync must not wait for its
            # gradients); then every worker holds the global weights to evaluate (ssgd's already do)
            opt.load_global_model()
            ended, pause, nonfinite, progress = self._agree(reason)
            self.beat()
            if nonfinite:
                self._stop_nonfinite(progress)
            if ended:
                self._end_epoch(epoch)
                epoch += 1
                self.job["epoch"] = epoch
            if self._checkpoint_due(ended, pause, epoch, progress):
                self.beat()
                path = self.save_checkpoint(progress)
                self.beat()
                if self.reporter:
                    logger.info("checkpoint %s written", path)
            opt.strategy.after_evaluation()
        return self._finish()

    def _finish(self) -> dict:
        from mpi4py import MPI

        from .transport.window import staleness_summary

        if self.bar is not None:
            self.bar.close()
        if self.watchdog is not None:
            self.watchdog.stop(free=not self.dropped)
        acc, comm, stats, opt = self.acc, self.comm, self.stats, self.opt
        steps = acc.steps
        total_samples = comm.allreduce(acc.samples)
        total_steps = comm.allreduce(steps)
        train_seconds = comm.allreduce(acc.train_seconds, op=MPI.MAX)
        opt.close()
        staleness_mean, staleness_max = staleness_summary(self.staleness_seen)
        metrics = self.metrics
        final_accuracy = metrics.history[-1]["test_accuracy"] if self.reporter else None
        return metrics.finish(
            self.args.metrics_out, steps=steps, final_test_accuracy=final_accuracy,
            final_train_loss=self.train_loss, wall_seconds=round(metrics.elapsed(), 4),
            train_seconds=round(train_seconds, 4), samples=total_samples,
            samples_per_second=total_samples / max(train_seconds, 1e-9),
            step_wait_ms_mean=1000.0 * acc.wait_total / max(1, steps),
            exchange_blocked_ms_mean=(1000.0 * comm.allreduce(stats["exchange_wait_seconds"]) / max(1, total_steps)
                                      if "exchange_wait_seconds" in stats else None),
            staleness_mean=staleness_mean, staleness_max=staleness_max,
            staleness_hist=self.staleness_seen.tolist(), batch_sizes=self.batch_sizes,
            dropped_workers=self.dropped, server_ms_per_push=stats.get("server_ms_per_push"),
            updates=opt.progress() if self.uses_servers else steps * self.workers,
            **metrics.compensation(stats))


def train_worker(args) -> dict:
    """One worker's training loop; returns the metrics record (complete on worker 0)."""
    return _Job(args).run()


def main(argv=None) -> int:
    """The job on this rank (see :mod:`hvd_async.job_process`): the exit status."""
    from .job_process import main as run

    return run(argv, train_worker)


if __name__ == "__main__":
    from .job_process import exit_process

    exit_process(main())

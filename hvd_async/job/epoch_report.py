"""What a worker's loop reports (:mod:`.worker_loop`): the epoch's figures reduced over the workers,
the held-out evaluations (at an epoch's end and at the points inside it), worker 0's epoch line and
metrics entries, and the run's final record.

The loop trains and decides when an epoch or a run ends; this says what was done. Every call that
reduces over the workers takes the workers' communicator as it is then (``--worker-timeout`` may
have set a worker aside since the last call)."""
from typing import Any, Dict, Tuple, cast

import numpy as np

from ..algorithms.base import ExchangeStats, exchange_stats
from .job_process import say


def worker_speeds(rates, listed: int = 8) -> str:
    """The epoch line's per-worker samples/s, so a slow node shows on the console: each worker's up
    to ``listed`` workers, beyond that the slowest and fastest with their numbers; empty for one."""
    if len(rates) < 2:
        return ""
    if len(rates) <= listed:
        return " (per worker " + " ".join(f"{r:.0f}" for r in rates) + ")"
    slow = min(range(len(rates)), key=rates.__getitem__)
    fast = max(range(len(rates)), key=rates.__getitem__)
    return f" (per worker: slowest {rates[slow]:.0f}, worker {slow}; fastest {rates[fast]:.0f}, worker {fast})"


class EpochReport:
    """One worker's side of the job's reports, and the figures kept from one epoch to the next.

    Args:
        spec: the job (a :class:`~hvd_async.job.jobspec.JobSpec`).
        opt: the worker's :class:`~hvd_async.DistributedOptimizer` (its strategy's statistics, its
            progress).
        metrics: a :class:`~hvd_async.metrics.RunMetrics` (worker 0's records it).
        host: the loop's :class:`~hvd_async.job.worker_loop.Host` (clock, maximum op, beat, time unit).
        model, test, device: what an evaluation scores, on which split, where its batches go.
        servers: whether the algorithm runs on parameter servers (their figures are reported).
        batch_sizes: whether the workers' batch sizes change (dbs-asgd's shared cursor): reported.
        progress: worker 0's display inside an epoch (the epoch line goes through it), or None.
        staleness_seen: the staleness histogram reported so far (a resumed run's, from its checkpoint).

    Attributes:
        stats: the last epoch's :class:`~hvd_async.algorithms.base.ExchangeStats`.
        train_loss: the last epoch's mean training loss over the workers (None before the first).
        batch_sizes: the workers' batch sizes at the last epoch's end (worker 0's list).
        staleness_seen: the staleness histogram so far (a checkpoint keeps it).
    """

    def __init__(self, spec, *, opt, metrics, host, model, test, device, servers: bool, batch_sizes: bool,
                 progress=None, staleness_seen=()):
        self.options, self.opt, self.metrics, self.host = spec.job, opt, metrics, host
        self.model, self.test, self.device = model, test, device
        self.servers, self.reports_batch_sizes, self.progress = servers, batch_sizes, progress
        self.staleness_seen = np.asarray(staleness_seen, dtype=np.int64)
        self.blocked_before = exchange_stats(opt.strategy).exchange_wait_seconds
        self.stats, self.train_loss, self.batch_sizes = ExchangeStats(), None, None

    def end_epoch(self, comm, epoch: int, acc, loss_sum) -> None:
        """Collective: evaluate, reduce the epoch's figures (``acc``: the worker's counters, the epoch's
        part not yet cleared; ``loss_sum``: its summed losses); worker 0 records and prints them."""
        from ..metrics import pooled_staleness

        workers, opt = comm.size, self.opt
        steps = max(1, acc.epoch_steps)
        acc.samples += acc.epoch_samples
        acc.dropped_samples += acc.epoch_dropped
        acc.train_seconds += acc.epoch_seconds
        trained = acc.train_seconds
        acc.wait_total += acc.epoch_wait
        stats = self.stats = exchange_stats(opt.strategy)
        if not self.host.server_time:
            stats.server_ms_per_push = None
        timing = {}
        if self.blocked_before is not None:  # od-sgd, hpsgd: time step() sat waiting for the exchange
            timing["exchange_blocked_ms_per_step"] = comm.allreduce(
                1000.0 * (cast(float, stats.exchange_wait_seconds) - self.blocked_before) / steps) / workers
        worker_loss = float(loss_sum) / steps
        self.train_loss = comm.allreduce(worker_loss) / workers
        losses = comm.gather(worker_loss, root=0)
        applied = acc.epoch_samples - acc.epoch_dropped
        rates = comm.gather(applied / acc.epoch_seconds if acc.epoch_seconds > 0 else 0.0, root=0)
        dropped = comm.allreduce(acc.epoch_dropped)
        accuracy, train_clock = self.evaluate(comm, epoch, 1.0, trained)
        waits = comm.gather(1000.0 * acc.epoch_wait / steps, root=0)
        staleness = pooled_staleness(stats, comm)
        timing = {"compute_ms_per_step": comm.allreduce(1000.0 * acc.epoch_compute / steps) / workers, **timing}
        self.batch_sizes = comm.gather(self.options.batch_size if stats.batch_size is None else stats.batch_size,
                                       root=0)
        if comm.rank == 0:
            self._report(epoch, workers, accuracy, rates, losses, waits, timing, staleness, acc.epoch_seconds,
                         dropped)
            self.metrics.history[-1]["train_seconds"] = round(train_clock, 6)
        self.staleness_seen = staleness
        self.blocked_before = stats.exchange_wait_seconds

    def evaluate(self, comm, epoch: int, at: float, trained: float) -> Tuple[float, float]:
        """Collective: the held-out accuracy at fraction ``at`` of ``epoch``, off the training clock
        (``trained``: this worker's training seconds so far; the clock is their maximum over the
        workers). Worker 0 records it with the evaluation's own time. Returns (accuracy, clock)."""
        from ..metrics import evaluate_accuracy

        host = self.host
        host.beat()
        start = host.clock()
        accuracy = evaluate_accuracy(self.model, self.test, comm.rank, comm.size, comm, self.device)
        took = comm.allreduce(host.clock() - start, op=host.MAX)
        clock = comm.allreduce(trained, op=host.MAX)
        host.beat()
        if comm.rank == 0:
            self.metrics.evaluation(epoch, at, accuracy, train_seconds=clock, seconds=took)
        return accuracy, clock

    def _report(self, epoch, workers, accuracy, rates, losses, waits, timing, staleness, seconds, dropped) -> None:
        metrics, options = self.metrics, self.options
        entry = metrics.epoch(epoch, test_accuracy=accuracy, train_loss=self.train_loss,
                              worker_samples_per_second=rates, exchange_wait_ms=sum(waits) / workers,
                              timing=timing, worker_losses=losses, worker_exchange_wait_ms=waits)
        entry["dropped_samples"] = dropped
        if self.reports_batch_sizes:
            entry["batch_sizes"] = self.batch_sizes
            metrics.per_worker("batch_size", self.batch_sizes, epoch)
        if self.servers:  # apply rate, server time per push, compensation norms (dc-asgd, lc-asgd)
            entry.update(metrics.server(epoch, pushes=self.opt.progress(), seconds=seconds,
                                        server_ms_per_push=self.stats.server_ms_per_push,
                                        compensation=self.stats.compensation))
        if staleness.sum() > self.staleness_seen.sum():
            metrics.staleness_histogram(staleness, self.staleness_seen, epoch)
        line = (f"epoch {epoch}/{options.epochs}  train loss {self.train_loss:.4f}  {options.eval_on} accuracy "
                f"{accuracy:.4f}  {sum(rates):.0f} samples/s{worker_speeds(rates)}  "
                f"{entry['wall_seconds']:.1f} {self.host.seconds}")
        if self.progress is not None:
            self.progress.write(line)
        else:
            say(line)

    def totals(self, comm, acc) -> Dict[str, Any]:
        """Collective, before the optimizer closes: the run's figures summed over the workers."""
        stats, opt = self.stats, self.opt
        total_samples = comm.allreduce(acc.samples)
        applied = total_samples - comm.allreduce(acc.dropped_samples)
        dropped_gradients = comm.allreduce(opt.strategy.dropped_gradients)
        worker_samples = comm.gather([acc.samples, acc.samples - acc.dropped_samples], root=0)
        total_steps = comm.allreduce(acc.steps)
        train_seconds = comm.allreduce(acc.train_seconds, op=self.host.MAX)
        blocked = stats.exchange_wait_seconds
        blocked = None if blocked is None else 1000.0 * comm.allreduce(blocked) / max(1, total_steps)
        totals: Dict[str, Any] = dict(samples=total_samples, applied=applied, dropped_gradients=dropped_gradients,
                                      worker_samples=worker_samples, train_seconds=train_seconds, blocked=blocked,
                                      counted={})
        if stats.dropped_pushes is not None:  # every worker's pushes the servers dropped as late
            totals["counted"]["dropped_pushes"] = stats.dropped_pushes
        if stats.inbox_slot_waits is not None:  # a pool of inbox slots: pushes that waited for one (all workers')
            totals["counted"]["inbox_slot_waits"] = comm.allreduce(stats.inbox_slot_waits)
        return totals

    def record(self, totals: Dict[str, Any], acc, *, workers: int, reporter: bool, dropped_workers) -> Dict[str, Any]:
        """The final record's fields from :meth:`totals` and this worker's counters (``acc``)."""
        from ..transport.window import staleness_summary

        metrics, stats, steps = self.metrics, self.stats, acc.steps
        train_seconds, applied, worker_samples = totals["train_seconds"], totals["applied"], totals["worker_samples"]
        staleness_mean, staleness_max = staleness_summary(self.staleness_seen)
        return dict(
            steps=steps, final_test_accuracy=metrics.history[-1]["test_accuracy"] if reporter else None,
            final_train_loss=self.train_loss, wall_seconds=None, train_seconds=round(train_seconds, 6),
            eval_seconds=round(sum(e["eval_seconds"] for e in metrics.evaluations), 6),
            samples=totals["samples"], samples_applied=applied,
            worker_samples=[n for n, _ in worker_samples] if reporter else None,
            worker_samples_applied=[n for _, n in worker_samples] if reporter else None,
            dropped_gradients=totals["dropped_gradients"],
            samples_per_second=applied / max(train_seconds, 1e-9),
            computed_samples_per_second=totals["samples"] / max(train_seconds, 1e-9),
            step_wait_ms_mean=1000.0 * acc.wait_total / max(1, steps), exchange_blocked_ms_mean=totals["blocked"],
            staleness_mean=staleness_mean, staleness_max=staleness_max,
            staleness_hist=self.staleness_seen.tolist(), batch_sizes=self.batch_sizes,
            dropped_workers=dropped_workers, server_ms_per_push=stats.server_ms_per_push,
            updates=self.opt.progress() if self.servers else steps * workers, **totals["counted"])

    def finish(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """The metrics record, written to ``--metrics-out`` (complete on worker 0)."""
        return self.metrics.finish(self.options.metrics_out, **record,
                                   **self.metrics.compensation(self.stats.compensation))

"""The simulated training job: ``hvd_async.train``'s worker loop on every simulated worker, on the virtual clock.

Each worker builds what a real worker builds (``data.load_dataset``, ``models.build_model`` after
``torch.manual_seed(seed)``, a ``torch.optim.SGD`` wrapped in a real
:class:`hvd_async.DistributedOptimizer` whose ``transport=`` is a simulated one, the same seeded
samplers; dbs-asgd draws from :class:`~hvd_async.sampling.SharedCursorBatches` through the simulated
cursor) and runs the same epochs: the parameter-server algorithms push until the global progress
reaches ``epoch x`` batches-in-one-pass (at least one batch each), the others take one pass of their ``DistributedSampler``;
then ``load_global_model()`` and an evaluation of the test split, each worker taking every N-th sample.

Before each step the worker's clock moves on by its compute time (drawn from its
:class:`~hvd_async.sim.delays.DelayModel`, scaled by the batch over the nominal one); the step's
forward and backward then run for real, and ``opt.step()`` takes whatever simulated time its
exchanges take (latency, waiting for others). Evaluation and metric reductions take none.
"""
import sys
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

from .. import models, registry
from ..algorithms.base import parse_options
from ..config import ConfigError, algorithm_options
from ..metrics import RunMetrics, evaluate_accuracy, pooled_staleness
from ..optimizer import DistributedOptimizer
from ..jobstate import WorkerBatches
from ..train import NONFINITE_CHECK_EVERY, TrainingStopped
from ..transport import window as W
from .clock import Scheduler
from .collective import PeerWindows, SimCollectiveTransport, SimPeerTransport
from .delays import DelayModel
from .network import SimComm, SimNetwork
from .options import factors
from ..transport.trace import Trace, Tracer
from .windows import ReplayScript, SimServers, SimWindowTransport


class _SimMetrics(RunMetrics):
    """RunMetrics whose elapsed time is the reporting worker's simulated clock."""

    def __init__(self, info, *, clock, **kwargs):
        super().__init__(info, **kwargs)
        self._clock = clock

    def elapsed(self) -> float:
        return self._clock()


class Cluster:
    """What the workers share: the clock, the network, and the servers or peer windows."""

    def __init__(self, args, numel: int):
        self.args = args
        self.sched = Scheduler(args.workers)
        self.net = SimNetwork(self.sched, args.latency_ms / 1000.0)
        self.strategy_cls = registry.strategy_class(args.algo)
        self.servers: Optional[SimServers] = None
        self.peers: Optional[PeerWindows] = None
        self.replay = None
        if args.replay:
            try:
                self.replay = Trace(args.replay)
                self._check_replay()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--replay {args.replay}: {exc}") from None
        if args.servers > 0:
            cls = self.strategy_cls
            options = parse_options(cls.Options, args.algo, algorithm_options(args))
            cls.resolve_options(options, args.workers)  # before the servers open
            server_options = cls.server_options(options)
            spec = W.WindowSpec(args.algo, getattr(cls, "mode", "accumulate"), numel, args.servers,
                                args.workers, server_options)
            self.servers = SimServers(spec, cls.server_program)
        elif args.algo == "gossip":
            self.peers = PeerWindows(args.workers, numel)

    def _check_replay(self) -> None:
        trace, args = self.replay, self.args
        if trace.workers != args.workers:
            raise ValueError(f"the recorded run had {trace.workers} workers; use --workers {trace.workers}")
        recorded = trace.events[0][0].get("algorithm")
        if recorded != args.algo:
            raise ValueError(f"the recorded run is {recorded}, not {args.algo}")
        trace.check_order()

    def transport(self, rank: int):
        args = self.args
        if self.servers is not None:
            tracer = None
            if args.trace_out and self.servers.spec.mode == "accumulate":
                tracer = Tracer(args.trace_out, rank, args.algo)
            script = ReplayScript(rank, self.replay.events[rank]) if self.replay is not None else None
            return SimWindowTransport(self.net, rank, self.servers, script=script, tracer=tracer)
        if self.peers is not None:
            return SimPeerTransport(self.net, rank, self.peers)
        return SimCollectiveTransport(self.net, rank)

    def replayed(self, transports: List) -> Optional[Dict]:
        """After a replay: how many pulls read exactly what the recorded ones read (None without one)."""
        if self.replay is None:
            return None
        for t in transports:
            if not t.script.done:
                raise RuntimeError(f"replay diverged: worker {t.rank} stopped after {t.script.position} of its "
                                   f"{len(t.script.events)} recorded exchanges")
        return {"trace": self.args.replay, "pulls": sum(t.script.matched + t.script.unmatched for t in transports),
                "pulls_matched": sum(t.script.matched for t in transports)}


def run_job(args, splits) -> Dict:
    """Simulate the job; returns the metrics record (the same keys as ``hvd_async.train``'s)."""
    numel = sum(p.numel() for p in models.build_model(args.model, splits.input_shape, splits.num_classes).parameters())
    cluster = Cluster(args, numel)
    slow = factors(args)
    delays = [DelayModel(args.delay_dist, mean_ms=args.compute_ms, shape=args.delay_shape, seed=args.seed,
                         worker=w, factor=slow[w]) for w in range(args.workers)]
    transports = [None] * args.workers

    def body(w: int):
        return _Worker(args, splits, cluster, delays[w], w, transports).run()

    return cluster.sched.run(body)[0]


class _Worker:
    """One simulated worker: the training job's loop with its clock in place of the wall clock."""

    def __init__(self, args, splits, cluster: Cluster, delay: DelayModel, rank: int, transports: List):
        self.args, self.splits, self.cluster, self.delay, self.rank = args, splits, cluster, delay, rank
        self.sched = cluster.sched
        self.comm = SimComm(cluster.net, rank)
        self.transports = transports

    def clock(self) -> float:
        return self.sched.now(self.rank)

    def _setup(self):
        args, rank = self.args, self.rank
        torch.manual_seed(args.seed)
        self.model = models.build_model(args.model, self.splits.input_shape, self.splits.num_classes)
        transport = self.transports[rank] = self.cluster.transport(rank)
        sgd = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay)
        self.opt = DistributedOptimizer(sgd, named_parameters=self.model.named_parameters(), algorithm=args.algo,
                                        transport=transport, **algorithm_options(args))
        self.opt.begin()  # the exchange starts now, from the weights every worker holds (not at step 1)
        self.servers = args.servers > 0
        self.source = WorkerBatches(len(self.splits.train), args.batch_size, rank=rank, workers=args.workers,
                                    seed=args.seed, strategy=self.opt.strategy, servers=self.servers,
                                    fetch_add=self.opt.strategy.batch_cursor())
        self.steps_total = self.streak = self.skipped_seen = 0

    def _next_batch(self, epoch: int):
        """The next batch of this epoch, or None when the epoch is over for this worker."""
        indices = self.source.next(epoch)
        if indices is None:
            return None
        return default_collate([self.splits.train[i] for i in indices])

    def _nonfinite_streak(self) -> bool:
        """Whether this worker stops for ``--max-nonfinite``, as ``hvd_async.train`` decides: with
        parameter servers each worker alone (its pushes are refused, so its epoch would never end);
        the others together, every ``NONFINITE_CHECK_EVERY`` steps."""
        skipped = getattr(self.opt.strategy, "skipped_nonfinite", 0)
        self.streak = self.streak + 1 if skipped > self.skipped_seen else 0
        self.skipped_seen = skipped
        limit = self.args.max_nonfinite
        if not limit:
            return False
        if self.servers:
            return self.streak >= limit
        return (self.steps_total % NONFINITE_CHECK_EVERY == 0
                and bool(self.comm.allreduce(int(self.streak >= limit), op="max")))

    def _epoch(self, epoch: int) -> Dict:
        """Train one epoch; returns this worker's tallies (simulated seconds); ``nonfinite`` is set
        when it left early for a streak of non-finite gradients."""
        opt, sched, rank = self.opt, self.sched, self.rank
        t = {"start": self.clock(), "samples": 0, "steps": 0, "compute": 0.0, "wait": 0.0,
             "blocked": opt.stats().get("exchange_wait_seconds"), "nonfinite": False}
        loss_sum = torch.zeros(())
        while True:
            batch = self._next_batch(epoch)
            if batch is None:
                break
            x, y = batch
            compute = self.delay.draw(len(y) / self.args.batch_size)
            sched.advance(rank, compute)
            loss = F.cross_entropy(self.model(x), y)
            opt.zero_grad()
            loss.backward()
            before = self.clock()
            opt.step(loss=loss.detach())
            t["wait"] += self.clock() - before
            t["compute"] += compute
            loss_sum += loss.detach()
            t["steps"] += 1
            t["samples"] += len(y)
            self.steps_total += 1
            if self._nonfinite_streak():
                t["nonfinite"] = True
                break
        t["seconds"] = self.clock() - t["start"]
        t["loss"] = float(loss_sum) / max(1, t["steps"])
        return t

    def run(self) -> Optional[Dict]:
        args, comm, workers = self.args, self.comm, self.args.workers
        self._setup()
        reporter = self.rank == 0
        metrics = _SimMetrics(_info(args), clock=self.clock, logdir=args.logdir, reporter=reporter)
        steps = samples = 0
        train_seconds = wait_total = 0.0
        staleness_seen = np.zeros(0, dtype=np.int64)
        for epoch in range(1, args.epochs + 1):
            t = self._epoch(epoch)
            steps, samples = steps + t["steps"], samples + t["samples"]
            train_seconds += t["seconds"]
            wait_total += t["wait"]
            self.opt.load_global_model()
            if comm.allreduce(int(t["nonfinite"]), op="max"):
                raise TrainingStopped(
                    f"stopped in epoch {epoch}: {args.max_nonfinite} gradients in a row held NaN or infinity "
                    f"on a worker (--max-nonfinite {args.max_nonfinite}); none was applied; lower --lr")
            stats = self.opt.stats()
            per_step = max(1, t["steps"])
            timing = {"compute_ms_per_step": comm.allreduce(1000.0 * t["compute"] / per_step) / workers}
            if t["blocked"] is not None:
                timing["exchange_blocked_ms_per_step"] = comm.allreduce(
                    1000.0 * (stats["exchange_wait_seconds"] - t["blocked"]) / per_step) / workers
            train_loss = comm.allreduce(t["loss"]) / workers
            losses = comm.gather(t["loss"])
            rates = comm.gather(t["samples"] / t["seconds"] if t["seconds"] > 0 else 0.0)
            waits = comm.gather(1000.0 * t["wait"] / per_step)
            accuracy = evaluate_accuracy(self.model, self.splits.test, self.rank, workers, comm)
            self.opt.strategy.after_evaluation()
            staleness = pooled_staleness(stats, comm)
            batch_sizes = comm.gather(stats.get("batch_size", args.batch_size))
            if reporter:
                self._report(metrics, epoch, accuracy, train_loss, rates, waits, losses, timing, batch_sizes,
                             staleness, staleness_seen, stats, t["seconds"])
            staleness_seen = staleness
        total_samples = comm.allreduce(samples)
        total_steps = comm.allreduce(steps)
        train_seconds = comm.allreduce(train_seconds, op="max")
        updates = self.opt.progress() if self.servers else steps * workers
        blocked = stats.get("exchange_wait_seconds")  # od-sgd, hpsgd, gossip, easgd: simulated seconds
        blocked = None if blocked is None else 1000.0 * comm.allreduce(blocked) / max(1, total_steps)
        self.opt.close()
        wall = comm.allreduce(self.clock(), op="max")
        self.transports[self.rank].close()  # the simulator built it: the optimizer leaves it open
        if not reporter:
            return None
        mean, largest = W.staleness_summary(staleness_seen)
        return metrics.finish(
            args.metrics_out, steps=steps, final_test_accuracy=metrics.history[-1]["test_accuracy"],
            final_train_loss=metrics.history[-1]["train_loss"], wall_seconds=round(wall, 6),
            train_seconds=round(train_seconds, 6), samples=total_samples,
            samples_per_second=total_samples / max(train_seconds, 1e-9),
            step_wait_ms_mean=1000.0 * wait_total / max(1, steps),
            exchange_blocked_ms_mean=blocked,
            staleness_mean=mean, staleness_max=largest, staleness_hist=staleness_seen.tolist(),
            batch_sizes=batch_sizes, server_ms_per_push=None, updates=updates, time_base="simulated",
            simulator=dict(_simulator_info(args), events=self.sched.events, exchanges=self.cluster.net.exchanges,
                           replay=self.cluster.replayed(self.transports)),  # every worker has closed
            **metrics.compensation(stats))

    def _report(self, metrics, epoch, accuracy, train_loss, rates, waits, losses, timing, batch_sizes,
                staleness, staleness_seen, stats, seconds) -> None:
        args = self.args
        entry = metrics.epoch(epoch, test_accuracy=accuracy, train_loss=train_loss,
                              worker_samples_per_second=rates, exchange_wait_ms=sum(waits) / args.workers,
                              timing=timing, worker_losses=losses, worker_exchange_wait_ms=waits)
        if self.source.shared is not None:
            entry["batch_sizes"] = batch_sizes
            metrics.per_worker("batch_size", batch_sizes, epoch)
        if self.servers:  # no server time is simulated: server_ms_per_push is left out
            server_stats = {k: v for k, v in stats.items() if k != "server_ms_per_push"}
            entry.update(metrics.server(epoch, pushes=self.opt.progress(), seconds=seconds, stats=server_stats))
        if staleness.sum() > staleness_seen.sum():
            metrics.staleness_histogram(staleness, staleness_seen, epoch)
        print(f"epoch {epoch}/{args.epochs}  train loss {train_loss:.4f}  test accuracy {accuracy:.4f}  "
              f"{sum(rates):.0f} samples/s  {entry['wall_seconds']:.1f} s simulated", file=sys.stderr, flush=True)


def _info(args) -> Dict:
    return {"algorithm": args.algo, "world_size": args.workers + args.servers, "workers": args.workers,
            "servers": args.servers, "dataset": args.dataset, "model": args.model, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "compute_ms": args.compute_ms,
            "stragglers": {str(k): v for k, v in args.stragglers.items()}}


def _simulator_info(args) -> Dict:
    return {"delay_dist": args.delay_dist, "compute_ms": args.compute_ms, "delay_shape": args.delay_shape,
            "latency_ms": args.latency_ms, "stragglers": {str(w): f for w, f in enumerate(factors(args)) if f != 1.0},
            "slow_workers": args.slow_workers, "slow_factor": args.slow_factor, "seed": args.seed}

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
import dataclasses
from typing import Dict, List, Optional

import torch

from .. import models, registry
from ..algorithms.base import parse_options
from ..config import ConfigError, algorithm_options
from ..metrics import RunMetrics
from ..optimizer import DistributedOptimizer
from ..transport.trace import Trace, Tracer
from ..worker_loop import Host, WorkerLoop
from .clock import Scheduler
from .collective import PeerWindows, SimCollectiveTransport, SimPeerTransport
from .delays import DelayModel
from .network import SimComm, SimNetwork
from .options import factors
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
            spec = cls.window_spec(options, numel, args.servers, args.workers)
            # the simulator models one inbox slot per worker and fp32 on the wire (no pool, no fp16)
            self.servers = SimServers(dataclasses.replace(spec, slots=0, wire="fp32"), cls.server_program)
        elif self.strategy_cls.peer_windows:
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
            if args.trace_out:
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
        return _worker(args, splits, cluster, _SimHost(cluster, delays[w], w, transports), transports)

    return cluster.sched.run(body)[0]


class _SimHost(Host):
    """A simulated worker: its virtual clock, compute drawn from its delay model (the clock moves on,
    and the draw counts as compute), no server time measured, no checkpoints."""

    seconds = "s simulated"
    server_time = False
    can_checkpoint = False

    def __init__(self, cluster: Cluster, delay: DelayModel, rank: int, transports: List):
        super().__init__("max")
        self.cluster, self.delay, self.rank, self.transports = cluster, delay, rank, transports
        self.sched = cluster.sched

    def clock(self) -> float:
        return self.sched.now(self.rank)

    def before_step(self, scale: float, last_work: float) -> float:
        compute = self.delay.draw(scale)
        self.sched.advance(self.rank, compute)
        return compute

    def finish(self, loop: WorkerLoop) -> dict:
        wall = loop.comm.allreduce(self.clock(), op="max")
        self.transports[self.rank].close()  # the simulator built it: the optimizer leaves it open
        if not loop.reporter:
            return {}
        args = loop.args
        return {"wall_seconds": round(wall, 6), "time_base": "simulated",
                "simulator": dict(_simulator_info(args), events=self.sched.events,
                                  exchanges=self.cluster.net.exchanges,
                                  replay=self.cluster.replayed(self.transports))}  # every worker has closed


def _worker(args, splits, cluster: Cluster, host: _SimHost, transports: List) -> Dict:
    """One simulated worker: what a real worker builds (after ``torch.manual_seed(seed)``), with its
    transport simulated, then the training job's loop on its clock."""
    rank = host.rank
    torch.manual_seed(args.seed)
    model = models.build_model(args.model, splits.input_shape, splits.num_classes)
    transport = transports[rank] = cluster.transport(rank)
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    opt = DistributedOptimizer(sgd, named_parameters=model.named_parameters(), algorithm=args.algo,
                               transport=transport, **algorithm_options(args))
    opt.begin()  # the exchange starts now, from the weights every worker holds (not at step 1)
    metrics = _SimMetrics(_info(args), clock=host.clock, logdir=args.logdir, reporter=rank == 0)
    return WorkerLoop(args, model=model, opt=opt, splits=splits, comm=SimComm(cluster.net, rank), host=host,
                      metrics=metrics, servers=args.servers > 0).run()


def _info(args) -> Dict:
    return {"algorithm": args.algo, "world_size": args.workers + args.servers, "workers": args.workers,
            "servers": args.servers, "dataset": args.dataset, "evaluated_on": args.eval_on, "model": args.model,
            "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "compute_ms": args.compute_ms,
            "stragglers": {str(k): v for k, v in args.stragglers.items()}}


def _simulator_info(args) -> Dict:
    return {"delay_dist": args.delay_dist, "compute_ms": args.compute_ms, "delay_shape": args.delay_shape,
            "latency_ms": args.latency_ms, "stragglers": {str(w): f for w, f in enumerate(factors(args)) if f != 1.0},
            "slow_workers": args.slow_workers, "slow_factor": args.slow_factor, "seed": args.seed}

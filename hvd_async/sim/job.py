"""The simulated training job: ``hvd_async.train``'s worker loop on every simulated worker, on the virtual clock.

Each worker builds what a real worker builds (``data.load_dataset``, ``models.build_model`` after
``torch.manual_seed(seed)``, a ``torch.optim.SGD`` wrapped in a real
:class:`hvd_async.DistributedOptimizer` whose transport the algorithm's own factory opens over
:class:`SimComms`, the simulator's stand-in for the job's communicators, the same seeded
samplers; dbs-asgd draws from :class:`~hvd_async.sampling.SharedCursorBatches` through the simulated
cursor) and runs the same epochs: the parameter-server algorithms push until the global progress
reaches ``epoch x`` batches-in-one-pass (at least one batch each), the others take one pass of their
``DistributedSampler``;
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
from ..config import ConfigError
from ..jobspec import JobSpec
from ..metrics import RunMetrics
from ..optimizer import DistributedOptimizer
from ..transport.trace import Trace, Tracer
from ..worker_loop import Host, WorkerLoop
from .clock import Scheduler
from .collective import PeerWindows, SimCollectiveTransport, SimPeerTransport
from .delays import DelayModel
from .network import SimComm, SimNetwork
from .options import SimOptions
from .windows import ReplayScript, SimServers, SimWindowTransport


class _SimMetrics(RunMetrics):
    """RunMetrics whose elapsed time is the reporting worker's simulated clock."""

    def __init__(self, info, *, clock, **kwargs):
        super().__init__(info, **kwargs)
        self._clock = clock

    def elapsed(self) -> float:
        return self._clock()


class Cluster:
    """What the workers share: the clock, the network, the servers or peer windows (opened by the first
    worker whose algorithm asks for them, as the real servers open their windows when worker 0 asks),
    and every worker's transport."""

    def __init__(self, spec: JobSpec, sim: SimOptions):
        self.spec, self.sim = spec, sim
        self.sched = Scheduler(sim.workers)
        self.net = SimNetwork(self.sched, sim.latency_ms / 1000.0)
        self.strategy_cls = registry.strategy_class(spec.algo)
        self.servers: Optional[SimServers] = None
        self.peers: Optional[PeerWindows] = None
        self.transports: List = [None] * sim.workers
        self.replay = None
        if sim.replay:
            try:
                self.replay = Trace(sim.replay)
                self._check_replay()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--replay {sim.replay}: {exc}") from None

    def _check_replay(self) -> None:
        trace, algo = self.replay, self.spec.algo
        if trace.workers != self.sim.workers:
            raise ValueError(f"the recorded run had {trace.workers} workers; use --workers {trace.workers}")
        recorded = trace.events[0][0].get("algorithm")
        if recorded != algo:
            raise ValueError(f"the recorded run is {recorded}, not {algo}")
        trace.check_order()

    def opened(self, rank: int, transport):
        self.transports[rank] = transport
        return transport

    def replayed(self) -> Optional[Dict]:
        """After a replay: how many pulls read exactly what the recorded ones read (None without one)."""
        if self.replay is None:
            return None
        transports = self.transports
        for t in transports:
            if not t.script.done:
                raise RuntimeError(f"replay diverged: worker {t.rank} stopped after {t.script.position} of its "
                                   f"{len(t.script.events)} recorded exchanges")
        return {"trace": self.sim.replay, "pulls": sum(t.script.matched + t.script.unmatched for t in transports),
                "pulls_matched": sum(t.script.matched for t in transports)}


class SimComms:
    """Worker ``rank``'s stand-in for :class:`hvd_async.runtime.Comms`: what the algorithm's own factory
    (``make_transport``) opens its transport with, here over the simulated network, the servers'
    memory and the peers' windows. The simulator models one inbox slot per worker and fp32 on the
    wire (no pool, no fp16) whatever the options ask for."""

    def __init__(self, cluster: Cluster, rank: int):
        self.cluster, self.rank = cluster, rank
        self.group = SimComm(cluster.net, rank)  # (its size: the workers)
        self.servers = cluster.spec.layout.servers

    def windows(self, spec):
        cluster, rank = self.cluster, self.rank
        if cluster.servers is None:
            cluster.servers = SimServers(dataclasses.replace(spec, slots=0, wire="fp32"),
                                         cluster.strategy_cls.server_program)
        tracer = Tracer(cluster.sim.trace_out, rank, spec.algorithm) if cluster.sim.trace_out else None
        script = ReplayScript(rank, cluster.replay.events[rank]) if cluster.replay is not None else None
        return cluster.opened(rank, SimWindowTransport(cluster.net, rank, cluster.servers, script=script,
                                                       tracer=tracer))

    def peers(self, numel: int, name: str, progress_interval: float):
        cluster = self.cluster
        if cluster.peers is None:
            cluster.peers = PeerWindows(cluster.sim.workers, numel)
        return cluster.opened(self.rank, SimPeerTransport(cluster.net, self.rank, cluster.peers))

    def collectives(self, process_set=None):
        return self.cluster.opened(self.rank, SimCollectiveTransport(self.cluster.net, self.rank))


def run_job(spec: JobSpec, sim: SimOptions, splits) -> Dict:
    """Simulate the job; returns the metrics record (the same keys as ``hvd_async.train``'s)."""
    job = spec.job
    cluster = Cluster(spec, sim)
    slow = sim.factors(job.stragglers)
    delays = [DelayModel(sim.delay_dist, mean_ms=job.compute_ms, shape=sim.delay_shape, seed=job.seed,
                         worker=w, factor=slow[w]) for w in range(sim.workers)]

    def body(w: int):
        return _worker(spec, splits, cluster, _SimHost(cluster, delays[w], w))

    return cluster.sched.run(body)[0]


class _SimHost(Host):
    """A simulated worker: its virtual clock, compute drawn from its delay model (the clock moves on,
    and the draw counts as compute), no server time measured, no checkpoints."""

    seconds = "s simulated"
    server_time = False
    can_checkpoint = False

    def __init__(self, cluster: Cluster, delay: DelayModel, rank: int):
        super().__init__("max")
        self.cluster, self.delay, self.rank = cluster, delay, rank
        self.sched = cluster.sched

    def clock(self) -> float:
        return self.sched.now(self.rank)

    def before_step(self, scale: float, last_work: float) -> float:
        compute = self.delay.draw(scale)
        self.sched.advance(self.rank, compute)
        return compute

    def finish(self, loop: WorkerLoop) -> dict:
        wall = loop.comm.allreduce(self.clock(), op="max")  # (every worker's optimizer has closed its transport)
        if not loop.reporter:
            return {}
        return {"wall_seconds": round(wall, 6), "time_base": "simulated",
                "simulator": dict(_simulator_info(loop.spec, self.cluster.sim), events=self.sched.events,
                                  exchanges=self.cluster.net.exchanges,
                                  replay=self.cluster.replayed())}


def _worker(spec: JobSpec, splits, cluster: Cluster, host: _SimHost) -> Dict:
    """One simulated worker: what a real worker builds (after ``torch.manual_seed(seed)``), its transport
    opened by the algorithm's own factory over the simulated network, then the training job's loop on
    its clock."""
    rank, job = host.rank, spec.job
    torch.manual_seed(job.seed)
    model = models.build_model(job.model, splits.input_shape, splits.num_classes)
    sgd = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum, weight_decay=job.weight_decay)
    opt = DistributedOptimizer(sgd, named_parameters=model.named_parameters(), algorithm=spec.algo,
                               comms=SimComms(cluster, rank), **spec.algorithm)
    opt.begin()  # the exchange starts now, from the weights every worker holds (not at step 1)
    metrics = _SimMetrics(spec.info(), clock=host.clock, logdir=job.logdir, reporter=rank == 0)
    return WorkerLoop(spec, model=model, opt=opt, splits=splits, comm=SimComm(cluster.net, rank), host=host,
                      metrics=metrics, servers=spec.layout.servers > 0).run()


def _simulator_info(spec: JobSpec, sim: SimOptions) -> Dict:
    factors = sim.factors(spec.job.stragglers)
    return {"delay_dist": sim.delay_dist, "compute_ms": spec.job.compute_ms, "delay_shape": sim.delay_shape,
            "latency_ms": sim.latency_ms, "stragglers": {str(w): f for w, f in enumerate(factors) if f != 1.0},
            "slow_workers": sim.slow_workers, "slow_factor": sim.slow_factor, "seed": spec.job.seed}

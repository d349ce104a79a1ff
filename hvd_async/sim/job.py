"""The simulated training job: ``hvd_async.job.train``'s worker loop on every simulated worker, on the virtual clock.

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
:class:`~hvd_async.delays.DelayModel`, scaled by the batch over the nominal one); the step's
forward and backward then run for real, and ``opt.step()`` takes whatever simulated time its
exchanges take (latency, waiting for others). Evaluation and metric reductions take none.
"""
from typing import Dict, List, Optional

import torch

from .. import models
from ..delays import DelayModel
from ..job.config import ConfigError
from ..job.jobspec import JobSpec
from ..job.worker_loop import Host, WorkerLoop
from ..metrics import RunMetrics
from ..optimizer import DistributedOptimizer
from ..transport import window
from ..transport.horovod import HorovodTransport
from ..transport.peer import PeerWindowTransport
from ..transport.trace import Trace, Tracer
from ..transport.window import WindowTransport
from .clock import Scheduler
from .horovod import SimHorovod
from .mpi import SimCommunicator, SimMPI, SimWorld
from .network import LoopComm, SimNetwork
from .options import SimOptions
from .windows import ReplayScript, ReplayTracer, SimServers


class _SimMetrics(RunMetrics):
    """RunMetrics whose elapsed time is the reporting worker's simulated clock."""

    def __init__(self, info, *, clock, **kwargs):
        super().__init__(info, **kwargs)
        self._clock = clock

    def elapsed(self) -> float:
        return self._clock()


class Cluster:
    """What the workers share: the clock, the network, the simulated ranks (:class:`~.mpi.SimWorld`:
    the parameter servers, which open the shards of a window transport when worker 0 sends them its
    spec, as the real servers do) and, under replay, every worker's recorded exchanges."""

    def __init__(self, spec: JobSpec, sim: SimOptions):
        self.spec, self.sim = spec, sim
        self.sched = Scheduler(sim.workers)
        self.net = SimNetwork(self.sched, sim.latency_ms / 1000.0)
        self.world = SimWorld(self.net, spec.layout.servers)
        self.world.handlers[("ctrl",)] = self._control
        self.algorithm = spec.algorithm.declaration
        self.servers: List[SimServers] = []
        self.scripts: Optional[List[ReplayScript]] = None
        self.replay = None
        if sim.replay:
            try:
                self.replay = Trace(sim.replay)
                self._check_replay()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--replay {sim.replay}: {exc}") from None
            self.scripts = [ReplayScript(w, self.replay.events[w]) for w in range(sim.workers)]

    def _control(self, source: int, server: int, tag: int) -> None:
        """A message on the job's control communicator to a server: worker 0 opening a window transport
        (``TAG_OPEN``, its spec to each server in turn; the shards open at the first)."""
        members = list(range(self.world.servers + self.sim.workers))
        spec = SimCommunicator(self.world, ("ctrl",), members, server).recv(source=source, tag=tag)
        if tag != window.TAG_OPEN:
            raise RuntimeError(f"simulated server {server}: unexpected control message (tag {tag})")
        if server == 0:  # the n-th transport: the n-th duplicate of the window communicator
            context = ("win", len(self.servers) + 1)
            self.servers.append(SimServers(self.world, context, spec, self.algorithm.server_program,
                                           self.scripts))

    def _check_replay(self) -> None:
        trace, algo = self.replay, self.spec.algo
        assert trace is not None  # called once the trace is read
        if trace.workers != self.sim.workers:
            raise ValueError(f"the recorded run had {trace.workers} workers; use --workers {trace.workers}")
        recorded = trace.events[0][0].get("algorithm")
        if recorded != algo:
            raise ValueError(f"the recorded run is {recorded}, not {algo}")
        trace.check_order()

    def replayed(self) -> Optional[Dict]:
        """After a replay: how many pulls read exactly what the recorded ones read (None without one)."""
        if self.replay is None:
            return None
        scripts = self.scripts
        assert scripts is not None  # made with the replay
        for s in scripts:
            if not s.done:
                raise RuntimeError(f"replay diverged: worker {s.rank} stopped after {s.position} of its "
                                   f"{len(s.events)} recorded exchanges")
        return {"trace": self.sim.replay, "pulls": sum(s.matched + s.unmatched for s in scripts),
                "pulls_matched": sum(s.matched for s in scripts)}


class SimComms:
    """Worker ``rank``'s stand-in for :class:`hvd_async.runtime.Comms`: the same communicators (the
    workers, the job's control and window communicators) and the ``MPI`` they belong to, here the
    simulator's (:mod:`.mpi`: memory and the virtual clock), over which the algorithm's own factory
    (its declaration's ``make_transport``) opens the real window, peer and Horovod transports; Horovod is the
    simulator's too (:mod:`.horovod`)."""

    def __init__(self, cluster: Cluster, rank: int):
        self.cluster, self.rank = cluster, rank
        world = cluster.world
        me, everyone = world.servers + rank, list(range(world.servers + cluster.sim.workers))
        self.mpi = SimMPI
        self.group = SimCommunicator(world, ("group",), everyone[world.servers:], me)
        self.ctrl = SimCommunicator(world, ("ctrl",), everyone, me)
        self.win_comm = SimCommunicator(world, ("win",), everyone, me)
        self.servers = world.servers
        self.oversubscribed = False  # (the simulated workers' waits take no core: they are virtual)

    def clock(self) -> float:
        return self.cluster.sched.now(self.rank)

    def tracer(self, rank: int, algorithm: str, mode: str):
        cluster = self.cluster
        tracer = Tracer(cluster.sim.trace_out, rank, algorithm) if cluster.sim.trace_out else None
        if cluster.scripts is None:
            return tracer
        return ReplayTracer(cluster.scripts[rank], cluster.servers[-1], rank, tracer)

    def windows(self, spec):
        return WindowTransport.open(spec, self)

    def peers(self, numel: int, name: str, progress_interval: float):
        # (the simulator's windows need no calls into MPI to progress: the transport's progress thread
        # wakes as rarely as it can instead of taking the interpreter from the simulated workers)
        return PeerWindowTransport(numel, comms=self, name=name, progress_interval=1.0)

    def collectives(self, process_set=None):
        return HorovodTransport(process_set, horovod=SimHorovod(self.cluster.net, self.rank), clock=self.clock)


def run_job(spec: JobSpec, sim: SimOptions, splits) -> Dict:
    """Simulate the job; returns the metrics record (the same keys as ``hvd_async.job.train``'s)."""
    cluster = Cluster(spec, sim)
    delays = worker_delays(spec, sim)

    def body(w: int):
        return _worker(spec, splits, cluster, _SimHost(cluster, delays[w], w))

    return cluster.sched.run(body)[0]


def worker_delays(spec: JobSpec, sim: SimOptions) -> List[DelayModel]:
    """Each simulated worker's device times: the training job's model (:mod:`hvd_async.delays`), with
    ``--slow-workers`` on top of ``--straggler``."""
    slow = sim.factors(spec.job.stragglers)
    return [DelayModel.of_job(spec.job, w, slow[w]) for w in range(sim.workers)]


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

    def before_step(self, scale: float) -> float:
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
                               comms=SimComms(cluster, rank), **spec.algorithm.given)
    opt.begin()  # the exchange starts now, from the weights every worker holds (not at step 1)
    metrics = _SimMetrics(spec.info(), clock=host.clock, logdir=job.logdir, reporter=rank == 0)
    return WorkerLoop(spec, model=model, opt=opt, splits=splits, comm=LoopComm(cluster.net, rank), host=host,
                      metrics=metrics, servers=spec.layout.servers > 0).run()


def _simulator_info(spec: JobSpec, sim: SimOptions) -> Dict:
    factors, job = sim.factors(spec.job.stragglers), spec.job
    return {"delay_dist": job.delay_dist, "compute_ms": job.compute_ms, "delay_shape": job.delay_shape,
            "latency_ms": sim.latency_ms, "stragglers": {str(w): f for w, f in enumerate(factors) if f != 1.0},
            "slow_workers": sim.slow_workers, "slow_factor": sim.slow_factor, "seed": spec.job.seed}

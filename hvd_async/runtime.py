"""Process roles: MPI and Horovod start-up, the server/worker split, and an orderly shutdown.

World ranks ``0 .. servers-1`` are parameter servers, the rest are workers. Launched with
``mpirun --map-by node`` this puts one server on each of the first nodes. Horovod is initialised
over the workers' communicator only, so server ranks never join an allreduce.
"""
import atexit
import io
import logging
import os
import numbers
import sys
import time
import traceback
from enum import Enum
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional, Set

from . import failures, logs, server

if TYPE_CHECKING:
    from .transport.base import Transport

logger = logging.getLogger(__name__)


class Role(Enum):
    SERVER = "server"   # holds global weights (window shards), runs serve()
    WORKER = "worker"   # computes gradients, runs the training loop


class _Runtime:
    def __init__(self, servers: int):
        from mpi4py import MPI

        self.world = MPI.COMM_WORLD
        self.servers = servers
        self.role = Role.SERVER if self.world.rank < servers else Role.WORKER
        self.ctrl = self.world.Dup()  # control messages (done, ...) apart from user traffic
        self.win_comm = self.world.Dup()  # parent of each window transport's own communicator
        # transports DistributedOptimizers built here and still open: closed at shutdown
        self.transports: List["Transport"] = []
        self.group = self.world.Split(color=0 if self.role is Role.WORKER else 1, key=self.world.rank)
        self.exits = self.group.Dup()  # a worker whose process exits tells the others here (departed())
        self.failures = self.world.Dup()  # a rank ending the job on an uncaught error says so here
        self.departed: Set[int] = set()
        self.finished = False
        # (collective, once) this rank's CPUs and those of every rank on its node: the torch threads it
        # should run (threads_per_rank), and whether a server's loop gives its core away while it spins
        self.node_cpus = _node_cpus(self.world)
        self.oversubscribed = oversubscribed(*self.node_cpus)


_rt: Optional[_Runtime] = None


def init(servers: int = 0, *, serve: bool = False) -> None:
    """Start MPI and Horovod and give this process its role.

    Horovod is initialised over the workers only, so the script's own ``hvd.rank()``, ``hvd.size()``,
    ``hvd.broadcast_parameters`` count workers, and a later ``hvd.init()`` changes nothing. An
    uncaught exception on any rank ends the whole job (its traceback first), never a hang.

    Args:
        servers: how many of the job's MPI processes are parameter servers (0 for ssgd, hpsgd and
            gossip; 1 or more for the parameter-server algorithms). Must leave at least one worker.
        serve: on a server rank, serve until every worker has finished and then end the process
            (exit status 0), so that a Horovod script needs no server branch of its own; workers
            return from ``init`` as usual. Default False: call :func:`serve` yourself.

    Example::

        import hvd_async as ha
        ha.init(servers=1, serve=True)   # server ranks never return from here
        opt = ha.DistributedOptimizer(..., algorithm="asgd")

    An error ``init`` raises (a bad argument, a launch it cannot use), if the script does not catch
    it, is one line naming the script's call (``HVD_ASYNC_DEBUG=1`` prints the traceback too).
    """
    try:
        _init(servers, serve)
    except Exception:
        if sys.excepthook is sys.__excepthook__:  # (the hook does nothing for an error the script catches)
            sys.excepthook = _end_job_on_uncaught
        raise


def _whole_lines(stream: Any) -> None:
    """Make each line ``stream`` is given one write to its file.

    Unbuffered (``python -u``, ``PYTHONUNBUFFERED``, as ranks are often launched and as ``hvd-async``
    launches them), ``print`` writes a line's text and its newline separately, and mpirun, forwarding
    every rank's output, can put another rank's line between the two. Line buffering writes each line
    whole and still at once; text without a newline waits for the next one or for ``flush()``.
    """
    if isinstance(stream, io.TextIOWrapper) and stream.write_through:
        stream.reconfigure(write_through=False, line_buffering=True)


def _init(servers: int, serve: bool) -> None:
    global _rt
    if isinstance(servers, bool) or not isinstance(servers, numbers.Integral) or servers < 0:
        raise ValueError(f"servers must be an integer >= 0, got {servers!r}")
    if not isinstance(serve, bool):
        raise ValueError(f"serve must be True or False, got {serve!r}")
    if _rt is not None:
        if _rt.servers != servers:
            raise RuntimeError(f"hvd_async.init() was already called with servers={_rt.servers}; "
                               f"it cannot be called again with servers={servers}")
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD.size
    launched = os.environ.get("HOROVOD_SIZE")
    if launched and launched.isdigit() and int(launched) != world:
        raise RuntimeError(
            f"this process sees {world} MPI process(es) but horovodrun started {launched}: it launched "
            f"with Gloo, and hvd_async needs MPI (its parameter servers use MPI windows); use "
            f"'horovodrun --mpi' or mpirun")
    if servers >= world:
        raise ValueError(
            f"servers={servers} leaves no worker: the job has {world} MPI process(es) in all; "
            f"use servers < {world} or launch more processes (mpirun -np, hvd-async train --np)")
    rt = _Runtime(int(servers))
    if world > 1:
        _whole_lines(sys.stdout)
        _whole_lines(sys.stderr)
    logs.configure(rt.role.value, rt.group.rank)
    if rt.role is Role.WORKER:
        import horovod.torch as hvd

        hvd.init(comm=rt.group)
    _rt = rt
    atexit.register(_shutdown_at_exit)
    if world > 1:
        sys.excepthook = _end_job_on_uncaught
    logger.info("started: world rank %d of %d, %s %d", rt.world.rank, world, rt.role.value, rt.group.rank)
    if serve and rt.role is Role.SERVER:
        globals()["serve"]()
        sys.exit(0)


# How long a failing rank hears the other ranks' failures before it says its own and ends the job:
# ranks that fail at the same point (a bad option on every worker) then say it once.
ABORT_GRACE_SECONDS = 1.0


TAG_EXIT = 7302  # on _Runtime.exits: this worker's process is exiting


def _end_job_on_uncaught(exc_type, exc, tb) -> None:
    """sys.excepthook: say what failed, then end every rank of the job (MPI_Abort): the others may
    sit in a collective or a window this rank will never join. An error several ranks raise alike is
    said once, by the lowest of them; where it is only that another worker has left (its process
    exited, or it closed its transport), or a bad argument to the library, one line says so without
    the traceback (``HVD_ASYNC_DEBUG=1`` prints it too)."""
    from mpi4py import MPI

    debug = bool(os.environ.get("HVD_ASYNC_DEBUG"))
    line = departure_message(exc)
    if line is None and _rt is not None:
        line = failures.bad_input_line(exc, tb, f"{_rt.role.value} {_rt.group.rank}")
    elif line is None:  # raised by init: its own refusals (a RuntimeError: the launch) are one line too
        line = failures.bad_input_line(exc, tb, f"rank {MPI.COMM_WORLD.rank}", kinds=(ValueError, TypeError,
                                                                                      RuntimeError))
    key = f"{exc_type.__name__}: {exc}"
    world = _rt.world if _rt is not None else MPI.COMM_WORLD
    told = _rt.failures if _rt is not None else world  # (before init made its communicators: the world's)
    if world.size > 1 and failures.lowest_alike(told, key, ABORT_GRACE_SECONDS) is not None and not debug:
        time.sleep(3 * ABORT_GRACE_SECONDS)  # a lower rank says it and ends the job meanwhile
        failures.abort(world, 1)
    if line is None or debug:
        sys.__excepthook__(exc_type, exc, tb)
    if line is not None:
        sys.stderr.write(line + "\n")
    if world.size > 1:  # (a process alone just ends, with status 1)
        failures.abort(world, 1)  # the grace was spent hearing the other ranks


def departed() -> List[int]:
    """Workers whose processes have told this one they are exiting (the exit hook)."""
    from mpi4py import MPI

    rt = _rt
    if rt is None or rt.role is not Role.WORKER:
        return []
    import numpy as np

    status, note = MPI.Status(), np.zeros(1, dtype=np.int64)
    while rt.exits.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_EXIT, status=status):
        rt.exits.Recv(note, source=status.Get_source(), tag=TAG_EXIT)
        rt.departed.add(status.Get_source())
    return sorted(rt.departed)


def departure_message(exc) -> Optional[str]:
    """One line naming the workers that left, where ``exc`` is only the consequence of their leaving
    (a collective that cannot complete without them); None otherwise."""
    from .transport.leave import PeerLeftError

    horovod_gone = type(exc).__name__ == "HorovodInternalError" and "has been shut down" in str(exc)
    if not (isinstance(exc, PeerLeftError) or horovod_gone) or _rt is None or _rt.role is not Role.WORKER:
        return None
    me = _rt.group.rank
    if isinstance(exc, PeerLeftError):
        return f"hvd_async: error: worker {me}: {exc}"
    gone = departed()
    if not gone:
        return None
    return (f"hvd_async: error: worker {me}: worker(s) {', '.join(map(str, gone))} left the job (the process "
            f"exited) while this worker still trains: Horovod's collectives cannot go on without it; "
            f"ending the job (its own message, if any, is above)")


def _abort(code: int, grace: float = ABORT_GRACE_SECONDS) -> None:
    failures.abort(_runtime().world, code, wait=grace)


def _runtime() -> _Runtime:
    if _rt is None:
        raise RuntimeError("hvd_async is not initialised: call hvd_async.init() first")
    return _rt


def _worker_runtime(what: str) -> _Runtime:
    rt = _runtime()
    if rt.role is not Role.WORKER:
        raise RuntimeError(f"{what} is for worker processes; this is server {rt.group.rank} "
                           f"(world rank {rt.world.rank}): call hvd_async.serve() there instead")
    return rt


def is_initialized() -> bool:
    return _rt is not None


def is_server() -> bool:
    return _runtime().role is Role.SERVER


def is_worker() -> bool:
    return _runtime().role is Role.WORKER


def rank() -> int:
    """This worker's rank among the workers (0 .. size()-1)."""
    return _worker_runtime("rank()").group.rank


def size() -> int:
    """The number of workers (server ranks not counted)."""
    return _runtime().world.size - _runtime().servers


def local_rank() -> int:
    """This worker's rank among the workers on its node (Horovod's local_rank)."""
    _worker_runtime("local_rank()")
    import horovod.torch as hvd

    return hvd.local_rank()


def world_rank() -> int:
    return _runtime().world.rank


def world_size() -> int:
    return _runtime().world.size


def num_servers() -> int:
    return _runtime().servers


def server_ranks() -> List[int]:
    """World ranks of the parameter servers."""
    return list(range(_runtime().servers))


def worker_ranks() -> List[int]:
    """World ranks of the workers, in worker-rank order."""
    rt = _runtime()
    return list(range(rt.servers, rt.world.size))


def cpu_share(mine, node: List) -> int:
    """How many threads a process should run: the CPUs it may run on (``mine``, a set), divided among
    the processes of its node (``node``: each one's set, ``mine`` among them) whose CPUs overlap it.

    So it holds under every launcher: srun binding each task to its ``--cpus-per-task`` CPUs (no
    overlap: all of them), srun ``--cpu-bind=none`` or mpirun without binding (everyone overlaps:
    the node's CPUs over the node's ranks, not over the job's), mpirun ``--bind-to socket`` (the
    socket's CPUs over the ranks on that socket)."""
    sharing = sum(1 for cpus in node if cpus & mine) or 1
    return max(1, len(mine) // sharing)


def oversubscribed(mine, node: List) -> bool:
    """Whether more of the node's processes (``node``: each one's CPU set, ``mine`` among them) may run
    on this process's CPUs (``mine``) than there are of them."""
    return sum(1 for cpus in node if cpus & mine) > len(mine)


def threads_per_rank() -> int:
    """:func:`cpu_share` of this process, from the CPU affinity of every rank on its node (servers and
    workers: they share the node's cores), as gathered at :func:`init`."""
    return cpu_share(*_runtime().node_cpus)


def _node_cpus(world):
    """``(mine, node)``: the CPUs this process may run on, and each one's of the processes on its node
    (``mine`` among them). Collective over ``world``."""
    from mpi4py import MPI

    mine = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return mine, node.allgather(mine)
    finally:
        node.Free()


def worker_comm():
    """The mpi4py communicator of the workers (what Horovod runs over)."""
    return _worker_runtime("worker_comm()").group


def serve(*, poll_interval: float = 0.0005, spin_seconds: float = 0.05,
          worker_timeout: Optional[float] = None, spin_yield: Optional[bool] = None,
          threads: Optional[int] = None) -> server.ServerReport:
    """Run the server loop until every worker has finished (see :mod:`hvd_async.server`).

    Args:
        poll_interval: sleep per loop turn while no worker is active.
        spin_seconds: after the last sign of activity, keep turning without sleeping this long.
        worker_timeout: seconds after which an aggregate (softsync, od-sgd) stops waiting for a
            worker that sent nothing; None waits for ever.
        spin_yield: while turning, give the core to any other runnable process at every turn
            (``sched_yield``). None (default): only where this node runs more processes on the
            server's CPUs than there are CPUs (:func:`oversubscribed`), as MPI libraries do in their
            own waits. A server that yields while a worker's gradient comes in over TCP receives it
            several times slower (the guide's cluster section).
        threads: torch's intra-op threads the server programs' rules run on (a push of a large shard is
            split across them). None (default): this rank's share of its node's cores
            (:func:`threads_per_rank`). A server on a node of its own gets every core; where it shares
            the node with busy workers, each thread it runs is taken from them.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"serve(): threads must be an integer >= 1 (torch's threads for the servers' rules) or "
                         f"None (this rank's share of its node's cores), got {threads!r}")
    for name, value in (("poll_interval", poll_interval), ("spin_seconds", spin_seconds),
                        ("worker_timeout", worker_timeout)):
        if value is None and name == "worker_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf") \
                or (name == "worker_timeout" and value == 0):
            raise ValueError(f"serve(): {name} must be a finite number of seconds "
                             f"{'> 0 (or None)' if name == 'worker_timeout' else '>= 0'}, got {value!r}")
    if spin_yield is not None and not isinstance(spin_yield, bool):
        raise ValueError(f"serve(): spin_yield must be True, False or None (where the node is oversubscribed), "
                         f"got {spin_yield!r}")
    rt = _runtime()
    if rt.role is not Role.SERVER:
        raise RuntimeError(f"serve() is for server processes; this is worker {rt.group.rank}")
    import torch

    torch.set_num_threads(threads_per_rank() if threads is None else threads)
    try:
        report = server.run(rt.ctrl, worker_ranks(), poll_interval=poll_interval, spin_seconds=spin_seconds,
                            win_comm=rt.win_comm, worker_timeout=worker_timeout,
                            spin_yield=rt.oversubscribed if spin_yield is None else spin_yield)
    except BaseException as exc:  # the workers would wait for this server for ever: end the job
        sys.stderr.write(f"hvd_async: server {rt.group.rank} (world rank {rt.world.rank}) failed, ending "
                         f"the job: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        _abort(1)
        raise
    shutdown()  # this server is done: it frees the runtime's communicators
    return report


class Comms(NamedTuple):
    """The communicators a worker's transports run over, handed to the algorithm's factory
    (its declaration's ``make_transport``), and the carrier that opens each kind of transport over them:
    the declarations say which transport they need (``windows``, ``peers``, ``collectives``), the carrier builds it. Here
    MPI and Horovod; the simulator passes a stand-in with the same three methods
    (:class:`hvd_async.sim.job.SimComms`), so the job and the simulator share one factory."""

    group: Any     # the workers (what Horovod runs over)
    ctrl: Any      # the whole job: control messages (a window transport's opening, to the servers)
    win_comm: Any  # the whole job: the parent of each window transport's own communicator
    servers: int   # world ranks 0 .. servers - 1 are the parameter servers
    mpi: Any       # what the transports call as ``MPI``: mpi4py's (the simulator's: in memory)
    # more of this node's processes than cores: a worker waiting for its servers' answer then gives its
    # core away between checks instead of spinning in MPI's wait (:func:`oversubscribed`)
    oversubscribed: bool = False

    @staticmethod
    def clock() -> float:
        """Seconds, for the transports' speeds and waits (the simulator's: the worker's virtual clock)."""
        return time.perf_counter()

    @staticmethod
    def tracer(rank: int, algorithm: str, mode: str):
        """The record of a window transport's pushes and pulls, when ``HVD_ASYNC_WINDOW_TRACE`` asks for one."""
        from .transport.trace import Tracer

        return Tracer.from_env(rank, algorithm, mode)

    def windows(self, spec):
        """The worker side of the servers' windows that ``spec`` describes (collective over the job)."""
        from .transport.window import WindowTransport

        return WindowTransport.open(spec, self)

    def peers(self, numel: int, name: str, progress_interval: float):
        """Every worker's window of ``numel`` floats that the others read and add into (gossip)."""
        from .transport.peer import PeerWindowTransport

        return PeerWindowTransport(numel, comms=self, name=name, progress_interval=progress_interval)

    def collectives(self, process_set=None):
        """Horovod's collectives, over ``process_set``'s workers where one is given."""
        from .transport.horovod import HorovodTransport

        return HorovodTransport(process_set)


def comms(what: str = "a transport") -> Comms:
    """This worker's :class:`Comms` (``what``: who asks, named in the error on a server rank)."""
    rt = _worker_runtime(what)
    if rt.finished:
        raise RuntimeError(f"{what} cannot start: hvd_async.shutdown() has run on this worker (its "
                           f"communicators are freed); build transports and optimizers before it")
    from mpi4py import MPI

    return Comms(rt.group, rt.ctrl, rt.win_comm, rt.servers, MPI, rt.oversubscribed)


def register_transport(transport) -> None:
    """Close ``transport`` at shutdown if it is still open then (the optimizer that built it registers it)."""
    _runtime().transports.append(transport)


def unregister_transport(transport) -> None:
    if _rt is not None and transport in _rt.transports:
        _rt.transports.remove(transport)


def _shutdown_at_exit() -> None:
    """The exit hook: as :func:`shutdown`, but first, on a worker, stop Horovod as Horovod's own exit
    hook does (after closing the transports that run over it), and tell the other workers this one is
    exiting. This process will join no collective again: a worker still training then gets Horovod's
    error at its next allreduce ("one of the ranks finished execution") instead of waiting there for
    ever while this one waits for it to close the windows (transport/leave.py), and its error names
    this worker (:func:`departure_message`)."""
    rt = _rt
    if rt is None or rt.finished:
        return
    if rt.role is Role.WORKER:
        import horovod.torch as hvd
        import numpy as np

        note = np.zeros(1, dtype=np.int64)
        sends = [rt.exits.Isend(note, dest=r, tag=TAG_EXIT) for r in range(rt.group.size) if r != rt.group.rank]
        for transport in [t for t in rt.transports if not t.closes_collectively]:
            transport.close()
            rt.transports.remove(transport)
        if hvd.is_initialized():
            hvd.shutdown()
        shutdown()
        from mpi4py import MPI

        MPI.Request.Waitall(sends)  # (small messages: complete once sent, received or not)
        return
    shutdown()


def shutdown() -> None:
    """Close the transports this worker's optimizers built and left open, tell every server it has finished,
    and free the runtime's communicators (idempotent; also runs at interpreter exit)."""
    rt = _rt
    if rt is None or rt.finished:
        return
    rt.finished = True
    if rt.role is Role.WORKER:
        for transport in list(rt.transports):
            transport.close()
        for dest in server_ranks():
            rt.ctrl.send(None, dest=dest, tag=server.TAG_DONE)
    # the runtime's duplicates of the world (freeing is local in effect: a rank that never gets here,
    # a dropped worker, holds no one up); the workers' group stays, Horovod may still run over it
    rt.ctrl.Free()
    rt.win_comm.Free()

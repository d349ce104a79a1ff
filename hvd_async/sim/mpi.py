"""The simulator's MPI: the part of ``mpi4py.MPI`` the real transports call, in memory and on the virtual clock.

The simulator opens the real :class:`~hvd_async.transport.window.WindowTransport` and
:class:`~hvd_async.transport.peer.PeerWindowTransport` (through the algorithm's own factory) over
:class:`SimMPI` instead of ``mpi4py.MPI``: the same calls (``Win.Allocate``, ``Get``, ``Put``,
``Accumulate``, ``Fetch_and_op``, ``Get_accumulate``, their request forms, ``Flush``, ``Lock``,
``Send``/``Recv``, ``Ibarrier``, ``allgather``, ``Bcast``, ``Reduce``), carried by plain memory:

- **One-sided operations** take effect when the caller completes them (a ``Flush``, an ``Unlock``, a
  request's ``Wait``), one latency after the earliest of them was issued: the worker's clock moves
  on to then (letting the others run), and its operations then apply in the order they were issued.
  A round trip the real transport waits for costs one latency; operations issued together share it.
- **Messages** arrive one latency after they were sent. A message to a parameter server is served at
  once, by the real :class:`~hvd_async.transport.window.ShardHost` on the simulated servers'
  memory (:mod:`.windows`): the servers have no clock of their own and take no time.
- **Collectives** (``Ibarrier``, ``allgather``, ``Bcast``, ``Reduce``) go through
  :class:`~hvd_async.sim.network.SimNetwork`: they complete one latency after the last worker arrives.
- **Waiting** blocks the worker's thread on the virtual clock (``Scheduler.wait_until``), never on
  the wall clock: a request's ``Test`` completes it and returns True, so that a loop polling a
  request (``LeaveWatch.wait``) lets the other simulated workers run instead of spinning.

Only one simulated worker runs at a time, so nothing here needs a lock.
"""
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .clock import current
from .network import Calls, SimNetwork, rank_sum


class Datatype:
    """An MPI datatype: the numpy type of its elements."""

    def __init__(self, name: str, dtype):
        self.name, self.dtype = name, np.dtype(dtype)

    def __repr__(self) -> str:
        return f"SimMPI.{self.name}"


class Op:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"SimMPI.{self.name}"


SUM, NO_OP, REPLACE = Op("SUM"), Op("NO_OP"), Op("REPLACE")
FLOAT, DOUBLE = Datatype("FLOAT", np.float32), Datatype("DOUBLE", np.float64)
INT64_T, UINT16_T = Datatype("INT64_T", np.int64), Datatype("UINT16_T", np.uint16)
_TYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.float64): DOUBLE, np.dtype(np.int64): INT64_T,
          np.dtype(np.uint16): UINT16_T, np.dtype(np.float16): UINT16_T}


def _origin(buf) -> np.ndarray:
    """The flat array of an mpi4py buffer argument (``array`` or ``[array, datatype]``) in the datatype."""
    if isinstance(buf, (list, tuple)):
        array, datatype = buf[0], buf[1]
    else:
        array, datatype = buf, _TYPES[np.asarray(buf).dtype]
    array = np.asarray(array).reshape(-1)
    return array if array.dtype == datatype.dtype else array.view(datatype.dtype)


def _apply(op: Op, target: np.ndarray, origin: np.ndarray) -> None:
    if op is SUM:
        target += origin
    elif op is REPLACE:
        target[:] = origin
    elif op is not NO_OP:
        raise ValueError(f"the simulator's MPI has no operation {op!r}")


class SimRequest:
    """A request: ``Wait`` runs ``complete`` once; ``Test`` waits too (see the module docstring)."""

    def __init__(self, complete: Callable[[], None]):
        self._complete, self._done = complete, False

    def Wait(self) -> None:  # noqa: N802 - mpi4py's names
        if not self._done:
            self._done = True
            self._complete()

    def Test(self) -> bool:  # noqa: N802
        self.Wait()
        return True

    @staticmethod
    def Waitall(requests) -> None:  # noqa: N802
        for request in requests:
            request.Wait()


_DONE = SimRequest(lambda: None)


class SimStatus:
    """``MPI.Status`` as the simulator's probes fill it: the source and tag of the message found."""

    def __init__(self):
        self.source, self.tag = -1, -1

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag


class Link:
    """One worker's one-sided operations not yet completed: ``(time issued, effect)``, in issue order."""

    def __init__(self, world: "SimWorld", worker: int):
        self.world, self.worker = world, worker
        self.pending: List[Tuple[float, Callable[[], None]]] = []

    def issue(self, effect: Callable[[], None]) -> None:
        self.pending.append((self.world.now(self.worker), effect))

    def complete(self) -> None:
        """Every operation issued so far takes effect, one latency after the first was issued."""
        if not self.pending:
            return
        self.world.arrive(self.worker, self.pending[0][0] + self.world.net.latency)
        pending, self.pending = self.pending, []
        for _, effect in pending:
            effect()


class SimWin:
    """One rank's handle on a window: every member's memory (bytes), ``disp_unit`` bytes per displacement."""

    def __init__(self, comm: "SimCommunicator", memory: List[np.ndarray], disp_unit: int, hooks=None):
        self.comm, self.memory, self.disp_unit = comm, memory, disp_unit
        self.hooks = hooks or {}  # (target rank, operation name) -> called before that operation applies
        self._link = comm.world.link(comm.world_rank)

    @classmethod
    def Allocate(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> "SimWin":  # noqa: N802
        return comm.world.allocate(comm, int(size), int(disp_unit))

    def tomemory(self) -> memoryview:
        return memoryview(self.memory[self.comm.rank])  # type: ignore[arg-type]  # numpy's stubs: a Buffer on 3.12+

    def Get_attr(self, key):  # noqa: N802 - the memory model: one copy of the memory
        return WIN_UNIFIED

    def _view(self, rank: int, target, like: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s memory at ``target``: ``(disp, count, datatype)``, or a displacement (None: 0)
        at which ``like``'s elements lie."""
        if not isinstance(target, tuple):
            target = (target or 0, like.size, _TYPES[like.dtype])
        disp, count, datatype = target
        start = disp * self.disp_unit
        raw = self.memory[rank][start:start + count * datatype.dtype.itemsize]
        if raw.size != count * datatype.dtype.itemsize:
            raise ValueError(f"a window access past the end of rank {rank}'s memory ({self.memory[rank].size} bytes)")
        return raw.view(datatype.dtype)

    def _issue(self, name: str, rank: int, effect: Callable[[], None]) -> None:
        hook = self.hooks.get((rank, name))
        if hook is not None:
            worker, then = self._link.worker, effect

            def effect():
                hook(worker)
                then()

        self._link.issue(effect)

    def Get(self, origin, rank: int, target=None) -> None:  # noqa: N802
        out = _origin(origin)
        self._issue("Get", rank, lambda: np.copyto(out, self._view(rank, target, out)))

    def Put(self, origin, rank: int, target=None) -> None:  # noqa: N802
        data = _origin(origin)
        self._issue("Put", rank, lambda: np.copyto(self._view(rank, target, data), data))

    def Accumulate(self, origin, rank: int, target=None, op=SUM) -> None:  # noqa: N802
        data = _origin(origin)
        self._issue("Accumulate", rank, lambda: _apply(op, self._view(rank, target, data), data))

    def Get_accumulate(self, origin, result, rank: int, target=None, op=SUM) -> None:  # noqa: N802
        data, out = _origin(origin), _origin(result)

        def effect():
            view = self._view(rank, target, out)
            np.copyto(out, view)
            _apply(op, view, data)

        self._issue("Get_accumulate", rank, effect)

    def Fetch_and_op(self, origin, result, rank: int, target_disp: int = 0, op=SUM) -> None:  # noqa: N802
        out = _origin(result)
        self.Get_accumulate(origin, result, rank, target=(target_disp, 1, _TYPES[out.dtype]), op=op)

    def _requested(self, issue) -> SimRequest:
        issue()
        return SimRequest(self._link.complete)

    def Rget(self, origin, rank: int, target=None) -> SimRequest:  # noqa: N802
        return self._requested(lambda: self.Get(origin, rank, target))

    def Raccumulate(self, origin, rank: int, target=None, op=SUM) -> SimRequest:  # noqa: N802
        return self._requested(lambda: self.Accumulate(origin, rank, target, op))

    def Rget_accumulate(self, origin, result, rank: int, target=None, op=SUM) -> SimRequest:  # noqa: N802
        return self._requested(lambda: self.Get_accumulate(origin, result, rank, target, op))

    def Flush(self, rank: int) -> None:  # noqa: N802
        self._link.complete()

    def Flush_all(self) -> None:  # noqa: N802
        self._link.complete()

    def Unlock(self, rank: int) -> None:  # noqa: N802
        self._link.complete()

    def Unlock_all(self) -> None:  # noqa: N802
        self._link.complete()

    def Lock(self, rank: int, lock_type=None) -> None:  # noqa: N802 - one worker runs at a time: no contention
        pass

    def Lock_all(self) -> None:  # noqa: N802
        pass

    def Sync(self) -> None:  # noqa: N802
        pass

    def Free(self) -> None:  # noqa: N802
        self._link.complete()


class Message:
    __slots__ = ("source", "tag", "payload", "arrival")

    def __init__(self, source: int, tag: int, payload, arrival: float):
        self.source, self.tag, self.payload, self.arrival = source, tag, payload, arrival


class SimCommunicator:
    """One rank's handle on a communicator: ``members`` (world ranks, in the communicator's order) and
    the context that keeps its messages and collectives apart from other communicators'."""

    def __init__(self, world: "SimWorld", context: Tuple, members: List[int], world_rank: int):
        self.world, self.context, self.members, self.world_rank = world, context, members, world_rank
        self.rank, self.size = members.index(world_rank), len(members)
        self._dups = 0
        self._calls = Calls()

    # --- communicators ------------------------------------------------------------------------
    def Dup(self) -> "SimCommunicator":  # noqa: N802 - every rank duplicates in the same order
        self._dups += 1
        return SimCommunicator(self.world, self.context + (self._dups,), self.members, self.world_rank)

    def Split_type(self, split_type, key: int = 0, info=None) -> "SimCommunicator":  # noqa: N802 - one simulated node
        return self.Dup()

    def Get_group(self) -> "SimCommunicator":  # noqa: N802
        return self

    def Translate_ranks(self, ranks, group) -> List[int]:  # noqa: N802
        return [group.members.index(self.members[r]) for r in ranks]

    def Free(self) -> None:  # noqa: N802
        pass

    # --- messages ---------------------------------------------------------------------------
    def send(self, obj, dest: int, tag: int) -> None:
        self.world.post(self, self.members[dest], tag, obj)

    def Send(self, buf, dest: int, tag: int) -> None:  # noqa: N802
        self.world.post(self, self.members[dest], tag, _origin(buf).copy())

    def Isend(self, buf, dest: int, tag: int) -> SimRequest:  # noqa: N802
        self.Send(buf, dest, tag)
        return _DONE

    def recv(self, source: int = -1, tag: int = -1):
        return self.world.take(self, source, tag).payload

    def Recv(self, buf, source: int = -1, tag: int = -1, status=None) -> None:  # noqa: N802
        np.copyto(_origin(buf), self.world.take(self, source, tag).payload)

    def Irecv(self, buf, source: int = -1, tag: int = -1) -> SimRequest:  # noqa: N802
        return SimRequest(lambda: self.Recv(buf, source, tag))

    def Iprobe(self, source: int = -1, tag: int = -1, status: Optional[SimStatus] = None) -> bool:  # noqa: N802
        message = self.world.peek(self, source, tag)
        if message is not None and status is not None:
            status.source, status.tag = self.members.index(message.source), message.tag
        return message is not None

    # --- collectives over the workers (servers never join one in the simulator) -----------------
    def _collective(self, name: str, value, combine):
        world = self.world
        return world.net.collective(world.worker_of(self.world_rank), (self.context,) + self._calls.key(name),
                                    value, combine)

    def Ibarrier(self) -> SimRequest:  # noqa: N802
        key = (self.context,) + self._calls.key("barrier")
        worker = self.world.worker_of(self.world_rank)
        self.world.net.contribute(worker, key, None, lambda values: None)
        return SimRequest(lambda: self.world.net.collect(worker, key))

    def Barrier(self) -> None:  # noqa: N802
        self.Ibarrier().Wait()

    def allgather(self, obj) -> List[Any]:
        return self._collective("allgather", obj, list)

    def Bcast(self, buf, root: int = 0) -> None:  # noqa: N802
        array = _origin(buf)
        np.copyto(array, self._collective("bcast", array.copy(), lambda values: values[root]))

    def Reduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> None:  # noqa: N802
        if op is not SUM:
            raise ValueError(f"the simulator's MPI reduces with SUM only, not {op!r}")
        array = _origin(recvbuf if sendbuf is IN_PLACE else sendbuf)
        total = self._collective("reduce", torch.from_numpy(array.copy()), rank_sum)
        if self.rank == root:
            np.copyto(_origin(recvbuf), total.numpy())


IN_PLACE = object()
ANY_SOURCE, ANY_TAG = -1, -1
LOCK_SHARED, LOCK_EXCLUSIVE = 1, 2
WIN_MODEL, WIN_UNIFIED = 1, 1
THREAD_MULTIPLE = 3
COMM_TYPE_SHARED = 1


class SimWorld:
    """The simulated job's ranks: ``servers`` parameter-server ranks (world ranks 0 ..), then the workers;
    their messages (per communicator context and rank), their one-sided links, and what serves the
    servers' side (``handlers``: communicator context -> ``handle(source, server, tag)``; ``windows``:
    communicator context -> the n-th window's handle)."""

    def __init__(self, net: SimNetwork, servers: int):
        self.net, self.servers = net, servers
        self._boxes: Dict[Tuple, List[Message]] = {}
        self._links: Dict[int, Link] = {}
        self.handlers: Dict[Tuple, Callable[[int, int, int], None]] = {}  # (source, server, tag)
        self.windows: Dict[Tuple, Callable[[SimCommunicator, int, int], SimWin]] = {}  # (comm, n, disp_unit)
        self._allocations: Dict[Tuple, int] = {}

    def worker_of(self, world_rank: int) -> int:
        return world_rank - self.servers

    def _running(self) -> int:
        """The simulated worker whose thread runs now (a server acts on its behalf)."""
        return current()[1]

    def now(self, worker: Optional[int] = None) -> float:
        return self.net.sched.now(self._running() if worker is None else worker)

    def arrive(self, worker: int, at: float) -> None:
        """Move ``worker``'s clock on to ``at`` (if it is behind), letting the others run meanwhile."""
        self.net.exchanges += 1
        behind = at - self.net.sched.now(worker)
        if behind > 0:
            self.net.sched.advance(worker, behind)

    def link(self, world_rank: int) -> Link:
        if world_rank not in self._links:
            self._links[world_rank] = Link(self, self.worker_of(world_rank))
        return self._links[world_rank]

    # --- messages ---------------------------------------------------------------------------
    def post(self, comm: SimCommunicator, dest: int, tag: int, payload) -> None:
        """``comm``'s rank sends ``payload`` to world rank ``dest``; a server serves it at once."""
        box = self._boxes.setdefault((comm.context, dest), [])
        box.append(Message(comm.world_rank, tag, payload, self.now() + self.net.latency))
        if dest < self.servers:
            self.handlers[comm.context](comm.world_rank, dest, tag)

    def peek(self, comm: SimCommunicator, source: int, tag: int) -> Optional[Message]:
        for message in self._boxes.get((comm.context, comm.world_rank), ()):
            if (source == ANY_SOURCE or message.source == comm.members[source]) and tag in (ANY_TAG, message.tag):
                return message
        return None

    def take(self, comm: SimCommunicator, source: int, tag: int) -> Message:
        """The first matching message to ``comm``'s rank; a worker waits for it on its clock."""
        if comm.world_rank >= self.servers:
            worker = self.worker_of(comm.world_rank)
            self.net.sched.wait_until(worker, lambda: self.peek(comm, source, tag) is not None,
                                      f"a message (tag {tag}) from rank {source}")
        message = self.peek(comm, source, tag)
        if message is None:
            raise RuntimeError(f"simulated server {comm.world_rank}: no message (tag {tag}) from rank {source}")
        self._boxes[(comm.context, comm.world_rank)].remove(message)
        if comm.world_rank >= self.servers:
            self.arrive(self.worker_of(comm.world_rank), message.arrival)
        return message

    # --- windows ----------------------------------------------------------------------------
    def allocate(self, comm: SimCommunicator, size: int, disp_unit: int) -> SimWin:
        """The window memory of ``comm``'s members: a communicator the servers serve takes theirs from
        ``windows`` (what the n-th allocation over it is), one among workers gathers every worker's."""
        n = self._allocations[(comm.context, comm.world_rank)] = self._allocations.get(
            (comm.context, comm.world_rank), -1) + 1
        if comm.members[0] < self.servers:
            worker = self.worker_of(comm.world_rank)
            self.net.sched.wait_until(worker, lambda: comm.context in self.windows, "the servers' windows")
            return self.windows[comm.context](comm, n, disp_unit)
        memory = np.zeros(size, dtype=np.uint8)
        return SimWin(comm, comm._collective("Win.Allocate", memory, list), disp_unit)


class SimMPI:
    """What a simulated worker's transports get as ``MPI`` (``comms.mpi``): this module's types,
    operations and constants, ``Win``, ``Request`` and ``Status`` (their clock is ``comms.clock``)."""

    Win, Request, Status, Exception = SimWin, SimRequest, SimStatus, RuntimeError
    FLOAT, DOUBLE, INT64_T, UINT16_T = FLOAT, DOUBLE, INT64_T, UINT16_T
    SUM, NO_OP, REPLACE, IN_PLACE = SUM, NO_OP, REPLACE, IN_PLACE
    ANY_SOURCE, ANY_TAG, COMM_TYPE_SHARED = ANY_SOURCE, ANY_TAG, COMM_TYPE_SHARED
    LOCK_SHARED, LOCK_EXCLUSIVE, WIN_MODEL, WIN_UNIFIED, THREAD_MULTIPLE = (
        LOCK_SHARED, LOCK_EXCLUSIVE, WIN_MODEL, WIN_UNIFIED, THREAD_MULTIPLE)

    @staticmethod
    def Query_thread() -> int:  # noqa: N802
        return THREAD_MULTIPLE

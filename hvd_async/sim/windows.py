"""The parameter servers, simulated: the real server side behind memory instead of MPI windows.

:class:`SimShardHost` is :class:`~hvd_async.transport.window.ShardHost`, built by its own constructor on
plain memory (:class:`MemoryWindows`) instead of MPI windows: the same ``meta`` counters (version,
pushes, staleness histogram, cursor, value table), ``weights``, ``inbox``/``outbox`` slots (of the
wire's type, fp16 ones read widened), and the same ``handle``/``bump``/``answer``/``close`` code, so
the algorithms' own ``server_program`` runs on it unchanged. :class:`SimServers` are the shards of
one window transport: the workers' real :class:`~hvd_async.transport.window.WindowTransport`, over
the simulator's MPI (:mod:`.mpi`), reads and writes their memory one-sidedly, and each message it
sends a server is served at once by that shard's host.

Replay (:class:`ReplayScript`, a recorded real run, :mod:`hvd_async.transport.trace`): each push waits
until the shards' version reaches the place the recorded push took, so the pushes land in the real
run's order (in accumulate mode before its delta is added into shard 0; in mailbox mode before shard 0
serves the request), and each answer's weights are compared with the recorded ones and counted as
matched or not. A real ``pull(after_push=True)`` may have read pushes that landed after its own (the
transport then counts them as stale): the replayed pull waits until the global weights are the very
ones the recorded pull read (their digest), but no longer than until the version this worker's next
recorded exchange saw; if they never are (two real pushes landed in the other order, or a read
overlapped a push), it keeps the weights of the recorded version and counts the pull as unmatched.
:class:`ReplayTracer` does this as the transport's tracer, which the transport tells of every pull.
"""
import hashlib
from typing import Dict, List, Optional

import numpy as np
import torch

from ..transport import window
from .mpi import SimCommunicator, SimWin, SimWorld


class MemoryWindows:
    """What a simulated host has instead of MPI windows: plain memory of the same layout and types
    (``arrays``, as :class:`~hvd_async.transport.window.layout._Windows` gives its windows' memory),
    nothing to lock, sync or free."""

    def __init__(self, spec: window.WindowSpec, shard: int):
        sizes = spec.sizes(shard)
        wire = torch.float16 if spec.wire == "fp16" else torch.float32
        self._arrays = (np.zeros(sizes.meta, dtype=np.int64), torch.zeros(sizes.weights, dtype=torch.float32),
                        torch.zeros(sizes.inbox, dtype=wire) if spec.mode == "mailbox" else None,
                        torch.zeros(sizes.outbox, dtype=wire) if spec.mode == "mailbox" and spec.outbox else None)

    def arrays(self):
        return self._arrays

    def lock_all(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def free(self) -> None:
        pass


class _Unattached:
    """A host's communicator outside a simulated job (:mod:`.memory` serves a host by hand): answers
    land in ``answers``."""

    def __init__(self, host: "SimShardHost"):
        self.host = host

    def Send(self, buf, dest: int, tag: int) -> None:  # noqa: N802 - mpi4py's name
        self.host.answers[dest - self.host.spec.servers] = np.array(buf, dtype=np.float64)

    def Free(self) -> None:  # noqa: N802
        pass


class SimShardHost(window.ShardHost):
    """Shard ``shard`` of a simulated parameter server: the real host on :class:`MemoryWindows`, over
    ``comm`` (its rank of the transport's simulated communicator; None: answers land in ``answers``)."""

    @staticmethod
    def clock() -> float:  # the simulated servers take no time (busy_seconds stays 0)
        return 0.0

    def __init__(self, spec: window.WindowSpec, shard: int, make_program, comm: Optional[SimCommunicator] = None):
        self.answers: Dict[int, np.ndarray] = {}
        self.memory = MemoryWindows(spec, shard)
        super().__init__(_Unattached(self) if comm is None else comm, spec, shard, make_program,
                         windows=self.memory)


class ReplayScript:
    """One worker's recorded exchanges (trace lines), consumed in order as its transport makes them."""

    def __init__(self, rank: int, events: List[Dict]):
        self.rank = rank
        self.events = [e for e in events if e["op"] in ("push", "pull")]
        self.position = self.matched = self.unmatched = 0

    def next(self, op: str) -> Dict:
        if self.position >= len(self.events) or self.events[self.position]["op"] != op:
            recorded = self.events[self.position]["op"] if self.position < len(self.events) else "nothing more"
            raise RuntimeError(f"replay diverged: worker {self.rank}'s exchange #{self.position + 1} is a {op} "
                               f"here, {recorded} in the recorded run")
        self.position += 1
        return self.events[self.position - 1]

    def bound(self) -> Optional[int]:
        """The version this worker's next recorded exchange saw (a pull read cannot be later)."""
        return self.events[self.position]["version"][0] if self.position < len(self.events) else None

    def count(self, want: str, flat: torch.Tensor) -> None:
        if hashlib.sha1(flat.numpy().tobytes()).hexdigest() == want:
            self.matched += 1
        else:
            self.unmatched += 1

    @property
    def done(self) -> bool:
        return self.position == len(self.events)


class SimServers:
    """The shards of one window transport's simulated servers, opened as the real ones are: by the
    ``WindowSpec`` worker 0 sends (``TAG_OPEN``), over the communicator context the workers' transports
    duplicate for it. Each message a worker sends a shard is served at once (``ShardHost.handle``);
    the workers' windows are the shards' memory. The last worker to close closes the shards.

    Args:
        world: the simulated job's ranks.
        context: the transport's communicator (the n-th duplicate of the job's window communicator).
        spec: what worker 0 sent.
        make_program: the algorithm's declared ``server_program``.
        scripts: replay: every worker's recorded exchanges (:class:`ReplayScript`), or None.
    """

    def __init__(self, world: SimWorld, context, spec: window.WindowSpec, make_program,
                 scripts: Optional[List[ReplayScript]] = None):
        self.world, self.spec, self.scripts = world, spec, scripts
        members = list(range(spec.servers + spec.workers))
        self.hosts = [SimShardHost(spec, k, make_program, SimCommunicator(world, context, members, k))
                      for k in range(spec.servers)]
        self._digest = (-1, "")
        world.handlers[context] = self.handle
        world.windows[context] = self.window

    def handle(self, source: int, shard: int, tag: int) -> None:
        if self.scripts is not None and shard == 0 and tag == window.TAG_REQUEST:
            message = self.world.peek(self.hosts[0].comm, source, tag)
            assert message is not None  # handle() is called for a message that has arrived
            header = message.payload
            if window.Kind(int(header[window.H_KIND])) is window.Kind.PUSH:
                self.turn(source - self.spec.servers)
        host = self.hosts[shard]
        host.handle(source, tag)
        if tag == window.TAG_CLOSE and all(h.all_closed for h in self.hosts):  # the last worker closed
            for h in self.hosts:
                h.close()

    def window(self, comm: SimCommunicator, n: int, disp_unit: int) -> SimWin:
        """Worker ``comm.rank``'s handle on the ``n``-th window (``meta``, ``weights``, ``inbox``,
        ``outbox``: :class:`~hvd_async.transport.window.layout._Windows`' order) of every shard."""
        memory = [_bytes(host.memory.arrays()[n]) for host in self.hosts]
        memory += [np.zeros(0, dtype=np.uint8)] * self.spec.workers
        replayed = self.scripts is not None and n == 1 and self.spec.mode == "accumulate"
        return SimWin(comm, memory, disp_unit, hooks={(0, "Accumulate"): self.turn} if replayed else None)

    def turn(self, worker: int) -> None:
        """Replay: ``worker``'s next push waits for the place its recorded one took."""
        assert self.scripts is not None  # called in a replay only (by handle and the replay's hook)
        turn = self.scripts[worker].next("push")["version"][0]
        hosts = self.hosts
        self.world.net.sched.wait_until(worker, lambda: hosts[0].version == turn,
                                        f"its recorded turn (version {turn})")

    def digest(self) -> str:
        """sha1 of the whole global weights (cached per version): what a trace records per pull."""
        version = self.hosts[0].version
        if self._digest[0] != version:
            flat = torch.cat([host.weights for host in self.hosts])
            self._digest = (version, hashlib.sha1(flat.numpy().tobytes()).hexdigest())
        return self._digest[1]


def _bytes(memory) -> np.ndarray:
    """A window's memory (a numpy array, a tensor, or None: none) as bytes sharing it."""
    if memory is None:
        return np.zeros(0, dtype=np.uint8)
    array = memory.numpy() if isinstance(memory, torch.Tensor) else memory
    return array.reshape(-1).view(np.uint8)


class ReplayTracer:
    """The transport's tracer under replay: each pull reads what the recorded one read (see the module
    docstring) and is counted as matched or not; then ``inner`` (``--trace-out``'s tracer) records it."""

    def __init__(self, script: ReplayScript, servers: "SimServers", worker: int, inner=None):
        self.script, self.servers, self.worker, self.inner = script, servers, worker, inner

    def push(self, versions, staleness) -> None:
        if self.inner is not None:
            self.inner.push(versions, staleness)

    def pull(self, versions, flat: torch.Tensor, after_push: bool) -> None:
        script, servers = self.script, self.servers
        want, bound = script.next("pull")["digest"], script.bound()
        if after_push and bound is not None and servers.digest() != want:
            hosts = servers.hosts
            servers.world.net.sched.wait_until(
                self.worker, lambda: servers.digest() == want or hosts[0].version >= bound,
                f"the weights its recorded pull read (until version {bound})")
            if servers.digest() == want:
                flat.copy_(torch.cat([host.weights for host in hosts]))
        script.count(want, flat)
        if self.inner is not None:
            self.inner.pull(versions, flat, after_push)

    def answered(self, kind_is_push: bool, answers, out: Optional[torch.Tensor]) -> None:
        if out is not None:  # the answer brought what the real one did?
            self.script.count(self.script.next("pull")["digest"], out)
        if self.inner is not None:
            self.inner.answered(kind_is_push, answers, out)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

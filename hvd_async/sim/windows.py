"""The parameter servers, simulated: the real server programs behind an in-process stand-in for the windows.

:class:`SimShardHost` is :class:`~hvd_async.transport.window.ShardHost`, built by its own constructor on
plain memory (:class:`MemoryWindows`) instead of MPI windows: the same ``meta`` counters (version,
pushes, staleness histogram, cursor, value table), ``weights``, ``inbox``/``outbox`` slots (of the
wire's type, fp16 ones read widened), and the same ``bump``/``answer``/``close`` code, so the
strategies' own ``server_program`` (``AccumulateProgram``, ``DCProgram``, ``LCProgram``,
``SoftSyncProgram``, ...) runs on it unchanged. An answer, instead of an MPI
message, lands in the host's ``answers`` for the worker to collect.

:class:`SimWindowTransport` is the worker side with
:class:`~hvd_async.transport.window.WindowTransport`'s interface and contract, built on the same base
(:class:`~hvd_async.transport.window.worker_side.WorkerSide`, through its constructor): an ``accumulate``
adds the delta into every shard and takes the shard's version as its place in the order (staleness =
that version less the one read at the last pull); a mailbox request runs the server program's
``on_request`` at once (the simulated server answers in no time) and ``wait()`` blocks, on the
virtual clock, until the program has answered (softsync's aggregate, when the last gradient of
the group arrives or a worker goes idle). Every call that crosses the network costs one exchange of
latency first. Each shard applies a push entirely before the next (the real windows may interleave
two pushes element by element; the sums are the same up to float rounding order).

Replay (``script``, a :class:`ReplayScript` of a recorded real run, :mod:`hvd_async.transport.trace`):
each push waits until the shards' version reaches the place the recorded push took, so the pushes
land in the real run's order (in mailbox mode, the place the server gave it; each answer's weights
are then compared with the recorded ones and counted as matched or not). A real
``pull(after_push=True)`` may have read pushes that landed after its own (the transport then counts
them as stale): the replayed pull waits until the global
weights are the very ones the recorded pull read (their digest), but no longer than until the
version this worker's next recorded exchange saw; if they never are (two real pushes landed in the
other order, or a read overlapped a push), it reads the weights of the recorded version instead
and counts the pull as unmatched.
"""
import hashlib
from typing import Dict, List, Optional

import numpy as np
import torch

from ..transport import window as W
from ..transport.window.worker_side import WorkerSide
from .network import Calls, SimNetwork


class MemoryWindows:
    """What a simulated host has instead of MPI windows: plain memory of the same layout and types
    (``arrays``, as :class:`~hvd_async.transport.window.layout._Windows` gives its windows' memory),
    nothing to lock, sync or free."""

    def __init__(self, spec: W.WindowSpec, shard: int):
        n, mailbox = spec.shard_len(shard), spec.mode == "mailbox"
        wire = torch.float16 if spec.wire == "fp16" else torch.float32
        self._arrays = (np.zeros(spec.meta_len, dtype=np.int64), torch.zeros(n, dtype=torch.float32),
                        torch.zeros(n * spec.inbox_slots, dtype=wire) if mailbox else None,
                        torch.zeros(n * spec.workers, dtype=wire) if mailbox and spec.outbox else None)

    def arrays(self):
        return self._arrays

    def lock_all(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def free(self) -> None:
        pass


class _AnswerBox:
    """Stands in for the host's communicator: ``answer()``'s send lands in the host's ``answers``."""

    def __init__(self, host: "SimShardHost"):
        self.host = host

    def Send(self, buf, dest: int, tag: int) -> None:  # noqa: N802 - mpi4py's name
        self.host.answers[dest - self.host.spec.servers] = np.array(buf, dtype=np.float64)

    def Free(self) -> None:  # noqa: N802
        pass


class SimShardHost(W.ShardHost):
    """Shard ``shard`` of a simulated parameter server: the real host on :class:`MemoryWindows`, whose
    answers land in ``answers`` (worker -> the answer's float64 row) instead of going out over MPI."""

    def __init__(self, spec: W.WindowSpec, shard: int, make_program):
        self.answers: Dict[int, np.ndarray] = {}
        super().__init__(_AnswerBox(self), spec, shard, make_program, windows=MemoryWindows(spec, shard))

    def poll(self, budget: int = 64) -> int:
        return 0  # requests reach the program directly (SimWindowTransport)


class ReplayScript:
    """One worker's recorded exchanges (trace lines), consumed in order by its simulated transport."""

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

    @property
    def done(self) -> bool:
        return self.position == len(self.events)


class SimServers:
    """The shards of one transport's simulated servers, built from the strategy class's program."""

    def __init__(self, spec: W.WindowSpec, server_program):
        self.spec = spec
        self.bounds = W.shard_bounds(spec.numel, spec.servers)
        self.hosts = [SimShardHost(spec, k, server_program) for k in range(spec.servers)]
        self.stats: Optional[List[W.ShardStats]] = None
        self._digest = (-1, "")

    def digest(self) -> str:
        """sha1 of the whole global weights (cached per version): what a trace records per pull."""
        version = self.hosts[0].version
        if self._digest[0] != version:
            flat = torch.cat([host.weights for host in self.hosts])
            self._digest = (version, hashlib.sha1(flat.numpy().tobytes()).hexdigest())
        return self._digest[1]

    def leave(self, worker: int) -> None:
        """Worker closed its transport (the real one's TAG_CLOSE); the last one closes the shards."""
        for host in self.hosts:
            host.closed.add(worker)
            host.program.on_leave(worker)
        if all(host.all_closed for host in self.hosts):
            self.stats = [host.close() for host in self.hosts]


class SimWindowTransport(WorkerSide):
    """Worker ``rank``'s side of the simulated parameter servers (``WindowTransport``'s interface).

    Args:
        net: the simulated network (clock, latency, collectives).
        rank: this worker.
        servers: the shards (shared by every worker's transport).
        script: replay: this worker's recorded exchanges (:class:`ReplayScript`).
        tracer: records this worker's pushes and pulls (:class:`hvd_async.transport.trace.Tracer`).
    """

    def __init__(self, net: SimNetwork, rank: int, servers: SimServers, *,
                 script: Optional[ReplayScript] = None, tracer=None):
        super().__init__(servers.spec, rank)  # (its staleness counts stay empty: here they land at once)
        self.net, self.cluster, self.hosts = net, servers, servers.hosts
        self._calls = Calls()
        self.script = script
        self._trace = tracer

    # rank, size, servers, versions, push, local_state, load_local_state: WorkerSide's

    def clock(self) -> float:
        """This worker's virtual clock (dbs-asgd measures its speed with it)."""
        return self.net.sched.now(self._rank)

    def allgather_object(self, obj) -> List:
        self._check_open()
        return self.net.collective(self._rank, self._calls.key("allgather"), obj, list)

    def barrier(self) -> None:
        self._check_open()
        self.net.collective(self._rank, self._calls.key("barrier"), None, lambda values: None)

    # --- helpers ------------------------------------------------------------------------------
    def _check_flat(self, flat: torch.Tensor) -> None:
        if flat.dtype != torch.float32 or flat.device.type != "cpu" or not flat.is_contiguous() \
                or flat.numel() != self.spec.numel:
            raise ValueError(f"expected a contiguous CPU float32 tensor of {self.spec.numel} elements, "
                             f"got {flat.dtype} {tuple(flat.shape)} on {flat.device}")

    def _parts(self, flat: torch.Tensor):
        self._check_flat(flat)
        return [(host, flat[start:stop]) for host, (start, stop) in zip(self.hosts, self.bounds)]

    def _done(self, result) -> W.Pending:
        self._pending = W.Pending(lambda: result)
        return self._pending

    # --- weights ------------------------------------------------------------------------------
    def publish_(self, flat: torch.Tensor) -> None:
        self._check_idle()
        if self._rank == 0:
            self.net.exchange(self._rank)
            for host, part in self._parts(flat):
                host.weights.copy_(part)
        self.barrier()
        self.pull(flat)
        self.barrier()

    def pull(self, flat: torch.Tensor, *, after_push: bool = False, guarded: bool = False) -> np.ndarray:
        """(``guarded``: the real read's check against a server's write in progress; here every read is
        whole, so it reads as any other.)"""
        self._check_idle()
        parts = self._parts(flat)
        self.net.exchange(self._rank)
        read = self.latest_versions.copy() if after_push else np.array(
            [host.version for host in self.hosts], dtype=np.int64)
        for host, part in parts:
            part.copy_(host.weights)
        if self.script is not None:
            self._replay_pull(parts, after_push)
        self._versions[:] = read
        np.maximum(self.latest_versions, read, out=self.latest_versions)
        if self._trace is not None:
            self._trace.pull(read, flat, after_push)
        return read.copy()

    def pull_async(self, flat: torch.Tensor) -> W.Pending:
        return self._done(self.pull(flat))

    def accumulate(self, delta: torch.Tensor) -> np.ndarray:
        self._check_idle()
        if self.spec.mode != "accumulate":
            raise RuntimeError(f"accumulate() is for accumulate-mode transports; {self.spec.algorithm!r} "
                               f"uses its server's mailbox: use push()")
        parts = self._parts(delta)
        self.net.exchange(self._rank)
        if self.script is not None:
            turn = self.script.next("push")["version"][0]
            self.net.sched.wait_until(self._rank, lambda: self.hosts[0].version == turn,
                                      f"its recorded turn (version {turn})")
        fetched = np.zeros(self.servers, dtype=np.int64)
        for k, (host, part) in enumerate(parts):
            host.weights.add_(part)
            fetched[k] = host.meta[W.META_VERSION]
            host.meta[W.META_VERSION] += 1
        staleness = np.maximum(0, fetched - self._versions)
        for host, s in zip(self.hosts, staleness):  # the real workers send these counts in batches
            host.meta[W.META_HIST + min(int(s), W.HIST_BINS - 1)] += 1
        self.latest_versions[:] = fetched + 1
        if self._trace is not None:
            self._trace.push(fetched, staleness)
        return staleness

    def accumulate_async(self, delta: torch.Tensor) -> W.Pending:
        return self._done(self.accumulate(delta))

    def accumulate_and_pull(self, delta: torch.Tensor, flat: torch.Tensor) -> np.ndarray:
        staleness = self.accumulate(delta)
        self.pull(flat, after_push=True)
        return staleness

    def _replay_pull(self, parts, after_push: bool) -> None:
        """Replay: read what the recorded pull read (see the module docstring); ``parts`` hold the
        weights of the recorded version already."""
        want, bound, servers = self.script.next("pull")["digest"], self.script.bound(), self.cluster
        if after_push and bound is not None and servers.digest() != want:
            self.net.sched.wait_until(
                self._rank, lambda: servers.digest() == want or self.hosts[0].version >= bound,
                f"the weights its recorded pull read (until version {bound})")
            if servers.digest() == want:
                for host, part in parts:
                    part.copy_(host.weights)
        self._count_match(want, torch.cat([part for _, part in parts]))

    def _count_match(self, want: str, flat: torch.Tensor) -> None:
        if hashlib.sha1(flat.numpy().tobytes()).hexdigest() == want:
            self.script.matched += 1
        else:
            self.script.unmatched += 1

    # --- mailbox ------------------------------------------------------------------------------
    def request_async(self, kind: W.Kind, *, grad: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                      payload: Optional[Dict[int, float]] = None) -> W.Pending:
        self._check_idle()
        if self.spec.mode != "mailbox":
            raise RuntimeError(f"{self.spec.algorithm!r} adds deltas into the weights directly: use accumulate()")
        answered = kind.answered
        grads = self._parts(grad) if kind is W.Kind.PUSH else [(host, None) for host in self.hosts]
        outs = self._parts(out) if answered and out is not None else []
        self.net.exchange(self._rank)
        me = self._rank
        header = np.zeros(W.H_LEN, dtype=np.float64)
        W.encode_request(header, kind, payload)
        if self.script is not None and kind is W.Kind.PUSH:  # the server took it at its recorded place
            turn = self.script.next("push")["version"][0]
            self.net.sched.wait_until(me, lambda: self.hosts[0].version == turn, f"its recorded turn (version {turn})")
        for k, (host, part) in enumerate(grads):
            if part is not None:
                host.inbox[me].copy_(part)
            host.answers.pop(me, None)
            host.program.on_request(me, W.Request.decode(header, k, me))

        def finish():
            if not answered:
                return None
            self.net.sched.wait_until(me, lambda: all(me in host.answers for host in self.hosts),
                                      "the servers' answer")
            answers = W.Answers(np.stack([host.answers.pop(me) for host in self.hosts]))
            for host, part in outs:  # (without an outbox, a pull's copy is in its inbox slot)
                part.copy_(host.outbox[me] if host.outbox is not None else host.inbox[me])
            self._versions[:] = answers.versions
            np.maximum(self.latest_versions, self._versions, out=self.latest_versions)
            if self.script is not None and out is not None:  # the answer brought what the real one did?
                self._count_match(self.script.next("pull")["digest"], out)
            if self._trace is not None:
                self._trace.answered(kind is W.Kind.PUSH, answers, out)
            return answers

        self._pending = W.Pending(finish)
        return self._pending

    # --- checkpoints: the shards' state, as the real servers give and take it -------------------
    def server_state(self) -> List[Dict]:
        self._check_idle()
        return [host.state_dict() for host in self.hosts]

    def load_server_state(self, states) -> None:
        self._check_idle()
        if not isinstance(states, (list, tuple)) or len(states) != self.servers:
            raise ValueError(f"the saved server state has the wrong number of shards for {self.servers} server(s)")
        for host, state in zip(self.hosts, states):
            status, why = host._load_checked(state)
            if status != "ok":
                raise ValueError(why)

    # --- shared counter and per-worker values (on shard 0) ------------------------------------
    def fetch_add_counter(self, n: int) -> int:
        self._check_idle()
        self.net.exchange(self._rank)
        meta = self.hosts[0].meta
        old = int(meta[W.META_COUNTER])
        meta[W.META_COUNTER] += n
        return old

    def publish_value(self, value: float) -> None:
        self._check_idle()
        self.net.exchange(self._rank)
        self.hosts[0].meta[W.META_TABLE + self._rank] = np.array([value], dtype=np.float64).view(np.int64)[0]

    def read_values(self) -> np.ndarray:
        self._check_idle()
        self.net.exchange(self._rank)
        return self.hosts[0].meta[W.META_TABLE:W.META_TABLE + self.size].view(np.float64).copy()

    def read_stats(self) -> List[Dict]:
        """Every shard's counters, as ``WindowTransport.read_stats`` gives them (no server busy time is
        simulated: ``busy_seconds`` is 0)."""
        self._check_idle()
        self.net.exchange(self._rank)
        return [W.stats_row(host.meta[:W.META_COUNTER], self.spec.mode) for host in self.hosts]

    def close(self) -> None:
        if self._closed:
            return
        if self._pending is not None:
            self._pending.wait()
        self._closed = True
        if self._trace is not None:
            self._trace.close()
        self.cluster.leave(self._rank)

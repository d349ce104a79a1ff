"""The leave and close protocol, checked over every interleaving (issue 56).

The checker runs the real :class:`hvd_async.transport.leave.LeaveWatch` of each worker over an MPI
of its own (:class:`CheckMPI`: collectives matched by their order on a communicator, as MPI matches
them; messages delivered whenever the checker chooses), and explores every order in which the
processes and the network can move: each worker takes one step of its script (enter a collective,
one poll of it (``LeaveWatch.settle``), announce its close, one poll of the closing wait
(``LeaveWatch.closed``), the windows' free), each server one step of its loop (every worker's close
message, then the free), the network delivers one message. A state in which nobody can move is an
end: it passes when every process has finished, or a process ended the job (an uncaught error:
MPI_Abort ends every rank). A state in which some process still waits is a hang: the test prints
the orders that lead to it.

Scripts: every combination of the leave orders of ``tests/leave_orders.py`` for 2 and 3 workers, with
0 (gossip's peer windows), 1 and 2 servers.
"""
import os
import sys
from typing import Dict, List, Optional, Tuple

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import leave_orders  # noqa: E402
from hvd_async.transport.leave import LeaveWatch, PeerLeftError  # noqa: E402


# --- an MPI whose every step the checker makes ------------------------------------------------------
class CheckMPI:
    """The part of ``mpi4py.MPI`` that LeaveWatch calls, over :class:`World`'s state."""
    ANY_SOURCE = -1
    INT64_T = "INT64_T"

    class Status:
        def __init__(self):
            self.source = -1

        def Get_source(self):  # noqa: N802 - mpi4py's names
            return self.source

    class Request:
        @staticmethod
        def Waitall(requests):  # noqa: N802 - a notice is sent eagerly: its send completes at once
            pass


class Done:
    def Test(self):  # noqa: N802
        return True


class BarrierRequest:
    def __init__(self, world: "World", context: str, seq: int, members: int):
        self.world, self.context, self.seq, self.members = world, context, seq, members

    def Test(self):  # noqa: N802 - complete once every member has entered this many barriers here
        return all(self.world.entered.get((self.context, r), 0) > self.seq for r in range(self.members))


class Comm:
    def __init__(self, world: "World", context: str, rank: int, size: int):
        self.world, self.context, self.rank, self.size = world, context, rank, size
        self._dups = 0

    def Dup(self):  # noqa: N802 - every rank dups its communicators in the same order
        self._dups += 1
        return Comm(self.world, f"{self.context}/{self._dups}", self.rank, self.size)

    def Free(self):  # noqa: N802
        pass

    def Ibarrier(self):  # noqa: N802 - MPI matches a communicator's collectives by their order alone
        key = (self.context, self.rank)
        seq = self.world.entered.get(key, 0)
        self.world.entered[key] = seq + 1
        return BarrierRequest(self.world, self.context, seq, self.size)

    def Isend(self, buf, dest, tag):  # noqa: N802
        self.world.in_flight.append((self.context, self.rank, dest, tag, int(buf[0][0])))
        return Done()

    def _first(self, source, tag):
        for message in self.world.arrived:
            context, src, dest, mtag, _ = message
            if context == self.context and dest == self.rank and mtag == tag and source in (-1, src):
                return message
        return None

    def Iprobe(self, source, tag, status):  # noqa: N802
        message = self._first(source, tag)
        if message is not None:
            status.source = message[1]
        return message is not None

    def Recv(self, buf, source, tag):  # noqa: N802
        message = self._first(source, tag)
        self.world.arrived.remove(message)
        buf[0][0] = message[4]


class World:
    """The network and the collectives' progress, shared by every process of one run."""

    def __init__(self):
        self.entered: Dict[Tuple[str, int], int] = {}  # (communicator, rank) -> barriers entered
        self.in_flight: List[tuple] = []  # sent, not yet arrived
        self.arrived: List[tuple] = []  # arrived, not yet received
        self.server_closes: Dict[int, int] = {}  # server -> workers' close messages taken
        self.freeing: set = set()  # processes in the windows' free (a collective of every process)
        self.aborted = False

    def clone(self) -> "World":
        other = World.__new__(World)
        other.entered, other.in_flight, other.arrived = dict(self.entered), list(self.in_flight), list(self.arrived)
        other.server_closes, other.freeing, other.aborted = dict(self.server_closes), set(self.freeing), self.aborted
        return other

    def key(self):
        return (tuple(sorted(self.entered.items())), tuple(sorted(self.in_flight)), tuple(sorted(self.arrived)),
                tuple(sorted(self.server_closes.items())), tuple(sorted(self.freeing)), self.aborted)


def _copy(obj):
    """A shallow copy (copy.copy, without its generic machinery: the checker makes millions)."""
    other = object.__new__(type(obj))
    other.__dict__.update(obj.__dict__)
    return other


# --- the processes ------------------------------------------------------------------------------------
class Worker:
    def __init__(self, world: World, rank: int, workers: int, leave: leave_orders.Leave, watch_class):
        self.name = f"worker {rank}"
        self.comm = Comm(world, "workers", rank, workers)
        self.watch = watch_class(self.comm, "check transport", CheckMPI)
        self.ops = list(leave.ops())
        self.pc = 0
        self.phase = ""  # in 'close': '' -> 'closing' -> 'freeing'
        self.collective = None
        self.error = False  # a collective raised PeerLeftError
        self.done = False

    def clone(self, world: World) -> "Worker":
        other = _copy(self)
        other.comm = _copy(self.comm)
        other.comm.world = world
        watch = other.watch = _copy(self.watch)
        watch.comm = _copy(self.watch.comm)
        watch.comm.world = world
        watch.left, watch.ignored, watch._notices = dict(watch.left), set(watch.ignored), list(watch._notices)
        watch._inbox = watch._inbox.copy()
        for name in ("_workers", "_closing"):  # (BarrierClosing's)
            value = getattr(watch, name, None)
            if value is not None:
                value = _copy(value)
                value.world = world
                setattr(watch, name, value)
        if self.collective is not None:
            request = _copy(self.collective.request)
            request.world = world
            other.collective = self.collective._replace(request=request)
        other.ops = list(self.ops)
        return other

    def key(self):
        w = self.watch
        return (self.pc, tuple(self.ops[self.pc:]), self.phase, self.collective and self.collective.index, self.error,
                self.done, w.count, tuple(sorted(w.left.items())))

    def step(self, world: World, processes: int) -> str:
        """One step of this worker; what it did."""
        op = self.ops[self.pc]
        if op == "coll":
            if self.collective is None:
                self.collective = self.watch.enter(self.comm, f"collective {self.watch.count}")
                return "enters the next collective"
            try:
                done = self.watch.settle(self.collective)
            except PeerLeftError:
                self.collective, self.error = None, True
                self.ops = self.ops[:self.pc] + ["close", "abort"]  # its finally closes; the error ends the job
                return "raises PeerLeftError"
            if done:
                self.collective = None
                self.pc += 1
                return "passes the collective"
            return "polls"
        if op == "close":
            if self.phase == "":
                self.watch.announce()
                for server in world.server_closes:
                    world.server_closes[server] += 1
                self.phase = "closing"
                return "announces its close"
            if self.phase == "closing":
                if not self.watch.closed():
                    return "polls its close"
                self.watch.free()
                world.freeing.add(self.name)
                self.phase = "freeing"
                return "frees the windows"
            if len(world.freeing) == processes:
                self.pc, self.phase = self.pc + 1, ""
                return "has freed the windows"
            return "waits in the free"
        if op == "abort":
            world.aborted = True
            return "ends the job (uncaught error)"
        self.done = True  # 'end'
        return "returns"


class Server:
    def __init__(self, k: int, workers: int):
        self.name, self.k, self.workers = f"server {k}", k, workers
        self.freeing = self.done = False

    def clone(self, world: World) -> "Server":
        return _copy(self)

    def key(self):
        return (self.freeing, self.done)

    def step(self, world: World, processes: int) -> str:
        if not self.freeing:
            if world.server_closes[self.k] < self.workers:
                return "serves"
            world.freeing.add(self.name)
            self.freeing = True
            return "frees the windows (every worker closed)"
        if len(world.freeing) == processes:
            self.done = True
            return "has freed the windows"
        return "waits in the free"


# Steps that commute with every other step and, once possible, stay possible until taken ("polls": a
# poll that took in an arrived notice and decided nothing; the worker's next poll would take it in;
# entering a collective can only complete another's barrier, never turn its PeerLeftError into a pass,
# since a worker that has left enters nothing).
COMMUTING = {"enters the next collective", "polls", "polls its close", "announces its close", "frees the windows", "has freed the windows", "returns",
             "ends the job (uncaught error)", "frees the windows (every worker closed)"}


class Run:
    def __init__(self, leaves, servers: int, watch_class=LeaveWatch):
        self.world = World()
        self.world.server_closes = {k: 0 for k in range(servers)}
        self.procs = [Worker(self.world, r, len(leaves), leave, watch_class) for r, leave in enumerate(leaves)]
        self.procs += [Server(k, len(leaves)) for k in range(servers)]

    def clone(self) -> "Run":
        other = Run.__new__(Run)
        other.world = self.world.clone()
        other.procs = [p.clone(other.world) for p in self.procs]
        return other

    def key(self):
        return (self.world.key(),) + tuple(p.key() for p in self.procs)

    def moves(self):
        """(what, next run) for the steps that change the state. A step that commutes with every other
        and stays possible until taken (a server's, a close's announcement, entering or leaving the
        free, ending) is taken alone: every order of it among the others reaches the same states
        (a partial-order reduction); the others are explored in every order."""
        if self.world.aborted:
            return
        here = self.key()
        steps = []
        for i, proc in enumerate(self.procs):
            if getattr(proc, "done", False):
                continue
            after = self.clone()
            what = after.procs[i].step(after.world, len(self.procs))
            if after.key() != here:
                if what in COMMUTING:
                    yield f"{proc.name} {what}", after
                    return
                steps.append((f"{proc.name} {what}", after))
        yield from steps
        for m, message in enumerate(self.world.in_flight):
            after = self.clone()
            after.world.arrived.append(after.world.in_flight.pop(m))
            yield f"the notice of worker {message[1]} reaches worker {message[2]}", after

    def ended(self) -> bool:
        return self.world.aborted or all(p.done for p in self.procs)


def check(leaves, servers: int, watch_class=LeaveWatch) -> Tuple[Optional[List[str]], int, set]:
    """Explore every interleaving. Returns (the steps to a hang, or None; states seen; how the runs
    end: 'finished' (every process returned), 'aborted' (an uncaught error ended the job))."""
    start = Run(leaves, servers, watch_class)
    seen = {start.key(): None}
    frontier = [(start, [])]
    ends = set()
    while frontier:
        run, path = frontier.pop()
        moved = False
        for what, after in run.moves():
            moved = True
            key = after.key()
            if key not in seen:
                seen[key] = None
                frontier.append((after, path + [what]))
        if not moved:
            if not run.ended():
                stuck = [f"{p.name} ({'waits' if not getattr(p, 'done', False) else 'done'})" for p in run.procs]
                return path + ["-- nobody can move: " + ", ".join(stuck)], len(seen), ends
            ends.add("aborted" if run.world.aborted else "finished")
    return None, len(seen), ends


def _cases(workers: int, servers_list):
    return [(leaves, servers) for servers in servers_list for leaves in leave_orders.combinations(workers)]


CASES = _cases(2, (0, 1, 2)) + _cases(3, (0, 1, 2))


@pytest.mark.parametrize("workers", [2, 3])
def test_every_order_of_leaving_ends(workers):
    """Every combination of leave orders, every interleaving: nobody waits for a party that will
    never come; a job in which every worker finishes is never ended by an error."""
    failures = []
    for leaves, servers in CASES:
        if len(leaves) != workers:
            continue
        hang, states, ends = check(leaves, servers)
        names = ", ".join(leave.name for leave in leaves)
        if hang is not None:
            failures.append(f"{names}; {servers} server(s): hangs after\n  " + "\n  ".join(hang))
        if all(leave is leave_orders.FINISH for leave in leaves) and ends != {"finished"}:
            failures.append(f"{names}; {servers} server(s): a PeerLeftError where every worker finishes")
        if any(leave.way == "raise" for leave in leaves) and ends != {"aborted"}:
            failures.append(f"{names}; {servers} server(s): an uncaught error never ended the job")
    assert not failures, "\n".join(failures[:3]) + f"\n({len(failures)} failing combinations)"


class BarrierClosing(LeaveWatch):
    """The closing wait before issue 56: a barrier over the workers' communicator (not counted), then
    every peer's notice. The checker must find the hang of the issue in it."""

    def __init__(self, comm, what, mpi=None):
        super().__init__(comm, what, mpi)
        self._workers, self._closing = comm, None

    def closed(self) -> bool:
        if self._closing is None:
            self._closing = self._workers.Ibarrier()
        if not self._closing.Test():
            self.poll()
            return False
        self.poll()
        return not self.missing()


def test_the_checker_finds_the_hang_of_a_closing_barrier():
    """Undo the fix (a closing barrier on the workers' communicator): the order of issue 56 (worker 1
    catches an error and closes early, worker 0 finishes and closes late; 1 server) hangs, and the
    fixed protocol ends in it."""
    early_late = (leave_orders.FINISH, leave_orders.Leave("close", 1))
    hang, _, _ = check(early_late, 1, BarrierClosing)
    assert hang is not None
    assert "nobody can move" in hang[-1]
    # worker 1's closing barrier completes worker 0's barrier at the end of epoch 1: worker 0 passes it
    assert any("worker 0 passes the collective" in step for step in hang[hang.index("worker 1 announces its close"):])
    hang, _, ends = check(early_late, 1)
    assert hang is None and ends == {"aborted"}  # worker 0 gets PeerLeftError at the end of epoch 1

"""od-sgd's window exchange with a tiny ``worker_timeout`` and a 10x straggler, run by
tests/test_odsgd_timeout.py: ``SERVERS=S python odsgd_timeout_checks.py``.

Once the servers stop waiting for a worker (``worker_timeout``), the next global step may be applied
while that worker is still reading the previous one from the weights window. Every global weight
vector a worker reads must still be one its server held: each server records a CRC of its shard after
every global step it applies (and of the published start), each worker records the CRC of each shard
of every global step it received; world rank 0 compares them once everyone is done and prints
``ODSGD TIMEOUT CHECKS OK`` (or ``TORN``, exit status 1).

The last worker is a straggler, slow at everything: its compute takes 10 times as long, its
process runs at the lowest priority, and its reads of the weights window arrive in two halves
``READ_PAUSE_MS`` apart (as a large read over a slow link does), so that the servers, which stop
waiting for it after ``TIMEOUT``, apply global steps while it reads.

Environment: ``SERVERS`` (1), ``NUMEL`` (elements of the flat model, 1 << 18), ``STEPS`` (100),
``TIMEOUT`` (seconds, 0.002), ``COMPUTE_MS`` (1), ``READ_PAUSE_MS`` (5).
"""
import logging
import os
import sys
import time
import zlib

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import hvd_async as ha  # noqa: E402
from harness import say  # noqa: E402
from hvd_async.algorithms import odsgd  # noqa: E402

SERVERS = int(os.environ.get("SERVERS", "1"))
NUMEL = int(os.environ.get("NUMEL", str(1 << 18)))
STEPS = int(os.environ.get("STEPS", "100"))
TIMEOUT = float(os.environ.get("TIMEOUT", "0.002"))
COMPUTE_S = float(os.environ.get("COMPUTE_MS", "1")) / 1000
READ_PAUSE = float(os.environ.get("READ_PAUSE_MS", "5")) / 1000
STRAGGLER = 10.0


def crc(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.detach().contiguous().numpy())


class _SlowReads:
    """The straggler's weights window: each ``Get`` reads its first half, waits ``READ_PAUSE``, then
    reads the second half; everything else goes to the window itself."""

    def __init__(self, win):
        self._win = win

    def Get(self, origin, target_rank, target=None):
        (array, datatype), (disp, count, target_type) = origin, target
        half = count // 2
        self._win.Get([array[:half], datatype], target_rank, target=(disp, half, target_type))
        self._win.Flush(target_rank)
        time.sleep(READ_PAUSE)
        self._win.Get([array[half:], datatype], target_rank, target=(disp + half, count - half, target_type))

    def __getattr__(self, name):
        return getattr(self._win, name)


class _Count(logging.Handler):
    """Counts the server's 'stopped waiting for worker m' warnings (and keeps them off stderr)."""

    def __init__(self):
        super().__init__()
        self.set_aside = 0

    def emit(self, record):
        if "--worker-timeout" in record.getMessage():
            self.set_aside += 1


def serve():
    held = set()  # CRCs of every state of this server's shard
    program_class = odsgd._GlobalStepProgram
    apply, request = program_class.maybe_apply, program_class.on_request

    def recording_apply(self, *args, **kwargs):
        before = self.host.version
        apply(self, *args, **kwargs)
        if self.host.version != before:
            held.add(crc(self.host.weights))

    def recording_request(self, worker, header):
        if not held:  # the published start (also a state workers may read)
            held.add(crc(self.host.weights))
        request(self, worker, header)

    program_class.maybe_apply, program_class.on_request = recording_apply, recording_request
    counter = _Count()
    window_log = logging.getLogger("hvd_async.transport.window")
    window_log.addHandler(counter)
    window_log.propagate = False
    report = ha.serve(worker_timeout=TIMEOUT)
    shard = report.shards[0]
    return {"server": ha.world_rank(), "held": held, "set_aside": counter.set_aside, "updates": shard.updates}


def work():
    rank, workers = ha.rank(), ha.size()
    if rank == workers - 1:  # (the exchange thread, started later, inherits it)
        os.nice(19)
    param = torch.nn.Parameter(torch.zeros(NUMEL))
    opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.01), [("w", param)],
                                  algorithm="od-sgd", local_lr=0.01, local_momentum=0.0)
    exchange = opt.strategy.exchange
    windows = exchange.transport._win
    bounds = exchange.transport.bounds
    straggler = rank == workers - 1
    if straggler:
        windows.weights = _SlowReads(windows.weights)
    reads = []  # per exchange: the CRC of each shard of the global step this worker received
    run_exchange = exchange._exchange

    def recording_exchange(header):
        answers = run_exchange(header)
        reads.append([crc(exchange.recv[start:stop]) for start, stop in bounds])
        return answers

    exchange._exchange = recording_exchange
    grad = torch.full((NUMEL,), 1e-3 * (rank + 1))
    compute = COMPUTE_S * (STRAGGLER if straggler else 1.0)
    opt.begin()
    for _ in range(STEPS):
        deadline = time.perf_counter() + compute  # busy, as computing is: the cores stay loaded
        while time.perf_counter() < deadline:
            pass
        param.grad = grad.clone()
        opt.step()
    opt.load_global_model()
    overlapped = getattr(exchange.transport, "overlapped_reads", None)  # (where the transport counts them)
    if straggler:
        windows.weights = windows.weights._win
    opt.close()
    ha.shutdown()
    return {"worker": rank, "reads": reads, "overlapped": overlapped}


def main() -> int:
    ha.init(servers=SERVERS)
    mine = serve() if ha.is_server() else work()
    everyone = MPI.COMM_WORLD.gather(mine, root=0)
    if MPI.COMM_WORLD.rank != 0:
        return 0
    held = [s["held"] for s in sorted((e for e in everyone if "server" in e), key=lambda e: e["server"])]
    workers = [e for e in everyone if "worker" in e]
    reads = sum(len(w["reads"]) for w in workers)
    torn = [(w["worker"], i, k) for w in workers for i, row in enumerate(w["reads"])
            for k, value in enumerate(row) if value not in held[k]]
    set_aside = sum(e["set_aside"] for e in everyone if "server" in e)
    updates = [e["updates"] for e in everyone if "server" in e]
    overlapped = [w["overlapped"] for w in sorted(workers, key=lambda w: w["worker"])]
    summary = (f"reads={reads} torn={len(torn)} set_aside={set_aside} updates={updates} "
               f"held={[len(h) for h in held]} overlapped={overlapped}")
    if torn:
        say(f"ODSGD TIMEOUT TORN {summary}: (worker, exchange, shard) read weights no server held: {torn[:20]}")
        return 1
    say(f"ODSGD TIMEOUT CHECKS OK {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

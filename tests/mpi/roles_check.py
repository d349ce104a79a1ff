"""Run under mpirun with SERVERS server ranks: roles, rank()/size(), and serve() ending when the last worker does.

Worker w sleeps w * 0.3 s before finishing, so workers finish at different times (the first one
early); each server must return only after the last worker, having seen every worker finish.
Prints 'ROLES OK' on every rank that passed its checks.
"""
import os
import sys
import time

import hvd_async as ha

servers = int(os.environ.get("SERVERS", "1"))
ha.init(servers=servers)
from mpi4py import MPI  # noqa: E402

world = MPI.COMM_WORLD
assert ha.num_servers() == servers and ha.world_size() == world.size
assert ha.size() == world.size - servers
assert ha.server_ranks() == list(range(servers))
if ha.is_server():
    start = time.perf_counter()
    report = ha.serve()
    assert sorted(report.workers_done) == ha.worker_ranks(), report.workers_done
    slowest = 0.3 * (ha.size() - 1)
    assert time.perf_counter() - start >= slowest - 0.05, "serve() returned before the last worker finished"
    try:
        ha.rank()
        sys.exit("rank() on a server must raise")
    except RuntimeError as exc:
        assert "server" in str(exc)
else:
    import horovod.torch as hvd
    import torch

    assert ha.rank() == world.rank - servers == hvd.rank()
    assert hvd.size() == ha.size()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)  # servers never join worker collectives
    assert int(total) == ha.size()
    time.sleep(0.3 * ha.rank())
ha.shutdown()  # (a server's is left to this; idempotent on the workers)
rt = ha.runtime._rt
assert rt.ctrl == MPI.COMM_NULL and rt.win_comm == MPI.COMM_NULL, "shutdown() must free the runtime's communicators"
print(f"ROLES OK rank {world.rank}", flush=True)

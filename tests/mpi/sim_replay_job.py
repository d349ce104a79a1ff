"""A real run for the simulator's replay test (tests/test_sim_replay.py), under mpirun with one server.

``HVD_ASYNC_WINDOW_TRACE=DIR mpirun -np 4 python tests/mpi/sim_replay_job.py EPOCHS [serial] [ALGO]`` trains
the digits MLP exactly as ``hvd-async simulate --algo ALGO --workers 3 --epochs EPOCHS`` (ALGO: asgd, the
default, or dc-asgd / lc-asgd, whose servers take the pushes through their mailbox) does with its
defaults (seed 0, batch 32, SGD lr 0.1 momentum 0.9, each worker's own random passes from
``jobstate.Batches``, an epoch ends for a worker once the pushes it has seen reach ``epoch x`` 45)
and records every worker's pushes and pulls in DIR. Worker 0 prints ``REPLAY JOB OK`` at the end.

``compiled``: the servers apply dc-asgd's and lc-asgd's pushes with the compiled loop
(``server_kernel='compiled'``; the digits model's shard is below the size ``auto`` compiles from).

``serial``: each ``opt.step()`` (push, then pull) holds a mutex over the workers (``mpi4py.util.sync``),
so no exchange overlaps another and every pull reads exactly the version it records; which worker
goes next is still up to real timing. Without it, exchanges race as they do in any real run.
"""
from contextlib import nullcontext
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

import hvd_async as ha
from hvd_async import data, models
from hvd_async.job.jobstate import Batches


def main(epochs: int, serial: bool, algorithm: str, compiled: bool = False) -> None:
    ha.init(servers=1)
    if ha.is_server():
        ha.serve()
        return
    torch.set_num_threads(1)
    rank, workers = ha.rank(), ha.size()
    splits = data.load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = models.build_model("mlp", splits.input_shape, splits.num_classes)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm=algorithm,
                                  **({"server_kernel": "compiled"} if compiled else {}))
    opt.begin()  # collective: before any step takes the mutex below
    batches = Batches(len(splits.train), 32, rank=rank, workers=workers, seed=0, synchronous=False)
    per_epoch = -(-len(splits.train) // 32)
    if serial:
        from mpi4py.util.sync import Mutex

        mutex = Mutex(comm=ha.worker_comm())
    else:
        mutex = nullcontext()
    for epoch in range(1, epochs + 1):
        while opt.progress() < epoch * per_epoch:
            x, y = default_collate([splits.train[i] for i in batches.next(epoch)])
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            with mutex:
                opt.step(loss=loss.detach())
        opt.load_global_model()
    if serial:
        mutex.free()
    opt.close()
    ha.shutdown()
    if rank == 0:
        print(f"REPLAY JOB OK {opt.progress()} pushes", flush=True)


if __name__ == "__main__":
    flags = sys.argv[2:]
    main(int(sys.argv[1]), "serial" in flags, next((f for f in flags if f not in ("serial", "compiled")), "asgd"),
         "compiled" in flags)

"""The job ``benchmarks/faults/answer_reads.py`` runs: 2 servers and the other ranks workers; each
worker takes 1 to 3 mailbox pushes (each answered, then the new weights read from its outbox slot),
then all call ``load_global_model()``, ``ROUNDS`` times. A worker whose step or snapshot has not
returned for ``STALL`` seconds prints ``STALL on worker N``, every thread's Python stack and exits 3
(which ends the job), so a wait that would never end is recorded with where it was."""
import faulthandler
import os
import sys
import threading
import time

import torch
import torch.nn.functional as F

import hvd_async as ha
from hvd_async.job.job_process import exit_process


def watch(last, stall: float) -> None:
    while True:
        time.sleep(0.5)
        if time.monotonic() - last[0] > stall:
            sys.stdout.write(f"STALL on worker {ha.rank()}\n")
            sys.stdout.flush()
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
            sys.stdout.flush()
            time.sleep(2)  # (the other workers print theirs)
            os._exit(3)


def main() -> None:
    algorithm, rounds = os.environ["ALGO"], int(os.environ["ROUNDS"])
    ha.init(servers=2)
    if ha.is_server():
        ha.serve()
        exit_process(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm=algorithm)
    g = torch.Generator().manual_seed(ha.rank())
    last = [time.monotonic()]
    threading.Thread(target=watch, args=(last, float(os.environ["STALL"])), daemon=True).start()
    for r in range(rounds):
        for _ in range(1 + (r + ha.rank()) % 3):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            last[0] = time.monotonic()
        opt.load_global_model()
        last[0] = time.monotonic()
    opt.close()
    ha.shutdown()
    if ha.rank() == 0:
        print(f"ROUNDS DONE {rounds}", flush=True)
    exit_process(0)


if __name__ == "__main__":
    main()

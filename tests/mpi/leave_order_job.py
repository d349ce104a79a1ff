"""A user's script in which each worker ends in its own way (tests/leave_orders.py), under mpirun: the
orders the leave protocol's checker explores (tests/unit/test_leave_protocol.py), run for real.

Each worker trains two epochs, each ended by ``opt.load_global_model()`` (a collective), inside
``try: ... except IOError: ... finally: opt.close()``, as a Horovod script that guards its data would.
A worker whose order is not ``finish`` fails in the middle of epoch ``point`` (after ``point``
collectives: the start, then the end of epoch 1): ``close``, an IOError the script catches;
``exit``, ``sys.exit(0)``; ``raise``, a RuntimeError nobody catches.

Environment: ALGO, SERVERS, LEAVES (one order per worker, comma-separated, e.g. ``finish,close-early``),
STEPS (per epoch, default 12), STEP_SECONDS (compute time injected per step, default 0.02).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from leave_orders import Leave  # noqa: E402

ALGO = os.environ.get("ALGO", "asgd")
SERVERS = int(os.environ.get("SERVERS", "1"))
LEAVES = os.environ.get("LEAVES", "finish,close-early").split(",")
STEPS = int(os.environ.get("STEPS", "12"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.02"))
FAULT_STEP = 4


def mark(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    import dataclasses

    import torch
    import torch.nn.functional as F

    import hvd_async as ha

    ha.init(servers=SERVERS)
    if ha.is_server():
        ha.serve()
        sys.exit(0)
    me = ha.rank()
    leave = Leave.parse(LEAVES[me])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fields = {f.name for f in dataclasses.fields(ha.registry.algorithm(ALGO).Options)}
    sized = {"batch_size": 16} if "batch_size" in fields else {}  # (dbs-asgd, lb-sgd: the nominal batch)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm=ALGO, **sized)
    try:
        for epoch in (1, 2):
            for step in range(STEPS):
                if leave.way != "finish" and leave.point == epoch and step == FAULT_STEP:
                    mark(f"FAULT {leave.name} on worker {me} at step {step} t={time.time():.3f}")
                    if leave.way == "close":
                        raise IOError(f"worker {me}: bad shard (injected)")
                    if leave.way == "exit":
                        sys.exit(0)
                    raise RuntimeError(f"injected error in worker {me}'s step code")
                g = torch.Generator().manual_seed(me * 1000 + epoch * 100 + step)
                x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step(loss=loss.detach())  # (lc-asgd's predictor reads the loss; the others ignore it)
                time.sleep(STEP_SECONDS)
            opt.load_global_model()
    except IOError as exc:
        mark(f"worker {me} caught: {exc}")
    finally:
        opt.close()
    mark(f"WORKER {me} DONE {leave.name}")


if __name__ == "__main__":
    main()

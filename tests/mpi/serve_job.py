"""A Horovod script with three lines changed (tests/test_dropin.py): ``ha.init(servers=1, serve=True)``
ends the server ranks when the workers finish, the script's own ``hvd.init()`` afterwards changes
nothing, and ``hvd.DistributedOptimizer`` became ``ha.DistributedOptimizer(..., algorithm=...)``.
With ``FAULT=1`` the server program raises at its third push: the whole job must end at once, the
server's message on the terminal, a non-zero exit."""
import os
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_async as ha

if os.environ.get("FAULT") == "1":  # an injected fault in the server loop, on the server ranks
    from hvd_async.algorithms import dcasgd

    original, calls = dcasgd.DCProgram.on_push, []

    def failing(self, worker, grad, header, *more):
        calls.append(worker)
        if len(calls) == 3:
            raise RuntimeError("injected fault in the server program")
        return original(self, worker, grad, header, *more)

    dcasgd.DCProgram.on_push = failing

ha.init(servers=1, serve=True)  # changed line 1 (was hvd.init()); server ranks end inside it
hvd.init()                      # the script's own call: harmless now
assert ha.is_worker(), "a server rank came back from ha.init(serve=True)"
assert (hvd.size(), hvd.rank()) == (ha.size(), ha.rank()), (hvd.size(), ha.size())
torch.manual_seed(0)
model = torch.nn.Linear(6, 3)
opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),  # changed line 2
                              named_parameters=model.named_parameters(), algorithm="dc-asgd")
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
for step in range(20):
    g = torch.Generator().manual_seed(hvd.rank() * 100 + step)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
opt.load_global_model()
print(f"WORKER {hvd.rank()} of {hvd.size()} DONE finite={bool(torch.isfinite(model.weight).all())}", flush=True)
sys.exit(0)

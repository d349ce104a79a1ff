"""A model with a frozen layer (``requires_grad=False``) handed whole to ``torch.optim.SGD`` with
momentum and weight decay, trained 15 steps under ``algorithm=ALGO``: the frozen layer must stay bit
for bit as it was (torch's SGD skips a parameter without a gradient; Horovod sends nothing for it),
the trained layer must move. Also counts the warnings of a Horovod-style ``opt.state_dict()`` taken
twice (once where the servers hold state that it lacks). Run by tests/test_faults.py at 2 workers."""
import os
import sys

import torch
import torch.nn.functional as F

import hvd_async as ha
from hvd_async.job.job_process import exit_process

ALGO = os.environ["ALGO"]
SERVERS = int(os.environ.get("SERVERS", "1"))

ha.init(servers=SERVERS)
if ha.is_server():
    ha.serve()
    exit_process(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
model[0].requires_grad_(False)
frozen = [p.detach().clone() for p in model[0].parameters()]
head = [p.detach().clone() for p in model[2].parameters()]
opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1),
                              named_parameters=model.named_parameters(), algorithm=ALGO,
                              **({"batch_size": 8} if ALGO in ("dbs-asgd", "lb-sgd") else {}))
for step in range(15):
    g = torch.Generator().manual_seed(ha.rank() * 100 + step)
    x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step(loss=loss.detach())
opt.load_global_model()
import warnings  # noqa: E402

with warnings.catch_warnings(record=True) as caught:  # a Horovod-style checkpoint's state_dict(), twice
    warnings.simplefilter("always")
    opt.state_dict(), opt.state_dict()
state_warnings = sum("algorithm_state_dict" in str(w.message) for w in caught)
same = all(torch.equal(a, b) for a, b in zip(frozen, model[0].parameters()))
moved = any(not torch.equal(a, b) for a, b in zip(head, model[2].parameters()))
norm = float(model[0].weight.norm() / frozen[0].norm())
sys.stdout.write(f"WORKER {ha.rank()} frozen_same={same} head_moved={moved} frozen_norm_ratio={norm:.6f} "
                 f"state_warnings={state_warnings}\n")
sys.stdout.flush()
opt.close()
exit_process(0)

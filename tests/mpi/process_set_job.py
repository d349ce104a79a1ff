"""ssgd over a Horovod process set (tests/test_dropin.py): 3 workers; workers 0 and 1 train a model
over the set {0, 1} with hvd_async's ssgd and, beside it, the same model with Horovod's own
DistributedOptimizer over the same set: the weights must agree bit for bit after every step, and
differ from worker 2's, which trains alone over its own set {2}. An algorithm that cannot give a
process set a meaning refuses it in one line. Needs HOROVOD_DYNAMIC_PROCESS_SETS=1."""
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_async as ha

ha.init()
pair, alone = hvd.add_process_set([0, 1]), hvd.add_process_set([2])
mine = pair if hvd.rank() < 2 else alone


def model_and(optimizer_of):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    return model, optimizer_of(model)


ours, opt = model_and(lambda m: ha.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                                         named_parameters=m.named_parameters(), process_set=mine))
theirs, ref = model_and(lambda m: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                                           named_parameters=m.named_parameters(), process_set=mine))
for step in range(6):
    g = torch.Generator().manual_seed(100 * hvd.rank() + step)
    x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
    for model, o in ((ours, opt), (theirs, ref)):
        o.zero_grad()
        F.cross_entropy(model(x), y).backward()
        o.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b), f"worker {hvd.rank()} step {step}: ssgd over the set differs from Horovod's"
flat = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
everyone = hvd.allgather_object(flat)
assert torch.equal(everyone[0], everyone[1]) and not torch.equal(everyone[0], everyone[2]), everyone
try:
    ha.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=ours.named_parameters(),
                            algorithm="gossip", process_set=mine)
    raise AssertionError("gossip accepted a process set")
except ValueError as exc:
    assert "has no meaning under gossip; it works with: ssgd" in str(exc), exc
sys.stdout.write(f"PROCESS SET OK worker {hvd.rank()}\n")

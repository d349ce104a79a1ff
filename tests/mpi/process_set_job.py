"""ssgd over a Horovod process set (tests/test_dropin.py); needs HOROVOD_DYNAMIC_PROCESS_SETS=1.

At 3 workers, workers 0 and 1 train a model over the set {0, 1} with hvd_async's ssgd and, beside it,
the same model with Horovod's own DistributedOptimizer over the same set: the weights must agree bit
for bit after every step, and differ from worker 2's, which trains alone over its own set {2}.

At any size, every worker builds the optimizer over the set {0}, members or not, as Horovod's own
``test_optimizer_process_sets`` does: worker 0 trains over its set of one, the others step locally and
exchange nothing, each bit for bit as Horovod's optimizer over the set and as a plain torch SGD.

An algorithm that cannot give a process set a meaning refuses it in one line, on members and
non-members alike."""
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_async as ha


def model_and(optimizer_of):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    return model, optimizer_of(model)


def ours_theirs_and(process_set, *more):
    """hvd_async's ssgd and Horovod's DistributedOptimizer over ``process_set``, then ``more`` optimizers."""
    makers = (lambda m: ha.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                                named_parameters=m.named_parameters(), process_set=process_set),
              lambda m: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                                 named_parameters=m.named_parameters(), process_set=process_set),
              *more)
    return [model_and(make) for make in makers]


def train_alike(pairs, what: str) -> None:
    """Six steps of each (model, optimizer) on this worker's batches; every model equal after each."""
    for step in range(6):
        g = torch.Generator().manual_seed(100 * hvd.rank() + step)
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        for model, o in pairs:
            o.zero_grad()
            F.cross_entropy(model(x), y).backward()
            o.step()
        for model, _ in pairs[1:]:
            for a, b in zip(pairs[0][0].parameters(), model.parameters()):
                assert torch.equal(a, b), f"worker {hvd.rank()} step {step}: {what}"


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def refused_by_gossip(model, process_set) -> None:
    try:
        ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                algorithm="gossip", process_set=process_set)
        raise AssertionError("gossip accepted a process set")
    except ValueError as exc:
        works = ", ".join(sorted(ha.wrapping.where_supported()["process_set"]))  # (ssgd among them)
        assert "ssgd" in works and f"has no meaning under gossip; it works with: {works}" in str(exc), exc


ha.init()
if hvd.size() == 3:
    pair, alone = hvd.add_process_set([0, 1]), hvd.add_process_set([2])
    mine = pair if hvd.rank() < 2 else alone
    pairs = ours_theirs_and(mine)
    train_alike(pairs, "ssgd over the set differs from Horovod's")
    ours = pairs[0][0]
    everyone = hvd.allgather_object(flat(ours))
    assert torch.equal(everyone[0], everyone[1]) and not torch.equal(everyone[0], everyone[2]), everyone
    refused_by_gossip(ours, mine)
    sys.stdout.write(f"PROCESS SET OK worker {hvd.rank()}\n")

first = hvd.add_process_set([0])
pairs = ours_theirs_and(first, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
train_alike(pairs, "ssgd over the set {0} differs from Horovod's or from a local SGD")
everyone = hvd.allgather_object(flat(pairs[0][0]))
assert all(not torch.equal(everyone[0], other) for other in everyone[1:]), "a worker's model was exchanged"
refused_by_gossip(pairs[0][0], first)
pairs[0][1].close()
sys.stdout.write(f"OUTSIDE THE SET OK worker {hvd.rank()} member={first.included()}\n")

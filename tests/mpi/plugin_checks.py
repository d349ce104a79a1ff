"""The example plugin (examples/local_sgd.py) through the Python API under mpirun: registered by
importing its file, built by DistributedOptimizer by name, with its option reaching the strategy.

Every worker trains on its own data with SGD and momentum; the weights must be equal across the
workers right after each averaging (every PERIOD steps) and differ in between, and
load_global_model() must make them the workers' average. Prints PLUGIN CHECKS OK on worker 0."""
import importlib.util
import os
import sys

import torch

import hvd_async as ha

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PERIOD = 3


def _import_example():
    spec = importlib.util.spec_from_file_location("local_sgd", os.path.join(ROOT, "examples", "local_sgd.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ha.init(servers=0)
    _import_example()
    comm = ha.worker_comm()
    try:
        ha.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1),
                                algorithm="local-sgd", period=0)
        raise AssertionError("period=0 was accepted")
    except ValueError as exc:
        assert "period must be an integer >= 1" in str(exc), exc
    torch.manual_seed(ha.rank())  # different initial weights: begin() must start all from worker 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm="local-sgd",
                                  period=PERIOD)
    assert opt.strategy.options.period == PERIOD
    gen = torch.Generator().manual_seed(100 + ha.rank())  # each worker its own data

    def weights():
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    def spread():
        everyone = comm.allgather(weights())
        return max(float((w - everyone[0]).abs().max()) for w in everyone)

    for step in range(1, 3 * PERIOD + 2):
        x, y = torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step % PERIOD == 0:
            assert spread() < 1e-6, f"step {step}: the weights differ right after an averaging ({spread()})"
        elif ha.size() > 1:
            assert spread() > 1e-4, f"step {step}: the weights were averaged between averagings"
    mine = weights()
    expected = sum(comm.allgather(mine)) / ha.size()
    opt.load_global_model()
    assert torch.allclose(weights(), expected, atol=1e-6), "load_global_model is not the workers' average"
    assert opt.stats()["averagings"] == 3 + 1 and opt.strategy.stats().extra["averagings"] == 3 + 1
    if ha.rank() == 0:
        print("PLUGIN CHECKS OK", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()

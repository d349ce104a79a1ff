"""The README's Python example, complete: ssgd on scikit-learn's digits with hvd_async.

    mpirun -np 2 python examples/quickstart.py      # or: horovodrun --mpi -np 2 python examples/quickstart.py
"""
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd_async as ha

ha.init(servers=0)                     # ranks 0..servers-1 would be parameter servers
if ha.is_server():
    ha.serve()                         # parameter-server algorithms: block until the workers finish
else:
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x, y = x[ha.rank()::ha.size()], y[ha.rank()::ha.size()]   # this worker's shard

    torch.manual_seed(0)               # the same initial model on every worker
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm="ssgd")
    for epoch in range(20):
        for i in range(0, len(x) - 31, 32):
            opt.zero_grad()
            F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"worker {ha.rank()} of {ha.size()}: training accuracy {accuracy:.3f}")

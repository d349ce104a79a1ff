"""docs/guide.md's complete example: any algorithm of the registry on scikit-learn's digits.

    mpirun -np 3 python examples/guide_example.py --algo dc-asgd     # 1 server + 2 workers
    mpirun -np 2 python examples/guide_example.py --algo hpsgd       # no server: 2 workers
"""
import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd_async as ha

parser = argparse.ArgumentParser()
parser.add_argument("--algo", default="dc-asgd", choices=ha.registry.names())
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

torch.set_num_threads(1)                   # ranks share this node's cores: one thread each
uses_servers = ha.registry.get(args.algo).uses_servers
ha.init(servers=1 if uses_servers else 0)  # ranks 0..servers-1 become parameter servers
if ha.is_server():
    ha.serve()                             # hosts the global weights until every worker closes
else:
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_test, y_test = x[1500:], y[1500:]
    x, y = x[ha.rank():1500:ha.size()], y[ha.rank():1500:ha.size()]  # this worker's shard

    torch.manual_seed(0)                   # the same initial model on every worker
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = ha.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), algorithm=args.algo,
        **({"batch_size": 32} if args.algo == "dbs-asgd" else {}))  # each algorithm's options: docs/guide.md
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)  # works through the wrapper

    for epoch in range(args.epochs):
        batch = getattr(opt.strategy, "batch_size", 32)   # dbs-asgd sets each worker's batch size
        for i in range(0, len(x) - batch + 1, batch):
            loss = F.cross_entropy(model(x[i:i + batch]), y[i:i + batch])
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss.detach())   # the loss travels with the push (lc-asgd needs it)
            batch = getattr(opt.strategy, "batch_size", batch)
        scheduler.step()
        opt.load_global_model()            # collective: every worker now holds the global weights
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if hasattr(opt.strategy, "resume_local"):  # easgd evaluated the centre; go on from its own weights
            opt.strategy.resume_local()

    stats = opt.stats()                    # staleness, exchange times, compensation norms, ...
    opt.close()                            # collective: frees the windows; the servers then return
    print(f"worker {ha.rank()} of {ha.size()}: {args.algo} test accuracy {accuracy:.3f}, "
          f"mean staleness {stats.get('staleness_mean', 0.0):.2f}")

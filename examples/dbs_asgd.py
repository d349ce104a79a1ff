"""dbs-asgd in a Horovod script: the three lines every algorithm changes, plus the DataLoader's
sampler, so that each worker's batch follows its speed (Ji et al., 2019).

    mpirun -np 4 python examples/dbs_asgd.py               # 1 parameter server + 3 workers
    mpirun -np 4 python examples/dbs_asgd.py --slow 2=3    # worker 2 three times slower: its batch shrinks

The Horovod original had ``DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset,
num_replicas=hvd.size(), rank=hvd.rank()))``; here the batch size goes to the optimizer (the nominal
batch per worker) and ``hvd_async.DynamicBatchSampler`` hands each worker batches of the size
dbs-asgd asks for, from one sequence shared by the workers (every sample once per epoch).
"""
import argparse
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import hvd_async as ha                                                       # 1. added

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--slow", default=None, metavar="WORKER=FACTOR",
                    help="emulate a device: every worker sleeps 1 ms per sample, that worker FACTOR ms")
args = parser.parse_args()

ha.init(servers=1, serve=True)                                               # 2. was hvd.init()
digits = load_digits()
dataset = TensorDataset(torch.tensor(digits.data / 16.0, dtype=torch.float32), torch.tensor(digits.target))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer = ha.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),  # 3. was hvd.
                                    algorithm="dbs-asgd", batch_size=32)
loader = DataLoader(dataset, batch_sampler=ha.DynamicBatchSampler(dataset, optimizer))  # 4. the sampler
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

worker, _, factor = (args.slow or "").partition("=")
delay = 0.0 if not args.slow else 0.001 * (float(factor) if int(worker) == hvd.rank() else 1.0)  # s a sample
for epoch in range(1, args.epochs + 1):
    sizes = []
    for x, y in loader:                                  # len(x): the batch dbs-asgd gives this worker now
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        time.sleep(delay * len(x))                       # --slow: the emulated device's time
        optimizer.step()
        sizes.append(len(x))
    print(f"worker {hvd.rank()}: batch sizes this epoch {min(sizes)} to {max(sizes)}, {len(sizes)} steps, "
          f"last {sizes[-1]}", flush=True)
    optimizer.load_global_model()                        # every worker holds the global weights
    with torch.no_grad():
        accuracy = (model(dataset.tensors[0]).argmax(1) == dataset.tensors[1]).float().mean().item()
    if hvd.rank() == 0:
        print(f"epoch {epoch}: accuracy on all of digits {accuracy:.3f}", flush=True)

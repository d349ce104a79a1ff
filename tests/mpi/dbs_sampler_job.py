"""dbs-asgd with hvd_async.DynamicBatchSampler under mpirun (1 server + 3 workers): compute injected
as a sleep per sample; worker 2 is 3x slow for epochs 0-1, then worker 0 is 3x slow and worker 2 is
not. Each worker checks that every batch has the size the strategy asked for, and prints its batch
sizes per epoch (tests/test_dbs_sampler.py reads them)."""
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import hvd_async as ha

PER_SAMPLE_S = 0.003  # the injected compute: well above a step's fixed cost on 2 shared cores
SLOW = [{2: 3.0}, {2: 3.0}, {0: 3.0}, {0: 3.0}]  # per epoch: worker -> how many times slower

ha.init(servers=1, serve=True)
torch.manual_seed(0)
data = TensorDataset(torch.randn(600, 8), torch.randn(600, 1))
model = torch.nn.Linear(8, 1)
opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
                              algorithm="dbs-asgd", batch_size=8, every=4)
loader = DataLoader(data, batch_sampler=ha.DynamicBatchSampler(data, opt))
drawn = []
for epoch, slow in enumerate(SLOW):
    sizes = []
    for x, y in loader:
        if len(x) != opt.strategy.batch_size:
            raise AssertionError(f"a batch of {len(x)} while the strategy asks for {opt.strategy.batch_size}")
        time.sleep(PER_SAMPLE_S * len(x) * slow.get(ha.rank(), 1.0))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sizes.append(len(x))
    drawn.append(sum(sizes))
    sys.stdout.write(f"SIZES worker {ha.rank()} epoch {epoch}: {' '.join(map(str, sizes))}\n")
    sys.stdout.flush()
total = ha.worker_comm().allreduce(sum(drawn))
if ha.rank() == 0:  # every position of the shared sequence went to one batch: 4 epochs and a straddle
    sys.stdout.write(f"TOTAL {total} of {len(data) * len(SLOW)}\n")

"""The reference job's SGD: torch's fused kernel for ssgd on CUDA (ssgd's non-finite guard then stays
on the device), the plain one everywhere else; the job's hyperparameters either way."""
import pytest
import torch

from hvd_async.job.jobspec import JobAlgorithm, JobOptions, JobSpec, Layout
from hvd_async.job.train import job_sgd


@pytest.mark.parametrize("algo,device,fused", [("ssgd", "cuda", True), ("ssgd", "cpu", False),
                                               ("asgd", "cuda", False), ("hpsgd", "cuda", False)])
def test_ssgd_on_cuda_gets_the_fused_kernel(algo, device, fused):
    spec = JobSpec(JobAlgorithm.named(algo), JobOptions(lr=0.05, momentum=0.9, weight_decay=1e-4), Layout(servers=0, workers=2))
    # (CPU tensors: torch's fused SGD accepts them too, and the choice depends on the job's device only)
    opt = job_sgd(spec, [torch.zeros(3, requires_grad=True)], torch.device(device))
    group = opt.param_groups[0]
    assert bool(group["fused"]) == fused
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.9, 1e-4)

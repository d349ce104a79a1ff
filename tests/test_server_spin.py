"""Whether a server's loop gives its core away while it spins (``ha.serve(spin_yield=...)``): by
default only where the node is oversubscribed, decided from the ranks' CPU sets. ``taskset`` pins the
whole job to one core or two, so the expectation does not depend on this machine's core count. Each
case is one mpirun job (procs.run fails on a hang and on any process left behind)."""
import pytest

from procs import mpirun, python

JOB = """
import os
import sys

import torch
import hvd_async as ha

ha.init(servers=1)
if ha.is_server():
    turns, real = [0], os.sched_yield

    def counting():
        turns[0] += 1
        real()

    os.sched_yield = counting
    over = ha.runtime._runtime().oversubscribed
    mode = sys.argv[1]
    ha.serve(**({} if mode == "auto" else {"spin_yield": {"on": True, "off": False}.get(mode, mode)}))
    sys.stdout.write(f"SERVER oversubscribed={over} yields={turns[0]}\\n")
else:
    model = torch.nn.Linear(4, 1)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                  named_parameters=model.named_parameters(), algorithm="asgd")
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    opt.close()
"""


@pytest.mark.parametrize("np, cores, mode, no_shm, oversubscribed, yields", [
    (2, "0,1", "auto", False, False, False),  # a rank per core: the server spins without yielding
    (2, "0", "auto", True, True, True),  # two ranks on one core: it yields
    (3, "0,1", "auto", True, True, True),  # three ranks on two cores
    (3, "0,1", "off", False, True, False),  # told not to
    (2, "0,1", "on", False, False, True),  # told to
])
def test_the_server_yields_its_core_only_where_it_is_shared(np, cores, mode, no_shm, oversubscribed, yields):
    result = mpirun(np, ["taskset", "-c", cores, *python("-c", JOB, mode)], no_shm=no_shm, timeout=120)
    assert result.returncode == 0, result.out[-3000:]
    lines = [line for line in result.out.splitlines() if line.startswith("SERVER ")]
    assert len(lines) == 1, result.out[-3000:]
    fields = dict(part.split("=") for part in lines[0].split()[1:])
    assert fields["oversubscribed"] == str(oversubscribed), lines
    assert (int(fields["yields"]) > 0) == yields, lines


def test_a_bad_spin_yield_ends_the_job_with_its_value():
    result = mpirun(2, python("-c", JOB, "sometimes"), timeout=120)
    assert result.returncode != 0
    assert "serve(): spin_yield must be True, False or None (where the node is oversubscribed), got 'sometimes'" \
        in result.out, result.out[-3000:]

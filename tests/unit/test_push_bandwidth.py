"""benchmarks/speed/push_bandwidth.py counts a push's memory traffic from its tensor operations: the count
itself, checked on operations whose traffic is known."""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks", "speed")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

from push_bandwidth import Traffic, make_program, pushes  # noqa: E402

N = 1000


def test_traffic_counts_what_each_operation_reads_and_writes():
    a, b, c = torch.ones(N), torch.ones(N), torch.empty(N)
    with Traffic() as copy:
        c.copy_(a)  # reads a, writes c (c is not read)
    with Traffic() as add:
        torch.add(a, b, out=c)  # reads a and b, writes c
    with Traffic() as inplace:
        c.mul_(2.0)  # reads and writes c
    with Traffic() as view:
        a[: N // 2].view(-1)  # no data moves
    assert (copy.read, copy.written) == (4 * N, 4 * N)
    assert (add.read, add.written) == (8 * N, 4 * N)
    assert (inplace.read, inplace.written) == (4 * N, 4 * N)
    assert (view.read, view.written) == (0, 0)


def test_a_dc_asgd_push_moves_at_least_its_papers_passes():
    """The gradient, the weights and the backup read, the weights and the answer written: at least five
    passes over the shard, whatever the implementation adds."""
    program, requests = make_program("dc-asgd", N)
    pushes(program, requests, 8)
    with Traffic() as traffic:
        pushes(program, requests, 4)
    assert (traffic.read + traffic.written) / 4 >= 5 * 4 * N


def test_a_bad_size_is_one_line_naming_it(capsys):
    """A size argparse cannot read until after parsing (the list of --sizes) is argparse's usage error
    (exit status 2, one line naming it), not a traceback."""
    import pytest

    import push_bandwidth

    with pytest.raises(SystemExit) as exit_:
        push_bandwidth.main(["--sizes", "1MB,12", "--out", os.devnull])
    assert exit_.value.code == 2
    assert "size '12' must look like 256KB or 4MB" in capsys.readouterr().err.splitlines()[-1]

"""lb-sgd (load-balanced synchronous SGD) under mpirun: tests/mpi/lbsgd_checks.py at 2 and 4 workers, no
server, speeds injected through the transports' clocks: equal speeds give exactly ssgd's steps, unequal
ones the sample-weighted mean of the workers' gradients, and the batch sizes follow a change of speed."""
import pytest

from procs import mpirun, python

CHECKS = "equal_speeds_are_ssgd unequal_speeds_weighted_mean sizes_follow_a_speed_change"


@pytest.mark.parametrize("np", [2, 4])
def test_lb_sgd_values(np):
    result = mpirun(np, python("tests/mpi/lbsgd_checks.py"), env={"SERVERS": "0"}, timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert f"LBSGD CHECKS OK {CHECKS}" in result.out, result.out[-3000:]

"""backup-sgd (synchronous SGD with backup workers) under mpirun: tests/mpi/backup_checks.py at 3 and 4
workers and one server, shared memory on and off: each step is the mean of the first workers - b
pushes, the late ones are dropped and counted; and a training job with a straggler."""
import json
import re

import pytest

from procs import mpirun, python, run

CHECKS = "default_and_bad_values answers_say_dropped first_n_minus_b"


@pytest.mark.parametrize("np", [4, 5])
@pytest.mark.parametrize("no_shm", [False, True], ids=["shm", "no-shm"])
def test_backup_sgd_values(np, no_shm):
    result = mpirun(np, python("tests/mpi/backup_checks.py"), no_shm=no_shm, env={"SERVERS": "1"}, timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert f"BACKUP CHECKS OK {CHECKS}" in result.out, result.out[-3000:]
    assert re.search(r"SERVER 0 DONE order=\[", result.out), result.out[-3000:]

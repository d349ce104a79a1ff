"""A pool of inbox slots smaller than the workers (``inbox_slots``): pushes queue for a slot, none is
lost. tests/mpi/stress_job.py pushes integer gradients with lr=1 through the real strategies, every
worker at full speed so that slots are fought over, and checks that the final global weights are the
start less every push, exactly, and that the servers counted every push; the backup workers' values
and the checkpoints' round trip across pool sizes are in test_backup_sgd.py and
test_checkpoint_resume.py."""
import re

import pytest

from procs import mpirun, python


@pytest.mark.parametrize("algo,np,servers,slots,no_shm", [
    ("dc-asgd", 4, 1, 1, False),
    ("dc-asgd", 5, 2, 1, True),  # two shards of one slot each: claimed in one order, or two workers deadlock
    ("softsync", 5, 2, 2, False),
    ("od-sgd", 4, 1, 1, True),
    ("lc-asgd", 3, 1, 1, False),
])
def test_pushes_queue_for_a_slot_and_all_land(algo, np, servers, slots, no_shm):
    result = mpirun(np, python("tests/mpi/stress_job.py", algo, "7", "0", "60"), no_shm=no_shm,
                    env={"SERVERS": str(servers), "INBOX_SLOTS": str(slots)}, timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert f"STRESS JOB OK {algo}" in result.out, result.out[-3000:]
    assert re.search(rf"STRESS CHECKED {re.escape(algo)} pushes=\d+ exact", result.out), result.out[-3000:]
    pooled = re.search(r"STRESS SLOTS pooled=(\w+) slots=(\d+) waits=(\d+)", result.out)
    assert pooled and pooled.group(1) == "True" and int(pooled.group(2)) == slots, result.out[-3000:]

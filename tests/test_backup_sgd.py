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


@pytest.mark.parametrize("np,no_shm", [(3, False), (4, True)], ids=["2-workers-shm", "3-workers-no-shm"])
def test_backup_sgd_values_with_the_compiled_update(np, no_shm):
    """The same values where the servers' compiled loop applies every update, reading the accepted
    gradients from the inbox slots they wait in until the round's last one lands (a worker pushes
    again only after its answer): at backups 0, 1 (and 2 at 3 workers), every round's update compiled."""
    result = mpirun(np, python("tests/mpi/backup_checks.py", "first_n_minus_b"), no_shm=no_shm,
                    env={"SERVERS": "1", "SERVER_KERNEL": "compiled"}, timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert "BACKUP CHECKS OK first_n_minus_b" in result.out, result.out[-3000:]
    shards = re.findall(r"SHARD 0 backup-sgd numel=\d+ updates=(\d+) .* compiled=(\d+)", result.out)
    assert len(shards) == len({0, 1, np - 2}) and all(u == c == "5" for u, c in shards), result.out[-3000:]


@pytest.mark.parametrize("slots", [1, 2])
def test_backup_sgd_values_with_a_pool_of_inbox_slots(slots):
    """The same values with fewer inbox slots than workers: the accepted gradients are summed as they
    land, the dropped ones never wait for the others."""
    result = mpirun(5, python("tests/mpi/backup_checks.py"), env={"SERVERS": "1", "INBOX_SLOTS": str(slots)},
                    timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert f"BACKUP CHECKS OK {CHECKS}" in result.out, result.out[-3000:]


def test_backup_sgd_trains_past_a_straggler(tmp_path):
    """4 workers, worker 3 three times slower (10 ms of compute a step): one backup keeps the job going at
    the fast workers' pace, the straggler's late gradients are dropped, and digits still trains (an
    ssgd run of the same settings reached 0.950)."""
    metrics = tmp_path / "m.json"
    result = run(python("-m", "hvd_async.job.cli", "train", "--algo", "backup-sgd", "--np", "5", "--servers", "1",
                        "--straggler", "3=3", "--compute-ms", "10", "--epochs", "6",
                        "--metrics-out", str(metrics), "--progress", "epochs"), timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert record["final_test_accuracy"] >= 0.93, record["history"]
    updates = int(re.search(r"server 0: backup-sgd shard of \d+ parameters: (\d+) updates from (\d+) pushes",
                            result.out).group(1))
    # every update took workers - backups = 3 gradients (2 or 1 while workers go idle at an epoch's end)
    assert 2 * updates < record["updates"] <= 3 * updates, (record["updates"], updates)
    assert record["staleness_max"] == 0  # no stale gradient was applied
    assert record["samples"] > record["updates"] * 32  # the dropped pushes' samples: drawn, never applied
    # the late pushes the servers dropped, counted in the metrics (each push a batch of up to 32 samples)
    assert 0 < record["dropped_pushes"] and record["updates"] + record["dropped_pushes"] <= record["samples"] / 16

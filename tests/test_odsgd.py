"""od-sgd under mpirun: both exchanges against the float64 replays (tests/mpi/odsgd_checks.py) at 2 to 5
ranks with 1 and 2 server shards, shared memory on and off; and the training job on digits."""
import json
import re

import pytest

from procs import mpirun, python, run

CLI = python("-m", "hvd_async.job.cli")
MODES = {"shm": False, "no-shm": True}
CHECKS = "ODSGD CHECKS OK recurrence delayed synchronize_midway nonfinite overlap"


@pytest.mark.parametrize("np,servers,mode", [(2, 1, "shm"), (3, 1, "no-shm"), (4, 2, "shm"), (5, 2, "no-shm")])
def test_odsgd_checks(np, servers, mode):
    result = mpirun(np, python("tests/mpi/odsgd_checks.py"), no_shm=MODES[mode], env={"SERVERS": str(servers)},
                    timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert CHECKS in result.out, result.out[-3000:]
    assert len(re.findall(r"SERVER \d DONE", result.out)) == servers


@pytest.mark.parametrize("exchange,np", [("window", 5), ("allreduce", 4)])
def test_odsgd_job_reaches_accuracy_and_reports_the_wait(tmp_path, exchange, np):
    metrics, logdir = tmp_path / "m.json", tmp_path / "tb"
    result = run(CLI + ["train", "--algo", "od-sgd", "--od-exchange", exchange, "--np", str(np),
                        "--local-lr", "0.05", "--metrics-out", str(metrics), "--logdir", str(logdir)],
                 timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert (record["workers"], record["servers"]) == (4, 1 if exchange == "window" else 0)
    assert record["final_test_accuracy"] >= 0.90, record["history"]
    assert 0.8 < record["staleness_mean"] <= 1.0 and record["staleness_max"] == 1  # one step late
    assert record["exchange_blocked_ms_mean"] >= 0
    for entry in record["history"]:
        assert entry["exchange_blocked_ms_per_step"] >= 0 and entry["compute_ms_per_step"] > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert "time/exchange_blocked_ms_per_step" in scalars and "time/compute_ms_per_step" in scalars, scalars
    assert len(acc.Scalars("time/exchange_blocked_ms_per_step")) == 10


@pytest.mark.parametrize("flags,fragment", [
    (["--od-exchange", "allreduce", "--servers", "1"], "with --od-exchange allreduce uses no parameter server"),
    (["--local-lr", "-1"], "--local-lr must be a finite number >= 0 (0: one-step-delayed ssgd), got -1.0"),
    (["--local-momentum", "1"], "--local-momentum must be in [0, 1), got 1.0"),
    (["--od-exchange", "nccl"], "argument --od-exchange: invalid choice: 'nccl'"),
])
def test_odsgd_bad_options(flags, fragment):
    result = run(CLI + ["train", "--algo", "od-sgd", "--np", "3"] + flags, timeout=60)
    assert result.returncode == 2, result.out
    assert fragment in result.out, result.out

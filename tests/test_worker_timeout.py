"""--worker-timeout: a worker that stops making progress without dying (SIGSTOP) mid-run.
Parameter-server algorithms go on without it, write their results and end with exit status 4;
synchronous ones name it and stop with exit status 5; nothing hangs and no process is left."""
import json
import re
import signal

import pytest

from jobs import BackgroundJob
from procs import python

CLI = python("-m", "hvd_async.job.cli")


def _job(tmp_path, algo, np, *extra):
    metrics = tmp_path / "m.json"
    job = BackgroundJob(CLI + ["train", "--algo", algo, "--np", str(np), "--epochs", "6", "--compute-ms", "60",
                               "--worker-timeout", "4", "--metrics-out", str(metrics), *extra])
    assert job.wait_for("epoch 1/6"), job.out[-3000:]
    stopped_at = job.signal_rank(2, signal.SIGSTOP)
    return job, metrics, stopped_at


@pytest.mark.parametrize("algo,extra", [("asgd", []), ("softsync", ["--softsync-n", "1"])])
def test_parameter_server_goes_on_without_a_stalled_worker(tmp_path, algo, extra):
    job, metrics, _ = _job(tmp_path, algo, 5, *extra)  # world rank 2 is worker 1
    code = job.finish(timeout=300)
    out = job.out
    assert code == 4, out[-4000:]
    assert "worker(s) 1 made no progress for 4 s (--worker-timeout): going on with 3 worker(s)" in out, out[-4000:]
    assert re.search(r"server 0: finished without worker\(s\) 1, which made no progress", out), out[-4000:]
    record = json.loads(metrics.read_text())
    assert record["dropped_workers"] == [1] and len(record["history"]) == 6
    assert record["final_test_accuracy"] >= 0.85, record["history"]
    assert not job.left_behind()


def test_synchronous_job_names_the_stalled_worker_and_stops(tmp_path):
    job, _, stopped_at = _job(tmp_path, "ssgd", 4)  # no servers: world rank 2 is worker 2
    code = job.finish(timeout=300)
    out = job.out
    assert code == 5, out[-4000:]
    lines = [line for _, line in job.lines if "made no progress" in line]
    assert len(lines) == 1 and "worker(s) 2 made no progress" in lines[0], out[-4000:]
    reported = job.first_line_time("made no progress")
    assert reported - stopped_at < 60, f"reported {reported - stopped_at:.0f} s after the stop"
    assert "a worker stopped making progress (--worker-timeout; named above)" in out
    assert not job.left_behind()

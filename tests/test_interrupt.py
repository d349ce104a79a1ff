"""A cancel is not a crash: SIGINT sent to mpirun alone (``kill -INT``, as some schedulers cancel),
or SIGTERM sent to the launcher (Slurm's ``scancel``), ends the job promptly with "interrupted", the
signal's exit status and no restart, even with ``--max-restarts``; nothing is left behind."""
import signal
import time

import psutil
import pytest

from jobs import BackgroundJob
from procs import python

CLI = python("-m", "hvd_async.job.cli")


def _mpirun(job):
    for child in psutil.Process(job.proc.pid).children():
        if child.name() == "mpirun" or child.name().startswith("orterun"):
            return child
    raise AssertionError(f"no mpirun under the launcher:\n{job.out[-3000:]}")


@pytest.mark.parametrize("target,sig,status", [("mpirun", signal.SIGINT, 130), ("launcher", signal.SIGTERM, 143)])
def test_a_cancel_ends_the_job_as_interrupted_and_is_never_restarted(tmp_path, target, sig, status):
    job = BackgroundJob(CLI + ["train", "--algo", "asgd", "--np", "3", "--epochs", "30", "--compute-ms", "20",
                               "--checkpoint-dir", str(tmp_path / "ck"), "--max-restarts", "2"])
    assert job.wait_for("epoch 1/30"), job.out[-3000:]
    victim = _mpirun(job) if target == "mpirun" else psutil.Process(job.proc.pid)
    sent = time.time()
    victim.send_signal(sig)
    code = job.finish(timeout=120)
    out = job.out
    assert code == status, out[-3000:]
    assert time.time() - sent < 20, out[-3000:]
    assert "hvd-async train: interrupted" in out and "not restarted" in out, out[-3000:]
    assert "restart 1 of" not in out and "error:" not in out, out[-3000:]
    assert not job.left_behind()

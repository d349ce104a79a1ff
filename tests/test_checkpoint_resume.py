"""Checkpoints under mpirun: every algorithm's state (servers included) round-trips exactly
(tests/mpi/state_checks.py); the job resumes bit for bit (ssgd), refuses another job's checkpoint,
restarts after a worker is killed, and stops on a streak of non-finite gradients."""
import json
import os
import re
import shutil
import signal
import time

import pytest

from hvd_async import registry
from procs import mpirun, python, run


@pytest.mark.parametrize("np,servers,no_shm", [(3, 1, False), (5, 2, True), (2, 0, False), (3, 0, True)])
def test_state_round_trips_exactly(np, servers, no_shm):
    result = mpirun(np, python("tests/mpi/state_checks.py"), no_shm=no_shm, env={"SERVERS": str(servers)},
                    timeout=300)
    assert result.returncode == 0, result.out[-6000:]
    serverless = registry.serverless()  # (the checks run the servers' algorithms first, each in the registry's order)
    ordered = sorted(registry.NAMES, key=lambda name: name in serverless)
    expected = (" ".join(ordered + ["other_slots", "foreign_state", "streamed", "resume_exact"]) if servers
                else " ".join(name for name in ordered if name in serverless or name == "od-sgd"))
    assert f"STATE CHECKS OK {expected}" in result.out, result.out[-3000:]


CLI = python("-m", "hvd_async.job.cli")


def train(*argv, timeout=300):
    return run(CLI + ["train", *argv], timeout=timeout)


def final_checkpoint(directory):
    from hvd_async import checkpoint
    from hvd_async.job import jobstate

    return jobstate.read_whole(checkpoint.latest(str(directory)))


def shard_states(directory):
    """The servers' shards of the newest checkpoint in ``directory``, read from their own files."""
    from hvd_async import checkpoint
    from hvd_async.job import jobstate

    path = checkpoint.latest(str(directory))
    named = jobstate.read_whole(path)["workers"][0]["algorithm"]["strategy"]["servers"]
    return [checkpoint.load(os.path.join(jobstate.parts_folder(path), entry["shard_file"])) for entry in named]


def whole(path):
    """Every file of the job checkpoint at ``path`` loads: its own, the workers' parts, the shards'."""
    from hvd_async import checkpoint
    from hvd_async.job import jobstate

    state = jobstate.read_whole(path)
    named = state["workers"][0]["algorithm"]["strategy"].get("servers", [])
    return state, [checkpoint.load(os.path.join(jobstate.parts_folder(path), entry["shard_file"]))
                   for entry in named]


def test_a_checkpoint_is_a_folder_of_parts_each_process_wrote(tmp_path):
    """Each worker and the server write their own files (nothing gathered to worker 0); the file
    that names the folder comes last, so a folder no file names (a save cut short) is not resumed
    from and is removed by the next save, as are the folders of checkpoints past --keep-checkpoints;
    the job resumes from the parts, and from a checkpoint written as one file (earlier versions)."""
    import torch

    from hvd_async import checkpoint

    ck = tmp_path / "ck"
    common = ["--algo", "dc-asgd", "--np", "3", "--keep-checkpoints", "1"]
    assert train(*common, "--checkpoint-dir", str(ck), "--epochs", "2").returncode == 0
    files, folders = sorted(ck.glob("ckpt-*.pt")), sorted(ck.glob("ckpt-*.parts"))
    assert len(files) == 1 and len(folders) == 1, sorted(os.listdir(ck))
    assert sorted(os.listdir(folders[0])) == ["shard-0.pt", "worker-0.pt", "worker-1.pt"]
    top = checkpoint.load(str(files[0]))
    assert (top["parts"], top["workers"]) == (folders[0].name, 2) and "workers" not in top["job"]
    state, shards = whole(str(files[0]))
    assert state["workers"][0]["algorithm"]["strategy"]["servers"][0]["shard_file"] == "shard-0.pt"
    assert int(shards[0]["meta"][0]) == state["workers"][0]["algorithm"]["strategy"]["global_pushes"]

    cut = ck / "ckpt-100000-0badc0de.parts"  # a later save cut short: parts, and no file naming them
    cut.mkdir()
    (cut / "worker-0.pt").write_bytes(b"half a part")
    legacy = tmp_path / "legacy"  # the same checkpoint as one file, as written before parts had files
    worker0 = state["workers"][0]["algorithm"]["strategy"]
    worker0["servers"] = shards
    meta = torch.load(str(files[0]), weights_only=True)["meta"]
    checkpoint.save_in(str(legacy), int(files[0].stem.split("-")[1]),
                       {"workers": state["workers"], "job": state["job"]}, meta=meta)
    for directory in (ck, legacy):
        result = train(*common, "--checkpoint-dir", str(directory), "--epochs", "3", "--resume")
        assert result.returncode == 0, result.out[-3000:]
        assert f"resumed from {files[0].name}" in result.out.replace(str(directory) + "/", ""), result.out[-3000:]
    assert not cut.exists() and len(list(ck.glob("ckpt-*.parts"))) == 1, sorted(os.listdir(ck))


def checkpoint_steps(directory):
    return sorted(int(path.stem.split("-")[1]) for path in directory.glob("ckpt-*.pt"))


def assert_same_training_state(a, b):
    """Every worker's model, optimizer state and batch position equal, bit for bit."""
    import torch

    assert len(a["workers"]) == len(b["workers"])
    for worker, (x, y) in enumerate(zip(a["workers"], b["workers"])):
        for name in x["model"]:
            assert torch.equal(x["model"][name], y["model"][name]), (worker, name)
        for key, state in x["optimizer"]["state"].items():
            other = y["optimizer"]["state"][key]
            assert all(torch.equal(state[k], other[k]) for k in state), (worker, key)
        assert x["batches"] == y["batches"] and x["counters"]["steps"] == y["counters"]["steps"]
    assert [h["test_accuracy"] for h in a["job"]["history"]] == [h["test_accuracy"] for h in b["job"]["history"]]


@pytest.mark.parametrize("every,stop_at", [("1", None), ("20steps", "ckpt-60.pt")])
def test_ssgd_resume_is_bit_exact(tmp_path, every, stop_at):
    """2 epochs, then resumed to 4 (or: resumed from a checkpoint in the middle of epoch 2), equals 4
    epochs straight, bit for bit."""
    common = ["--algo", "ssgd", "--np", "3", "--deterministic", "--checkpoint-every", every]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = train(*common, "--epochs", "4", "--checkpoint-dir", str(straight), "--keep-checkpoints", "10")
    assert result.returncode == 0, result.out[-3000:]
    if stop_at is None:
        first = train(*common, "--epochs", "2", "--checkpoint-dir", str(resumed))
        assert first.returncode == 0, first.out[-3000:]
    else:  # the same (deterministic) run cut off: the straight run's checkpoints up to stop_at
        from hvd_async.job import jobstate

        resumed.mkdir()
        for path in straight.glob("ckpt-*.pt"):
            if int(path.stem.split("-")[1]) <= int(stop_at.split("-")[1].split(".")[0]):
                shutil.copy(path, resumed / path.name)
                folder = jobstate.parts_folder(str(path))
                shutil.copytree(folder, resumed / os.path.basename(folder))
        assert (resumed / stop_at).exists() and max(checkpoint_steps(resumed)) < max(checkpoint_steps(straight))
    second = train(*common, "--epochs", "4", "--checkpoint-dir", str(resumed), "--resume")
    assert second.returncode == 0, second.out[-3000:]
    assert "resumed from" in second.out
    assert max(checkpoint_steps(resumed)) == max(checkpoint_steps(straight))  # the resumed run wrote the last
    assert_same_training_state(final_checkpoint(straight), final_checkpoint(resumed))


@pytest.mark.parametrize("algo,extra", [("asgd", []), ("dc-asgd", ["--checkpoint-every", "25steps"])])
def test_async_resume_trains_on(tmp_path, algo, extra):
    ck, metrics = tmp_path / "ck", tmp_path / "m.json"
    first = train("--algo", algo, "--np", "4", "--epochs", "2", "--checkpoint-dir", str(ck), *extra)
    assert first.returncode == 0, first.out[-3000:]
    saved = final_checkpoint(ck)
    servers = shard_states(ck)  # each server wrote its own shard's file
    assert len(servers) == 1 and int(servers[0]["meta"][0]) == saved["workers"][0]["algorithm"]["strategy"]["global_pushes"]
    second = train("--algo", algo, "--np", "4", "--epochs", "4", "--checkpoint-dir", str(ck), "--resume",
                   "--metrics-out", str(metrics), *extra)
    assert second.returncode == 0, second.out[-3000:]
    record = json.loads(metrics.read_text())
    assert [h["epoch"] for h in record["history"]] == [1, 2, 3, 4]
    assert record["final_test_accuracy"] >= 0.85, record["history"]
    assert record["updates"] >= 4 * 45  # the servers' counter went on from the saved one


def test_resume_refuses_another_job(tmp_path):
    """The launcher refuses before mpirun starts (no rank prints its torch threads), with one line."""
    ck = tmp_path / "ck"
    assert train("--algo", "asgd", "--np", "3", "--epochs", "1", "--checkpoint-dir", str(ck)).returncode == 0

    def refused(*argv):
        result = train(*argv, "--epochs", "3", "--resume")
        assert result.returncode == 2, result.out[-3000:]
        errors = [line for line in result.out.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].startswith("hvd-async train: error: "), result.out[-3000:]
        assert "torch threads per rank" not in result.out, result.out[-3000:]
        return errors[0]

    for argv, expected in (
            (["--algo", "dc-asgd", "--np", "3"], "was written with algorithm='asgd'; this job runs with "
                                                 "algorithm='dc-asgd'"),
            (["--algo", "asgd", "--np", "4"], "was written with workers=2; this job runs with workers=3"),
            (["--algo", "asgd", "--np", "3", "--model", "cnn"], "model='mlp'"),
            (["--algo", "asgd", "--np", "3", "--batch-size", "16"], "batch_size=16")):
        assert expected in refused(*argv, "--checkpoint-dir", str(ck))
    assert "no checkpoint (ckpt-<step>.pt) in" in refused("--np", "2", "--checkpoint-dir", str(tmp_path / "none"))
    (ck / "ckpt-999.pt").write_bytes(b"not a checkpoint")
    assert "is truncated, corrupt or not a torch file" in refused("--algo", "asgd", "--np", "3", "--checkpoint-dir",
                                                                  str(ck))


def test_nonfinite_streak_stops_with_a_checkpoint(tmp_path):
    for algo in ("ssgd", "asgd"):
        ck = tmp_path / algo
        result = train("--algo", algo, "--np", "3", "--lr", "1e30", "--max-nonfinite", "5", "--checkpoint-dir", str(ck))
        assert result.returncode == 3, result.out[-3000:]
        assert len(re.findall(r"error: stopped in epoch 1: 5 gradients in a row held NaN or infinity",
                              result.out)) == 1, result.out[-3000:]
        state = final_checkpoint(ck)  # the state it names loads, and nothing non-finite was applied
        assert f"the last good state is in {ck}" in result.out
        assert state["workers"][0]["algorithm"]["strategy"]["skipped_nonfinite"] >= 5


def test_killed_worker_restarts_from_the_last_checkpoint(tmp_path):
    """SIGKILL one asgd worker mid-run: mpirun ends the job at once, the launcher relaunches it from
    the newest checkpoint (intact), and the run finishes with accuracy in the normal range."""
    from hvd_async import checkpoint
    from jobs import BackgroundJob

    ck, metrics = tmp_path / "ck", tmp_path / "m.json"
    job = BackgroundJob(CLI + ["train", "--algo", "asgd", "--np", "4", "--epochs", "8", "--compute-ms", "50",
                               "--checkpoint-dir", str(ck), "--max-restarts", "1", "--metrics-out", str(metrics)])
    assert job.wait_for("epoch 1/8"), job.out[-3000:]
    deadline = time.time() + 60  # worker 0 writes the epoch's checkpoint after printing its line
    while (before := checkpoint.latest(str(ck))) is None and time.time() < deadline:
        time.sleep(0.05)
    assert before is not None, job.out[-3000:]
    killed_at = job.signal_rank(2, signal.SIGKILL)  # world rank 2: worker 1 (rank 0 is the server)
    whole(before)  # what was there when the worker died is whole
    assert job.finish(timeout=300) == 0, job.out[-4000:]
    out = job.out
    restarted_at = job.first_line_time("restart 1 of 1 from")
    assert restarted_at is not None and restarted_at - killed_at < 30, out[-4000:]
    restart = next(line for _, line in job.lines if "restart 1 of 1 from" in line)
    assert "killed by SIGKILL" in restart and "ckpt-" in restart and "resumed from" in out
    assert "mpirun noticed that process rank 2" in out  # the dead rank is named
    record = json.loads(metrics.read_text())
    assert [h["epoch"] for h in record["history"]] == list(range(1, 9))
    assert record["final_test_accuracy"] >= 0.85, record["history"]
    for path in ck.glob("ckpt-*.pt"):
        whole(str(path))
    assert not job.left_behind()


@pytest.mark.parametrize("algo", ["lc-asgd", "softsync", "dbs-asgd", "od-sgd", "hpsgd", "gossip", "easgd"])
def test_every_algorithm_resumes_in_the_job(tmp_path, algo):
    """The second run continues the first: it says so with the first run's update count, its epoch 1
    is the first run's own record (a fresh start would retrain and remeasure it), and its count of
    updates goes on from there."""
    ck, metrics, first_metrics = tmp_path / "ck", tmp_path / "m.json", tmp_path / "m1.json"
    first = train("--algo", algo, "--np", "3", "--epochs", "1", "--checkpoint-dir", str(ck),
                  "--metrics-out", str(first_metrics))
    assert first.returncode == 0, first.out[-3000:]
    result = train("--algo", algo, "--np", "3", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume",
                   "--metrics-out", str(metrics))
    assert result.returncode == 0, result.out[-3000:]
    record, before = json.loads(metrics.read_text()), json.loads(first_metrics.read_text())
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    assert record["history"][0]["train_loss"] == before["history"][0]["train_loss"], (record, before)
    assert record["history"][0]["test_accuracy"] == before["history"][0]["test_accuracy"]
    assert f"epoch 2, {before['updates']} updates so far" in result.out, result.out[-2000:]
    assert record["updates"] > before["updates"]
    assert record["final_test_accuracy"] >= 0.7, record["history"]

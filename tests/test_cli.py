"""The hvd-async command and the training job as a user runs them: results, files, and errors."""
import json
import re
import time

import pytest

from procs import mpirun, python, run

from hvd_async import registry

CLI = python("-m", "hvd_async.job.cli")


@pytest.mark.parametrize("argv,match", [
    (["--algo", "nope"], "unknown algorithm 'nope'; choose one of: ssgd"),
    (["--dataset", "svhn"], "unknown dataset 'svhn'"),
    (["--model", "vgg"], "unknown model 'vgg'"),
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--np", "2", "--servers", "2"], "--servers 2 leaves no worker"),
    (["--np", "3", "--compute-ms", "5", "--straggler", "3=2"], "there is no worker 3"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "--data-dir /nonexistent/mnist does not exist"),
])
def test_bad_input_one_line_exit_2(argv, match, train_in_process):
    """The command's checks, in this process (the next test runs the command as a shell does)."""
    code, out = train_in_process(argv)
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and lines[0].startswith("hvd-async train: error:"), out
    assert "Traceback" not in out


def test_bad_input_ends_the_command_with_status_2_and_one_line():
    result = run(CLI + ["train", "--lr", "-1"], timeout=60)
    assert result.returncode == 2, result.out
    assert result.out.strip() == "hvd-async train: error: --lr must be > 0, got -1.0", result.out


def test_help_texts():
    for argv in (["--help"], ["train", "--help"]):
        result = run(CLI + argv, timeout=60)
        assert result.returncode == 0 and "usage:" in result.out
    assert "--straggler WORKER=FACTOR" in run(CLI + ["train", "--help"], timeout=60).out
    listing = run(CLI + ["algorithms"], timeout=60).out
    rows = {line.split()[0]: line for line in listing.splitlines() if line.strip()}
    assert set(registry.names()) <= set(rows), listing  # every algorithm has its line
    assert "server" in rows["dc-asgd"] and "server" not in rows["ssgd"], listing


def test_job_reports_bad_data_files_once_and_exits_2(tmp_path):
    result = run(CLI + ["train", "--np", "2", "--dataset", "mnist", "--data-dir", str(tmp_path),
                        "--epochs", "1"], timeout=120)
    assert result.returncode == 2, result.out
    assert result.out.count("hvd_async.job.train: error: MNIST files missing in") == 1, result.out
    assert "Traceback" not in result.out


def test_job_under_plain_mpirun_checks_np():
    result = mpirun(2, python("-m", "hvd_async.job.train", "--np", "3"), timeout=120)
    assert result.returncode == 2
    assert result.out.count("--np 3 does not match the 2 MPI processes") == 1, result.out


def test_reference_job_reaches_accuracy_and_writes_metrics_and_tensorboard(tmp_path):
    """The issue's acceptance run: ssgd, 4 processes, digits, 10 epochs."""
    metrics, logdir = tmp_path / "m.json", tmp_path / "tb"
    result = run(CLI + ["train", "--algo", "ssgd", "--np", "4", "--dataset", "digits", "--epochs", "10",
                        "--metrics-out", str(metrics), "--logdir", str(logdir)], timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    assert "result: ssgd on digits (mlp), 4 worker(s), 10 epochs: test accuracy" in result.out
    record = json.loads(metrics.read_text())
    for key in ("algorithm", "world_size", "workers", "servers", "dataset", "model", "epochs", "steps",
                "final_test_accuracy", "final_train_loss", "wall_seconds", "samples_per_second",
                "staleness_mean", "staleness_max", "history"):
        assert key in record, key
    assert (record["algorithm"], record["world_size"], record["workers"], record["servers"]) == ("ssgd", 4, 4, 0)
    assert record["final_test_accuracy"] >= 0.90, record["final_test_accuracy"]
    assert record["staleness_max"] == 0 and record["samples_per_second"] > 0
    assert [h["epoch"] for h in record["history"]] == list(range(1, 11))
    times = [h["wall_seconds"] for h in record["history"]]
    assert times == sorted(times)
    assert record["history"][-1]["train_loss"] < record["history"][0]["train_loss"]
    # 1437 training samples split over 4 workers, 32 per step: 12 steps per epoch
    assert record["steps"] == 10 * 12

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"accuracy/test", "loss/train", "throughput/samples_per_second", "throughput/worker_3",
            "time/exchange_wait_ms_per_step"} <= tags, tags
    assert [e.step for e in acc.Scalars("accuracy/test")] == list(range(1, 11))


@pytest.mark.parametrize("np", [1, 2])
def test_job_at_other_sizes_and_with_a_straggler(tmp_path, np):
    metrics = tmp_path / "m.json"
    argv = ["train", "--np", str(np), "--epochs", "2", "--metrics-out", str(metrics)]
    if np == 2:  # worker 1's device time 60 ms a step against worker 0's 20 ms
        argv += ["--compute-ms", "20", "--straggler", "1=3", "--model", "cnn", "--fp16-allreduce"]
    else:
        argv += ["--compute-ms", "5"]
    began = time.monotonic()
    result = run(CLI + argv, timeout=300)
    took = time.monotonic() - began
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert record["workers"] == np and len(record["history"]) == 2
    assert record["final_test_accuracy"] >= 0.6, record["history"]
    # where the time went: each worker's samples and CPU seconds, the training and evaluation seconds
    assert sum(record["worker_samples"]) == record["samples"] == record["samples_applied"]
    assert len(record["worker_cpu_seconds"]) == np and 0 < record["cpu_utilisation"] <= 2 * np
    assert len(record["worker_core_wait"]) == np and 0 <= record["core_wait"] < 1
    assert record["core_wait"] == max(record["worker_core_wait"])
    # from the launch (hvd-async train's time, forwarded by mpirun) to worker 0's first step: the ranks'
    # start, Horovod's and the data's, within the command's time less the training's
    assert 0 < record["seconds_to_first_step"] < took - record["train_seconds"], (record, took)
    assert 0 < record["train_seconds"] and 0 < record["eval_seconds"] < record["wall_seconds"]
    if np == 2:  # worker 1 sleeps 40 ms more per step, and ssgd makes worker 0 wait for it: half of that
        # at least (the other half leaves room for a loaded machine, where both workers also wait for cores)
        waits = record["history"][-1]["worker_exchange_wait_ms"]
        assert waits[0] - waits[1] > 20, waits


def test_yaml_config_drives_the_job(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("np: 2\nepochs: 1\nbatch-size: 64\n")
    metrics = tmp_path / "m.json"
    result = run(CLI + ["train", "--config", str(cfg), "--metrics-out", str(metrics)], timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert (record["workers"], record["epochs"], record["batch_size"]) == (2, 1, 64)


def test_init_refuses_a_gloo_launch():
    # horovodrun without --mpi starts every process as its own MPI world of 1, with HOROVOD_SIZE set
    result = run(python("-c", "import hvd_async as ha; ha.init()"), timeout=60, env={"HOROVOD_SIZE": "3"})
    assert result.returncode != 0
    assert "horovodrun started 3: it launched with Gloo" in result.out and "horovodrun --mpi" in result.out


def test_quickstart_example_runs(tmp_path):
    result = mpirun(2, python("examples/quickstart.py"), timeout=180)
    assert result.returncode == 0, result.out[-4000:]
    # ranks print concurrently: their lines may interleave, so match anywhere in the output
    found = dict(re.findall(r"worker (\d) of 2: training accuracy ([0-9]\.[0-9]{3})", result.out))
    assert sorted(found) == ["0", "1"], result.out[-2000:]
    assert min(map(float, found.values())) > 0.9, found


def test_job_trains_on_mnist_files_in_a_data_dir(tmp_path):
    from datafiles import write_mnist

    write_mnist(str(tmp_path / "MNIST" / "raw"), n_train=64, n_test=16)
    metrics = tmp_path / "m.json"
    result = run(CLI + ["train", "--np", "2", "--dataset", "mnist", "--data-dir", str(tmp_path),
                        "--model", "cnn", "--epochs", "1", "--batch-size", "16",
                        "--metrics-out", str(metrics)], timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert record["dataset"] == "mnist" and record["steps"] == 2  # 64 samples / 2 workers / 16


def test_job_with_resnet18_on_synthetic_images(tmp_path):
    metrics = tmp_path / "m.json"
    result = run(CLI + ["train", "--np", "2", "--dataset", "synthetic", "--image-size", "8",
                        "--model", "resnet18", "--epochs", "1", "--batch-size", "128",
                        "--metrics-out", str(metrics)], timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    assert json.loads(metrics.read_text())["model"] == "resnet18"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_device_cuda_without_a_gpu():
    result = run(CLI + ["train", "--np", "2", "--device", "cuda", "--epochs", "1"], timeout=120)
    assert result.returncode == 2, result.out[-3000:]
    errors = [line for line in result.out.splitlines() if "error:" in line]
    assert errors == ["hvd_async.job.train: error: --device cuda: this process sees no CUDA device "
                      "(torch.cuda.is_available() is False); use --device cpu, or check the GPUs and "
                      "CUDA_VISIBLE_DEVICES"], result.out[-3000:]
    # the launcher's first line says what starts; it drops mpirun's banner that repeats that a process
    # exited with status 2
    lines = result.out.strip().splitlines()
    assert lines[0].startswith("hvd-async train: starting ssgd on digits (mlp), 1 epoch(s): 2 worker(s), 2 MPI "
                               "processes"), lines
    assert lines[1:] == errors, result.out[-3000:]

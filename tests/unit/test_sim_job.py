"""The simulated job: the same seed gives the same record byte for byte; simulated time, push counts
and staleness follow from the compute times as predicted."""
import json

import pytest

from hvd_async.sim import simulate
from hvd_async.transport.trace import Trace

TRAIN = 1437  # digits' training split


def run(*argv, tmp_path=None, name="m.json"):
    extra = ["--metrics-out", str(tmp_path / name)] if tmp_path is not None else []
    return simulate(["--dataset", "digits", *argv, *extra])


def test_the_same_seed_gives_the_same_metrics_file_and_another_seed_another(tmp_path):
    argv = ["--algo", "asgd", "--workers", "5", "--epochs", "2", "--delay-dist", "lognormal", "--latency-ms", "0.5"]
    first = run(*argv, tmp_path=tmp_path, name="a.json")
    second = run(*argv, tmp_path=tmp_path, name="b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert first == second
    other = run(*argv, "--seed", "1", tmp_path=tmp_path, name="c.json")
    assert other["final_train_loss"] != first["final_train_loss"]
    assert other["wall_seconds"] != first["wall_seconds"]
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["time_base"] == "simulated"
    sim = record["simulator"]
    assert (sim["delay_dist"], sim["delay_shape"], sim["latency_ms"], sim["seed"]) == ("lognormal", 1.0, 0.5, 0)
    assert sim["events"] > 0 and sim["exchanges"] > 0
    for key in ("algorithm", "workers", "servers", "dataset", "model", "epochs", "batch_size", "lr", "seed",
                "final_test_accuracy", "final_train_loss", "wall_seconds", "samples", "samples_per_second",
                "staleness_mean", "staleness_max", "staleness_hist", "updates", "history"):
        assert key in record, key
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    assert all({"wall_seconds", "test_accuracy", "train_loss"} <= set(h) for h in record["history"])


def test_ssgd_with_constant_delays_takes_the_predicted_simulated_time():
    """Each worker's share of an epoch is ceil(1437 / 2) = 719 samples: 22 batches of 32 and one of 15.
    A step computes 10 ms per nominal batch (scaled by the batch: 15/32 of it for the last), then its
    allreduces complete 2 ms (the latency) after the last worker's contribution. Building the optimizer
    costs one collective (the model check): 2 ms."""
    record = run("--algo", "ssgd", "--workers", "2", "--epochs", "2", "--compute-ms", "10", "--latency-ms", "2")
    epoch = 22 * (0.010 + 0.002) + (0.010 * 15 / 32 + 0.002)
    assert record["steps"] == 2 * 23
    assert record["samples"] == 2 * 2 * 719
    assert [h["wall_seconds"] for h in record["history"]] == pytest.approx([0.002 + epoch, 0.002 + 2 * epoch],
                                                                           abs=1e-4)  # rounded by RunMetrics
    assert record["wall_seconds"] == pytest.approx(0.002 + 2 * epoch)
    assert record["history"][0]["compute_ms_per_step"] == pytest.approx((22 * 10 + 10 * 15 / 32) / 23)
    assert record["history"][0]["exchange_wait_ms"] == pytest.approx(2.0)


def test_a_slow_worker_pushes_proportionally_fewer_times_under_asgd(tmp_path):
    record = run("--algo", "asgd", "--workers", "3", "--epochs", "3", "--straggler", "2=3",
                 "--trace-out", str(tmp_path / "t"))
    trace = Trace(str(tmp_path / "t"))
    pushes = [len(trace.pushes(w)) for w in range(3)]
    assert sum(pushes) >= record["updates"] >= 3 * 45  # updates: as worker 0 last saw them (train's)
    assert abs(pushes[0] - pushes[1]) <= 1
    assert pushes[0] / pushes[2] == pytest.approx(3.0, abs=0.35)
    # in the slow worker's 30 ms the two fast ones push 6 times: its pushes are about 6 stale
    assert 6 <= record["staleness_max"] <= 8
    # the pushes come 7 per 30 ms; at each epoch's end the others wait up to 30 ms for the slow one
    assert sum(pushes) / 7 * 0.030 <= record["wall_seconds"] <= sum(pushes) / 7 * 0.030 + 3 * 0.030


def test_staleness_grows_with_the_number_of_workers():
    means = [run("--algo", "asgd", "--workers", str(n), "--epochs", "2", "--delay-dist", "exponential")
             ["staleness_mean"] for n in (2, 4, 8, 16)]
    assert means == sorted(means) and means[-1] > 4 * means[0], means


def test_slow_workers_option_and_stragglers_combine():
    record = run("--algo", "asgd", "--workers", "4", "--epochs", "1", "--slow-workers", "2", "--slow-factor", "2",
                 "--straggler", "1=3")
    assert record["simulator"]["stragglers"] == {"0": 2.0, "1": 6.0}


@pytest.mark.parametrize("algo", ["asgd", "softsync", "ssgd"])
def test_a_streak_of_nonfinite_gradients_stops_the_simulation_as_it_stops_the_job(capsys, algo):
    """Once every gradient is non-finite no push is applied, so a parameter-server epoch (which ends on
    the servers' progress) would never end: --max-nonfinite stops it, exit 3 with one line."""
    from hvd_async.sim import main
    from hvd_async.job.train import TrainingStopped

    argv = ["--dataset", "digits", "--algo", algo, "--workers", "3", "--epochs", "2", "--lr", "1e30",
            "--max-nonfinite", "4"]
    with pytest.raises(TrainingStopped, match=r"stopped in epoch 1: 4 gradients in a row"):
        simulate(argv)
    capsys.readouterr()
    assert main(argv) == 3
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == ["hvd-async simulate: error: stopped in epoch 1: 4 gradients in a row held NaN or infinity "
                      "on a worker (--max-nonfinite 4); none was applied; lower --lr"], errors


def test_every_worker_trains_in_every_epoch_with_more_workers_than_batches_in_a_pass():
    """8 asgd workers, batches of 256: a pass is 6 batches, fewer than the pushes in flight when the
    servers' count reaches an epoch's mark; that overshoot must not leave the next epoch empty."""
    record = run("--algo", "asgd", "--workers", "8", "--batch-size", "256", "--epochs", "4", "--compute-ms", "10",
                 "--delay-dist", "constant")
    for entry in record["history"]:
        assert all(loss > 0 for loss in entry["worker_train_loss"]), entry["worker_train_loss"]
    assert record["updates"] >= 4 * 8


def test_the_loss_sum_lives_where_the_batches_go(monkeypatch):
    """The loop sums its losses on the device its batches go to: a CPU sum of GPU losses failed every job
    with --device cuda ('Expected all tensors to be on the same device'; tests/test_gpu.py on an H200).
    Here the simulator's loop is built with another device (meta) and stopped once built."""
    import torch

    from hvd_async.sim import job as sim_job
    from hvd_async.job.worker_loop import WorkerLoop

    seen = []

    class Built(Exception):
        pass

    class Probe(WorkerLoop):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **dict(kwargs, device=torch.device("meta")))
            seen.append(self.loss_sum.device.type)
            raise Built()

    monkeypatch.setattr(sim_job, "WorkerLoop", Probe)
    with pytest.raises(Exception):
        run("--algo", "ssgd", "--workers", "1", "--epochs", "1")
    assert seen == ["meta"]

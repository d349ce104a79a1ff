"""TensorBoard output of real training jobs, read back with TensorBoard's own event reader.

Each job runs 2 epochs with 2 workers and 1 server (``--np 3``): every scalar must have one point
per epoch, the per-worker tags one per worker, and the values must agree with the metrics JSON.
"""
import json
import math

import pytest

from procs import python, run

CLI = python("-m", "hvd_async.job.cli")
EPOCHS, WORKERS = 2, 2

GLOBAL = ["accuracy/test", "loss/train", "throughput/samples_per_second", "time/exchange_wait_ms_per_step",
          "time/compute_ms_per_step", "server/pushes_per_second"]
PER_WORKER = ["loss", "throughput", "time/exchange_wait_ms_per_step"]
COMPENSATION = ["compensation/rms_norm", "compensation/gradient_rms_norm", "compensation/relative"]


def _train(tmp_path, algo, *extra):
    logdir, metrics = tmp_path / "tb", tmp_path / "m.json"
    result = run(CLI + ["train", "--algo", algo, "--np", str(WORKERS + 1), "--epochs", str(EPOCHS),
                        "--logdir", str(logdir), "--metrics-out", str(metrics), *extra], timeout=180)
    assert result.returncode == 0, result.out[-4000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    return events, json.loads(metrics.read_text())


def _check_common(events, record):
    scalars = set(events.Tags()["scalars"])
    expected = GLOBAL + [f"{p}/worker_{k}" for p in PER_WORKER for k in range(WORKERS)]
    assert set(expected) <= scalars, sorted(set(expected) - scalars)
    assert not any(tag.endswith(f"worker_{WORKERS}") for tag in scalars), scalars  # servers are no workers
    for tag in expected:
        assert [e.step for e in events.Scalars(tag)] == list(range(1, EPOCHS + 1)), tag
    history = record["history"]
    for tag, key in (("accuracy/test", "test_accuracy"), ("loss/train", "train_loss"),
                     ("time/exchange_wait_ms_per_step", "exchange_wait_ms")):
        assert [e.value for e in events.Scalars(tag)] == pytest.approx([h[key] for h in history], rel=1e-5), tag
    for h in history:  # the global loss and wait are the workers' means
        assert len(h["worker_train_loss"]) == WORKERS
        assert sum(h["worker_train_loss"]) / WORKERS == pytest.approx(h["train_loss"], rel=1e-9)
        assert sum(h["worker_exchange_wait_ms"]) / WORKERS == pytest.approx(h["exchange_wait_ms"], rel=1e-9)
    rates = [e.value for e in events.Scalars("server/pushes_per_second")]
    assert all(r > 0 for r in rates), rates
    # the staleness histograms: one per epoch, together every push the servers applied
    assert events.Tags()["histograms"] == ["staleness"]
    hists = events.Histograms("staleness")
    assert [h.step for h in hists] == list(range(1, EPOCHS + 1))
    assert sum(h.histogram_value.num for h in hists) == sum(record["staleness_hist"]) > 0
    return scalars


def test_dc_asgd_writes_compensation_norms(tmp_path):
    events, record = _train(tmp_path, "dc-asgd")
    scalars = _check_common(events, record)
    assert set(COMPENSATION + ["server/ms_per_push"]) <= scalars
    for tag in COMPENSATION + ["server/ms_per_push"]:
        assert [e.step for e in events.Scalars(tag)] == list(range(1, EPOCHS + 1)), tag
    relative = [e.value for e in events.Scalars("compensation/relative")]
    # lam * g * g * (w - w_bak) is not zero once pushes are stale (staleness > 0 is checked too)
    assert record["staleness_max"] > 0 and all(0 < r < 1 for r in relative), relative
    assert 0 < record["compensation_relative"] < 1
    assert not any(t.startswith("batch_size/") for t in scalars)


def test_lc_asgd_compensation_is_the_loss_scale_alone_without_dc(tmp_path):
    # with --lam 0 the compensated step is r * g, r clipped to [r_min, 1]: |r - 1| <= 1 - r_min.
    # --no-lookahead: r measures the whole delay from the pull (with the look-ahead, a round robin's
    # delay is covered and r can stay 1; tests/unit/test_sim_algorithms.py checks that)
    events, record = _train(tmp_path, "lc-asgd", "--lam", "0", "--r-min", "0.5", "--no-lookahead")
    _check_common(events, record)
    relative = [e.value for e in events.Scalars("compensation/relative")]
    assert all(0 <= r <= 0.5 + 1e-6 for r in relative), relative
    assert relative[-1] > 0  # by epoch 2 every worker's predictor has its history: r departs from 1
    norms = [e.value for e in events.Scalars("compensation/rms_norm")]
    grads = [e.value for e in events.Scalars("compensation/gradient_rms_norm")]
    assert all(n <= 0.5 * g + 1e-6 for n, g in zip(norms, grads)), (norms, grads)


def test_dbs_asgd_writes_batch_sizes_and_no_compensation(tmp_path):
    events, record = _train(tmp_path, "dbs-asgd", "--straggler", "1=3", "--compute-ms", "2")
    scalars = _check_common(events, record)
    for k in range(WORKERS):
        assert [e.step for e in events.Scalars(f"batch_size/worker_{k}")] == list(range(1, EPOCHS + 1))
    last = [events.Scalars(f"batch_size/worker_{k}")[-1].value for k in range(WORKERS)]
    assert last == record["history"][-1]["batch_sizes"]
    assert last[0] > last[1], last  # the slow worker 1 draws the smaller batches
    assert not any(t.startswith("compensation/") for t in scalars)
    assert not math.isnan(record["final_train_loss"])

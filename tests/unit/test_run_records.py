"""What a run's metrics record says about where its time and samples went, checked on simulated runs
(deterministic, one process): samples computed and applied, dropped gradients."""
import pytest

from hvd_async.sim import simulate


def run(*argv):
    return simulate(["--dataset", "digits", "--epochs", "2", *argv])


def test_backup_sgd_counts_the_samples_it_applies_and_reports_the_dropped_beside():
    """Worker 2 is 3x slow: its gradients arrive after the first two stepped the weights and are dropped.
    samples/s counts the applied gradients' samples only (it counted every computed batch)."""
    record = run("--algo", "backup-sgd", "--workers", "3", "--backups", "1", "--straggler", "2=3")
    dropped = record["dropped_gradients"]
    assert dropped > 0 and dropped == record["dropped_pushes"]  # the workers' count is the servers'
    assert sum(h["dropped_samples"] for h in record["history"]) == 32 * dropped  # full batches here
    assert record["samples_applied"] == record["samples"] - 32 * dropped
    assert record["samples_per_second"] == pytest.approx(record["samples_applied"] / record["train_seconds"])
    assert record["computed_samples_per_second"] == pytest.approx(record["samples"] / record["train_seconds"])
    # each update applies workers - backups = 2 gradients; a pass's last batch of each worker is short
    assert 32 * record["updates"] - 2 * 3 * 32 <= record["samples_applied"] <= 32 * record["updates"]


def test_an_algorithm_that_drops_nothing_applies_every_sample():
    record = run("--algo", "asgd", "--workers", "3", "--straggler", "2=3")
    assert record["dropped_gradients"] == 0 and record["samples_applied"] == record["samples"]
    assert record["samples_per_second"] == record["computed_samples_per_second"]
    assert all(h["dropped_samples"] == 0 for h in record["history"])


def test_k_evaluations_per_epoch_are_recorded_on_the_training_clock():
    """--evals-per-epoch 4: four evaluations an epoch, at a quarter, half, three quarters and the end,
    each with the training clock; ssgd trains exactly as with one (the pauses change no step)."""
    once = run("--algo", "ssgd", "--workers", "3")
    record = run("--algo", "ssgd", "--workers", "3", "--evals-per-epoch", "4")
    points = [(e["epoch"], e["at"]) for e in record["evaluations"]]
    assert points == [(epoch, at) for epoch in (1, 2) for at in (0.25, 0.5, 0.75, 1.0)]
    clock = [e["train_seconds"] for e in record["evaluations"]]
    assert clock == sorted(clock) and clock[-1] == record["train_seconds"]
    assert [h["train_seconds"] for h in record["history"]] == [clock[3], clock[7]]
    assert [e["test_accuracy"] for e in record["evaluations"][3::4]] == [h["test_accuracy"] for h in record["history"]]
    assert record["train_seconds"] == once["train_seconds"] and record["final_train_loss"] == once["final_train_loss"]
    assert len(once["evaluations"]) == 2 and record["evals_per_epoch"] == 4


@pytest.mark.parametrize("algo", ["asgd", "dbs-asgd", "backup-sgd", "softsync", "gossip", "easgd"])
def test_asynchronous_workers_all_reach_every_evaluation_point(algo):
    """Each worker leaves its loop at a point when it sees the job pass it (the servers' pushes, the
    shared cursor, its own share's steps); a straggler's view lags, and still every worker gets there:
    no worker waits forever in the agreement, and every epoch has its four evaluations."""
    record = run("--algo", algo, "--workers", "3", "--straggler", "2=3", "--evals-per-epoch", "4")
    assert [(e["epoch"], e["at"]) for e in record["evaluations"]] == [
        (epoch, at) for epoch in (1, 2) for at in (0.25, 0.5, 0.75, 1.0)]


def test_a_slow_evaluation_stays_off_the_training_clock(monkeypatch):
    """An evaluation made to take 1 s (of simulated time) on every worker: the training seconds and
    the times to target do not move; the evaluation seconds and the wall time do."""
    from hvd_async import metrics

    fast = run("--algo", "asgd", "--workers", "3", "--evals-per-epoch", "4")
    evaluate = metrics.evaluate_accuracy

    def slow(model, dataset, rank, size, comm, device=None):
        comm.net.sched.advance(rank, 1.0)
        return evaluate(model, dataset, rank, size, comm, device)

    monkeypatch.setattr(metrics, "evaluate_accuracy", slow)
    record = run("--algo", "asgd", "--workers", "3", "--evals-per-epoch", "4")
    assert record["train_seconds"] == fast["train_seconds"] < 1.0
    assert [e["train_seconds"] for e in record["evaluations"]] == [e["train_seconds"] for e in fast["evaluations"]]
    assert record["eval_seconds"] == pytest.approx(8.0) and fast["eval_seconds"] == 0.0
    assert record["wall_seconds"] >= record["train_seconds"] + 8.0
    target = fast["final_test_accuracy"] - 0.05
    reached = [metrics.time_to_target(metrics.accuracy_curve(r), target) for r in (record, fast)]
    assert reached[0] == reached[1] < record["train_seconds"]


def test_time_to_target_is_the_training_clock_at_the_first_evaluation_reaching_it():
    from hvd_async.metrics import accuracy_curve, time_to_target

    record = {"evaluations": [{"train_seconds": 1.0, "test_accuracy": 0.5}, {"train_seconds": 2.0, "test_accuracy": 0.9},
                              {"train_seconds": 3.0, "test_accuracy": 0.8}],
              "history": [{"wall_seconds": 9.0, "test_accuracy": 0.9}]}
    assert [time_to_target(accuracy_curve(record), t) for t in (0.4, 0.8, 0.9, 0.95)] == [1.0, 2.0, 2.0, None]
    del record["evaluations"]  # a record from before the evaluations list: the epoch ends' wall seconds
    assert time_to_target(accuracy_curve(record), 0.8) == 9.0


def test_the_record_says_where_the_samples_went_worker_by_worker():
    """Per worker: the samples computed and applied; backup-sgd's straggler computes a third as many
    as the others and has most of them dropped."""
    record = run("--algo", "backup-sgd", "--workers", "3", "--backups", "1", "--straggler", "2=3")
    computed, applied = record["worker_samples"], record["worker_samples_applied"]
    assert sum(computed) == record["samples"] and sum(applied) == record["samples_applied"]
    assert computed[2] < computed[0] / 2 and applied[2] < computed[2] / 2 and applied[0] > computed[0] / 2
    for key in ("train_seconds", "eval_seconds", "dropped_gradients", "server_ms_per_push"):
        assert key in record, key  # (server time and CPU time are not simulated: see the real runs' test)


class _OneRank:
    """The workers' communicator of a job of one worker (what Host.finish gathers over)."""

    rank, size = 0, 1

    def gather(self, value, root=0):
        return [value]


def test_the_cpu_utilisation_is_the_workers_cpu_seconds_over_the_wall_time():
    """os.times of the worker process, from the metrics' start: 0.3 CPU seconds of pure-Python work,
    then 0.3 s asleep, show as 0.3 CPU seconds over at least 0.6 s of wall time."""
    import os
    import time
    import types

    from hvd_async.metrics import RunMetrics
    from hvd_async.job.worker_loop import Host

    def cpu():
        times = os.times()
        return times.user + times.system

    metrics = RunMetrics({}, reporter=True)
    start = cpu()
    while cpu() - start < 0.3:
        pass
    time.sleep(0.3)
    acc = types.SimpleNamespace(core_wait=0.0, train_seconds=1.0)
    out = Host(max_op=None).finish(types.SimpleNamespace(metrics=metrics, comm=_OneRank(), reporter=True, acc=acc))
    used, wall = out["worker_cpu_seconds"][0], out["wall_seconds"]
    # one thread: the loop's 0.3 CPU seconds took about as much wall, then 0.3 s asleep (os.times counts
    # in clock ticks, 10 ms here, so the loop may stop a tick or two early)
    assert 0.3 <= used < 0.4 and wall >= 0.55
    assert out["cpu_utilisation"] == pytest.approx(used / wall, rel=0.05)


def test_the_core_wait_is_each_workers_run_queue_seconds_over_its_training_seconds():
    """Host.finish reports the share of each worker's training time that its device time and
    compute waited for a core, and the run's largest."""
    import types

    from hvd_async.metrics import RunMetrics
    from hvd_async.job.worker_loop import Host

    acc = types.SimpleNamespace(core_wait=0.3, train_seconds=12.0)
    loop = types.SimpleNamespace(metrics=RunMetrics({}, reporter=True), comm=_OneRank(), reporter=True, acc=acc)
    out = Host(max_op=None).finish(loop)
    assert out["worker_core_wait"] == [0.025] and out["core_wait"] == 0.025


def test_the_run_queue_counts_the_time_a_thread_waited_for_a_core():
    """With more busy processes than cores, a thread that computes for 0.4 s of its own CPU time is
    kept waiting for a core: RunQueue's seconds grow by a good part of that."""
    import os
    import subprocess
    import sys
    import time

    from hvd_async.metrics import RunQueue

    queue = RunQueue()
    if not queue.known:
        pytest.skip("this kernel keeps no run-queue statistics (/proc/thread-self/schedstat)")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) + 1)]
    try:
        time.sleep(0.3)  # let them start spinning
        before, cpu = queue.seconds(), time.thread_time()
        while time.thread_time() - cpu < 0.4:
            pass
        waited = queue.seconds() - before
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert waited > 0.05, waited

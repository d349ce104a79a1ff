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

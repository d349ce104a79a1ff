"""Progress inside an epoch on worker 0 (``--progress``): which display, the plain lines' content and
pace, and the bar's total (the worker's share of an epoch) under synchronous and parameter-server
algorithms, a fast worker 0 included."""
import functools
import io

import pytest

from hvd_async.progress import EpochProgress, progress_mode
from hvd_async.sim import job as sim_job
from hvd_async.sim import simulate
from hvd_async.job.worker_loop import WorkerLoop


def test_which_display():
    assert progress_mode("auto", True, tty=True) == "bar"
    assert progress_mode("auto", True, tty=False) == "lines"  # a Slurm log, a pipe
    assert progress_mode("bar", True, tty=False) == "bar"
    assert progress_mode("epochs", True, tty=True) is None  # off
    assert progress_mode("auto", False, tty=True) is None  # only worker 0 shows progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_every_few_seconds_with_samples_rate_and_loss():
    out, clock, losses_read = io.StringIO(), Clock(), []

    def loss():
        losses_read.append(1)
        return 0.5

    shown = EpochProgress("lines", share=50, epochs=3, desc="asgd x4", stream=out, every=5.0, clock=clock)
    shown.start(2, samples=320)  # resumed: 320 samples of epoch 2 trained before
    for step in range(1, 21):  # 20 steps of 32 samples, 0.5 s each
        clock.now += 0.5
        shown.update(2, step / 40, samples=320 + 32 * step, loss=loss)
    lines = out.getvalue().splitlines()
    assert lines == ["asgd x4 epoch 2/3: 25% of the epoch; worker 0: 640 samples, 64 samples/s, loss 0.5000",
                     "asgd x4 epoch 2/3: 50% of the epoch; worker 0: 960 samples, 64 samples/s, loss 0.5000"]
    assert len(losses_read) == 2  # the loss is read (a device sync on a GPU) only for a line


@pytest.mark.parametrize("algo,extra", [("ssgd", []), ("asgd", ["--straggler", "3=4"]),
                                        ("dbs-asgd", ["--straggler", "3=4"])])
def test_the_bar_total_is_the_workers_share_and_never_overruns(monkeypatch, algo, extra):
    """asgd with a slow worker 3: worker 0 draws more than a quarter of each epoch (the old bar counted
    its own steps against a total of its share: 0/12, then past the end); the bar follows the
    servers' pushes (dbs-asgd: the shared cursor) and ends at its total, epoch by epoch."""
    asked, ends = [], []
    move_to = EpochProgress._move_to

    def spy_move(self, n):
        asked.append((n, self.bar.total))
        move_to(self, n)

    close = EpochProgress.close

    def spy_close(self):
        ends.append((self.bar.n, self.bar.total, self.share))
        close(self)

    monkeypatch.setattr(EpochProgress, "_move_to", spy_move)
    monkeypatch.setattr(EpochProgress, "close", spy_close)
    monkeypatch.setattr(sim_job, "WorkerLoop", functools.partial(WorkerLoop, progress="bar"))
    record = simulate(["--dataset", "digits", "--algo", algo, "--workers", "4", "--epochs", "2", *extra])
    (n, total, share), = ends
    # digits: 1437 training images, 45 batches of 32; ssgd's share is 12 steps of its DistributedSampler
    # share (360 images), a parameter-server worker's ceil(45 / 4) = 12
    assert share == 12 and total == 2 * share and n == total
    assert max(asked)[0] <= total  # never past the end
    positions = [position for position, _ in asked]
    # at an epoch's end only from its last step on (that step, the epoch's end, the next one's start):
    # a bar that counted worker 0's own steps would sit there while it trained past its share
    assert positions.count(share) <= 3 and positions.count(2 * share) <= 2, positions
    if algo == "ssgd":
        assert record["steps"] == 2 * share
    else:  # the fast worker 0 trained more than its share: its own steps would have overrun the bar
        assert record["steps"] > 2 * share, record["steps"]

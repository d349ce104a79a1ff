"""Run metrics: the per-epoch history, TensorBoard scalars (one writer, on the reporting worker), the JSON file."""
import json
import os
import time
from typing import Dict, List, Optional


class RunMetrics:
    """Collects what the training job reports; only the reporting worker writes anything."""

    def __init__(self, info: Dict, *, logdir: Optional[str] = None, reporter: bool = True):
        self.info = dict(info)
        self.history: List[Dict] = []
        self.reporter = reporter
        self.start = time.perf_counter()
        self.writer = None
        if reporter and logdir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=logdir)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def epoch(self, epoch: int, *, test_accuracy: float, train_loss: float,
              worker_samples_per_second: List[float], exchange_wait_ms: float,
              timing: Optional[Dict[str, float]] = None) -> Dict:
        """Record one epoch; ``timing`` (milliseconds per step, averaged over workers) goes to the
        history and to TensorBoard under ``time/``."""
        entry = {"epoch": epoch, "wall_seconds": round(self.elapsed(), 4),
                 "test_accuracy": test_accuracy, "train_loss": train_loss, "exchange_wait_ms": exchange_wait_ms}
        entry.update(timing or {})
        for name, value in (timing or {}).items():
            self.scalar(f"time/{name}", value, epoch)
        self.history.append(entry)
        self.scalar("accuracy/test", test_accuracy, epoch)
        self.scalar("loss/train", train_loss, epoch)
        self.scalar("throughput/samples_per_second", sum(worker_samples_per_second), epoch)
        for worker, rate in enumerate(worker_samples_per_second):
            self.scalar(f"throughput/worker_{worker}", rate, epoch)
        self.scalar("time/exchange_wait_ms_per_step", exchange_wait_ms, epoch)
        return entry

    def staleness_histogram(self, counts, before, epoch: int) -> None:
        """TensorBoard histogram ``staleness`` of the pushes applied during this epoch."""
        if self.writer is None:
            return
        import numpy as np

        now = np.zeros(max(len(counts), len(before)), dtype=np.int64)
        now[:len(counts)] += counts
        now[:len(before)] -= before
        taus = np.arange(len(now), dtype=np.float64)
        self.writer.add_histogram_raw(
            "staleness", min=0.0, max=float(taus[now > 0].max()), num=int(now.sum()),
            sum=float((taus * now).sum()), sum_squares=float((taus * taus * now).sum()),
            bucket_limits=(taus + 0.5).tolist(), bucket_counts=now.tolist(), global_step=epoch)

    def finish(self, path: Optional[str], **final) -> Dict:
        record = dict(self.info)
        record.update(final)
        record["history"] = self.history
        if self.writer is not None:
            self.writer.close()
        if self.reporter and path:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(record, f, indent=2)
                f.write("\n")
            os.replace(tmp, path)
        return record

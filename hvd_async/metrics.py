"""Run metrics: the per-epoch history, TensorBoard scalars (one writer, on the reporting worker), the JSON file.

TensorBoard tags, one point per epoch (docs/guide.md shows them):

- global: ``accuracy/test`` (``accuracy/val`` with ``--eval-on val``), ``loss/train``, ``throughput/samples_per_second``,
  ``time/exchange_wait_ms_per_step`` (mean over workers), ``time/compute_ms_per_step``, and for
  od-sgd/hpsgd/gossip/easgd ``time/exchange_blocked_ms_per_step``;
- per worker (k = 0 .. workers-1): ``loss/worker_k``, ``throughput/worker_k``,
  ``time/exchange_wait_ms_per_step/worker_k``, ``batch_size/worker_k`` (dbs-asgd);
- parameter servers: ``server/pushes_per_second`` (the apply rate), ``server/ms_per_push``
  (dc-asgd, lc-asgd, softsync), ``compensation/rms_norm``, ``compensation/gradient_rms_norm``,
  ``compensation/relative`` (dc-asgd, lc-asgd); the ``staleness`` histogram.
"""
import json
import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# history key -> TensorBoard tag of the server-side scalars
SERVER_TAGS = {"server_pushes_per_second": "server/pushes_per_second",
               "server_ms_per_push": "server/ms_per_push",
               "compensation_rms_norm": "compensation/rms_norm",
               "gradient_rms_norm": "compensation/gradient_rms_norm",
               "compensation_relative": "compensation/relative"}


class RunQueue:
    """How long the thread that made it has been runnable with no core free: the second field of
    Linux's ``/proc/thread-self/schedstat``, read through one open descriptor (a few microseconds a
    read, so a step can afford two). Reads 0 where the kernel does not keep it (:attr:`known`)."""

    def __init__(self):
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    @property
    def known(self) -> bool:
        return self._fd is not None

    def seconds(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9


def compensation_norms(compensation_sq: float, grad_sq: float, pushes: float) -> Dict[str, float]:
    """Root-mean-square norms over ``pushes`` pushes of the compensation a server added to each
    gradient (``||compensated step - g||``) and of the gradients, and their ratio."""
    out = {}
    if pushes > 0:
        out["compensation_rms_norm"] = math.sqrt(max(0.0, compensation_sq) / pushes)
        out["gradient_rms_norm"] = math.sqrt(max(0.0, grad_sq) / pushes)
    if grad_sq > 0:
        out["compensation_relative"] = math.sqrt(max(0.0, compensation_sq) / grad_sq)
    return out


def evaluate_accuracy(model, dataset, rank: int, size: int, comm, device=None) -> float:
    """Accuracy over the whole test split, each worker taking every size-th sample; collective over
    ``comm`` (an mpi4py communicator, or the simulator's)."""
    import torch
    from torch.utils.data import DataLoader, Subset

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in DataLoader(Subset(dataset, range(rank, len(dataset), size)), batch_size=512):
            if device is not None:
                x, y = x.to(device), y.to(device)
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    correct, total = comm.allreduce(np.array([correct, total], dtype=np.int64))
    return int(correct) / max(1, int(total))


def pooled_staleness(stats, comm) -> np.ndarray:
    """All workers' staleness histograms summed (count of pushes by staleness 0, 1, ...; ``stats``: an
    :class:`~hvd_async.algorithms.base.ExchangeStats`)."""
    mine = np.asarray(stats.staleness_hist or [0], dtype=np.int64)
    counts = comm.allreduce(mine)
    nonzero = np.nonzero(counts)[0]
    return counts[:nonzero[-1] + 1] if len(nonzero) else np.zeros(0, dtype=np.int64)


def accuracy_curve(record: Dict) -> List[Tuple[float, float]]:
    """(seconds, held-out accuracy) at each of the run's evaluations: the training clock at every
    ``--evals-per-epoch`` point (``record["evaluations"]``); a record older than that list gives the
    wall seconds at each epoch's end."""
    if "evaluations" in record:
        return [(e["train_seconds"], e["test_accuracy"]) for e in record["evaluations"]]
    return [(h["wall_seconds"], h["test_accuracy"]) for h in record["history"]]


def time_to_target(curve: Sequence[Tuple[float, float]], target: float) -> Optional[float]:
    """The seconds of ``curve`` (:func:`accuracy_curve`) at the first evaluation at or above ``target``
    (None: never reached)."""
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


def print_result(spec, record: Dict, *, simulated: bool = False) -> None:
    """The job's last lines on stdout (``spec``: the :class:`~hvd_async.job.jobspec.JobSpec`): the result,
    and where the metrics file went."""
    job = spec.job
    if simulated:
        who, took, rate = "simulated worker(s)", f"{record['wall_seconds']:.2f} simulated s", "samples per simulated s"
    else:
        who, took, rate = "worker(s)", f"{record['wall_seconds']:.1f} s", "samples/s"
    print(f"result: {spec.algo} on {job.dataset} ({job.model}), {record['workers']} {who}, {job.epochs} "
          f"epochs: {job.eval_on} accuracy {record['final_test_accuracy']:.4f}, train loss {record['final_train_loss']:.4f}, "
          f"{took}, {record['samples_per_second']:.0f} {rate}", flush=True)
    if job.metrics_out:
        print(f"metrics written to {job.metrics_out}", flush=True)


class RunMetrics:
    """Collects what the training job reports; only the reporting worker writes anything."""

    def __init__(self, info: Dict, *, logdir: Optional[str] = None, reporter: bool = True):
        self.info = dict(info)
        self.history: List[Dict] = []
        self.evaluations: List[Dict] = []  # every held-out evaluation, on the training clock
        self.reporter = reporter
        self.start = time.perf_counter()
        self._began = (self.start, self._cpu())  # (start moves back on a resume; this does not)
        self.writer = None
        self._totals: Dict[str, float] = {}  # last value of each running counter seen by delta()
        if reporter and logdir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=logdir)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @staticmethod
    def _cpu() -> float:
        times = os.times()
        return times.user + times.system

    def cpu_use(self) -> Tuple[float, float]:
        """This process's CPU seconds (user and system) and wall seconds since its metrics began (a
        resumed run: since the resume)."""
        wall, cpu = self._began
        return self._cpu() - cpu, time.perf_counter() - wall

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def per_worker(self, prefix: str, values: Sequence[float], step: int) -> None:
        """One scalar per worker: ``{prefix}/worker_{k}``."""
        for worker, value in enumerate(values):
            self.scalar(f"{prefix}/worker_{worker}", value, step)

    def delta(self, name: str, total: float) -> float:
        """How much the running counter ``name`` grew since the last call (since 0 on the first)."""
        grown = total - self._totals.get(name, 0)
        self._totals[name] = total
        return grown

    def epoch(self, epoch: int, *, test_accuracy: float, train_loss: float,
              worker_samples_per_second: List[float], exchange_wait_ms: float,
              timing: Optional[Dict[str, float]] = None, worker_losses: Sequence[float] = (),
              worker_exchange_wait_ms: Sequence[float] = ()) -> Dict:
        """Record one epoch; ``timing`` (milliseconds per step, averaged over workers) goes to the
        history and to TensorBoard under ``time/``; ``exchange_wait_ms`` is the time per step spent
        in ``step()`` (averaged over workers), ``worker_*`` the per-worker values."""
        entry: Dict[str, Any] = {"epoch": epoch, "wall_seconds": round(self.elapsed(), 4),
                 "test_accuracy": test_accuracy, "train_loss": train_loss, "exchange_wait_ms": exchange_wait_ms}
        entry.update(timing or {})
        if worker_losses:
            entry["worker_train_loss"] = list(worker_losses)
        if worker_exchange_wait_ms:
            entry["worker_exchange_wait_ms"] = list(worker_exchange_wait_ms)
        for name, value in (timing or {}).items():
            self.scalar(f"time/{name}", value, epoch)
        self.history.append(entry)
        self.scalar(f"accuracy/{self.info.get('evaluated_on', 'test')}", test_accuracy, epoch)
        self.scalar("loss/train", train_loss, epoch)
        self.per_worker("loss", worker_losses, epoch)
        self.scalar("throughput/samples_per_second", sum(worker_samples_per_second), epoch)
        self.per_worker("throughput", worker_samples_per_second, epoch)
        self.scalar("time/exchange_wait_ms_per_step", exchange_wait_ms, epoch)
        self.per_worker("time/exchange_wait_ms_per_step", worker_exchange_wait_ms, epoch)
        return entry

    def evaluation(self, epoch: int, at: float, accuracy: float, *, train_seconds: float, seconds: float) -> None:
        """Record one held-out evaluation: at fraction ``at`` of ``epoch`` (1.0: its end), after
        ``train_seconds`` of training (the training clock: evaluations are not on it), taking ``seconds``."""
        self.evaluations.append({"epoch": epoch, "at": round(at, 6), "train_seconds": round(train_seconds, 6),
                                 "test_accuracy": accuracy, "eval_seconds": round(seconds, 6)})

    def server(self, epoch: int, *, pushes: int, seconds: float, server_ms_per_push: Optional[float] = None,
               compensation=None) -> Dict[str, float]:
        """The parameter servers' scalars for one epoch (:data:`SERVER_TAGS`): pushes applied per
        second of this epoch's training (``pushes``: the running count, ``opt.progress()``), the
        server's time per push (None: not measured), and over this epoch's pushes the compensation
        norms (``compensation``: the strategy's running
        :class:`~hvd_async.algorithms.base.CompensationSums`, None where it compensates nothing).
        Returns them, for the history."""
        out = {"server_pushes_per_second": self.delta("pushes", pushes) / max(seconds, 1e-9)}
        if server_ms_per_push is not None:
            out["server_ms_per_push"] = server_ms_per_push
        if compensation is not None:
            out.update(compensation_norms(self.delta("compensation_sq", compensation.compensation_sq),
                                          self.delta("grad_sq", compensation.grad_sq),
                                          self.delta("server_pushes", compensation.pushes)))
        for name, value in out.items():
            self.scalar(SERVER_TAGS[name], value, epoch)
        return out

    @staticmethod
    def compensation(sums) -> Dict[str, float]:
        """The compensation norms over the whole run, from the strategy's
        :class:`~hvd_async.algorithms.base.CompensationSums` (empty where it is None)."""
        if sums is None:
            return {}
        return compensation_norms(sums.compensation_sq, sums.grad_sq, sums.pushes)

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
        record["evaluations"] = self.evaluations
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

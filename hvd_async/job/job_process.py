"""The training job's process on each rank (``python -m hvd_async.job.train``): parse and validate the
options against the MPI world, check the device, start MPI and Horovod, share the node's cores; then
serve (server ranks, printing each shard's report) or train (workers), and turn every way a run ends
into its exit status, ending the whole job (MPI_Abort) where a rank cannot finish with the others.
Also the stall watchdog of ``--worker-timeout``."""
import os
import sys
import time
import traceback
from typing import Optional

from .. import failures
from .config import ConfigError


class TrainingStopped(RuntimeError):
    """Raised alike on every worker when the job must stop (e.g. a streak of non-finite gradients):
    exit status 3."""


def say(msg: str) -> None:
    """One line to stderr in one write: mpirun interleaves ranks' writes, and print() writes the text
    and the newline apart (unbuffered), so two ranks' lines could come out joined."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def device_kind(name: str) -> str:
    """``cpu`` or ``cuda`` for ``--device`` (``auto``: ``cuda`` where this process sees a GPU);
    a ConfigError for ``cuda`` without one."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this process sees no CUDA device (torch.cuda.is_available() is "
                          "False); use --device cpu, or check the GPUs and CUDA_VISIBLE_DEVICES")
    return name


def device(name: str, ha):
    """``--device``: the CPU, or this worker's GPU (local rank modulo the GPUs visible); ``auto``:
    the GPU where this process sees one."""
    import torch

    if device_kind(name) == "cpu":
        return torch.device("cpu")
    index = ha.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class Watchdog:
    """``--worker-timeout``: ends the job (exit status 5) when this worker's loop has not moved for
    ``2 x timeout + 5`` seconds, i.e. it sits in a collective that another worker never joins (the
    rendezvous before each epoch end names such a worker first; this catches the collectives after
    it). The workers still running then find out, through their own communicator, which did not."""

    def __init__(self, timeout: float, comm, live):
        import threading

        self.timeout, self.limit = timeout, 2.0 * timeout + 5.0
        self.comm, self.live = comm.Dup(), live
        self.last = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hvd-async-watchdog", daemon=True)
        self.thread.start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stop(self, free: bool = True) -> None:
        """Stop watching. ``free``: also free the watchdog's communicator (collective over the workers
        it was made from: pass False when some of them were dropped and will never join)."""
        self.stopped.set()
        self.thread.join(timeout=1.0)  # at once, unless it is ending the job (then it never returns)
        if free and not self.thread.is_alive():
            self.comm.Free()

    def _run(self) -> None:
        from mpi4py import MPI

        from .jobstate import rendezvous

        while not self.stopped.wait(0.5):
            waited = time.monotonic() - self.last
            if waited > self.limit:
                missing = rendezvous(self.comm, self.timeout)
                here = [r for r in range(self.comm.size) if r not in missing]
                if self.comm.rank == min(here):
                    gone = ", ".join(str(self.live[r]) for r in missing) or "none (?)"
                    say(f"hvd_async.job.train: error: worker(s) {gone} made no progress for {waited:.0f} s "
                        f"(--worker-timeout {self.timeout:g}); the others wait for them in a collective "
                        f"that cannot go on without them; stopping the job, exit status 5")
                failures.abort(MPI.COMM_WORLD, 5, wait=0.5 if self.comm.rank == min(here) else 3.0)


def main(argv, train_worker) -> int:
    """Run this rank's part of the job (``train_worker(spec)``: a worker's training of the described
    job, returning its metrics record); returns its exit status (or ends the job)."""
    from . import config

    try:
        args = config.parse(argv, launcher=False)
    except ConfigError as exc:
        say(f"hvd_async.job.train: error: {exc}")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        spec = config.validate(args, world_size=world.size)
    except ConfigError as exc:
        if world.rank == 0:
            say(f"hvd_async.job.train: error: {exc}")
        return 2
    try:  # before anything is printed; on the workers (world ranks from --servers), which use the device
        if world.rank >= spec.layout.servers:
            device_kind(spec.job.device)
    except ConfigError as exc:
        if world.rank == spec.layout.servers:
            say(f"hvd_async.job.train: error: {exc}")
        return 2

    import hvd_async as ha
    from ..checkpoint import CheckpointError
    from ..data import DataError
    from .jobstate import WorkerStalled
    from ..models import ModelError

    job = spec.job
    if job.deterministic:  # before Horovod starts: a fused buffer's size (and so the reduction
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"  # algorithm MPI picks) depends on timing
    if job.worker_timeout:  # Horovod names a rank missing from a collective, then gives up
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(job.worker_timeout))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(2, int(2 * job.worker_timeout))))
    ha.init(servers=spec.layout.servers)
    import torch

    # every rank's share of its node's cores (collective; the servers' rules do tensor math too)
    mine = ha.runtime.threads_per_rank()
    if ha.is_server() and job.server_threads is not None:  # --server-threads
        mine = job.server_threads
    threads = world.allgather(mine)
    torch.set_num_threads(threads[world.rank])
    if world.rank == ha.num_servers():  # worker 0
        order = ", servers first" if ha.num_servers() else ""
        say(f"torch threads per rank (world ranks 0..{world.size - 1}{order}): {' '.join(map(str, threads))}")
    if ha.is_server():
        report = ha.serve(worker_timeout=job.worker_timeout, threads=threads[world.rank])
        for shard in report.shards if any(s.pushes for s in report.shards) else ():  # (none: the job failed)
            hist = ", ".join(f"{tau}: {n}" for tau, n in enumerate(shard.staleness_hist) if n)
            say(f"server {shard.shard}: {shard.algorithm} shard of {shard.numel} parameters: {shard.updates} "
                f"updates from {shard.pushes} pushes, staleness mean {shard.staleness_mean:.2f} "
                f"(counts {{{hist}}}), {shard.skipped_nonfinite} non-finite pushes skipped, "
                + (f"{1000.0 * shard.busy_seconds / max(1, shard.pushes):.3f} ms server time per push"
                   if shard.busy_seconds else "pushes applied by MPI itself (no server time)")
                + (f", its push compiled in {shard.compile_seconds:.1f} s" if shard.compile_seconds else ""))
        if report.dropped:
            say(f"server {world.rank}: finished without worker(s) {', '.join(map(str, sorted(report.dropped)))}, "
                f"which made no progress for {job.worker_timeout:g} s (--worker-timeout)")
            failures.abort(world, 4, wait=1.0 if world.rank == 0 else 30.0)  # they never join MPI_Finalize
        return 0
    from ..metrics import print_result

    record: Optional[dict] = None
    errors = ha.worker_comm().Dup()  # where the workers find out whether an error hit all of them
    try:
        record = train_worker(spec)
        if ha.rank() == 0:
            print_result(spec, record)
    except (DataError, ModelError, ConfigError, CheckpointError) as exc:  # alike on every worker, or not
        alike = _every_worker_failed(errors, ALIKE_SECONDS)
        if ha.rank() == 0 or not alike:
            say(f"hvd_async.job.train: error: {'' if alike else f'worker {ha.rank()}: '}{exc}")
        if not alike:  # the others train on and would wait for this one in their next collective
            failures.abort(world, 2, wait=0.5)
        return 2
    except TrainingStopped as exc:  # raised alike on every worker; a restart would not help
        if ha.rank() == 0:
            say(f"hvd_async.job.train: error: {exc}")
        return 3
    except WorkerStalled as exc:  # raised on every worker still running; the stalled one never returns
        if exc.printer:
            say(f"hvd_async.job.train: error: {exc}")
        failures.abort(world, 5, wait=0.5 if exc.printer else 5.0)
    except Exception as exc:  # one rank failed alone: take the job down rather than hang the others
        if job.worker_timeout and "stall" in str(exc).lower():  # Horovod's stall check gave up
            say(f"hvd_async.job.train: error: worker {ha.rank()}: a collective waited more than "
                f"{job.worker_timeout:g} s for other workers (--worker-timeout; Horovod's stall report above "
                f"names the missing ranks): {str(exc).splitlines()[0]}")
            failures.abort(world, 5, wait=0.5)
        line = ha.runtime.departure_message(exc)  # another worker's leaving, not this one's error
        if line is not None and not os.environ.get("HVD_ASYNC_DEBUG"):
            say(line)
            failures.abort(world, 1, wait=1.0)
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
    finally:
        if not (record and record["dropped_workers"]):
            ha.shutdown()
            errors.Free()
    assert record is not None  # each branch that leaves it None returned or ended the job
    if record["dropped_workers"]:  # results are out; the dropped workers never finish
        if ha.rank() == 0:
            say(f"finished without worker(s) {', '.join(map(str, record['dropped_workers']))} "
                f"(--worker-timeout); exit status 4")
        ha.shutdown()
        failures.abort(world, 4, wait=30.0)  # the servers end the job once they have reported
    return 0


# How long a worker that met a bad-input error waits for the others to meet it too (the same error
# on every worker: a clean exit, status 2) before it ends the job alone (one worker's bad file).
ALIKE_SECONDS = 3.0


def _every_worker_failed(comm, seconds: float) -> bool:
    """Whether every worker of ``comm`` reaches this point within ``seconds`` (a non-blocking barrier,
    left pending otherwise: the job then ends)."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if request.Test():
            return True
        time.sleep(0.01)
    return False


def exit_process(code: int) -> None:
    """End this rank's process with ``code``. After a run that went to its end (status 0: results
    written, files closed, the servers told) Horovod is stopped and MPI finalized here, and the process
    ends without the interpreter's teardown, which frees torch's modules one by one: on a small
    machine, more of every rank's CPU than a short job trains. Any other status: the normal
    exit (its atexit handlers flush and close whatever the failure left open)."""
    if code != 0:
        sys.exit(code)
    import logging

    import horovod.torch as hvd
    from mpi4py import MPI

    import hvd_async as ha

    ha.shutdown()
    hvd.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(0)

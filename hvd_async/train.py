"""The reference training job: ``python -m hvd_async.train`` on every MPI rank.

Runs as-is under ``mpirun``, ``horovodrun`` or ``hvd-async train`` (which launches it). Server
ranks serve; workers train on their shard of the data, evaluate the model on the held-out split
after each epoch, and the first worker prints the result, writes TensorBoard scalars (``--logdir``)
and the metrics JSON (``--metrics-out``).
"""
import os
import sys
import time
import traceback

import numpy as np

from .config import ConfigError



def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _threads_per_rank(world_size: int) -> int:
    """Share the node's cores among its ranks (oversubscribed runs thrash otherwise)."""
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", world_size))
    return max(1, (os.cpu_count() or 1) // max(1, local))


class _Pacer:
    """Injected compute: ``--compute-ms`` on every worker, stretched by this worker's straggler factor."""

    def __init__(self, compute_ms: float, factor: float):
        self.compute_s, self.factor = compute_ms / 1000.0, factor
        self.last_work = 0.0

    def before_step(self, scale: float = 1.0) -> None:
        # ``scale``: this batch's size over the nominal one (dbs-asgd's batches vary). The straggler
        # sleeps (factor-1) x its real forward/backward time of the last step on top.
        delay = self.compute_s * self.factor * scale + (self.factor - 1.0) * self.last_work
        if delay > 0:
            time.sleep(delay)


def _evaluate(model, dataset, rank: int, size: int, comm) -> float:
    """Accuracy over the whole test split, each worker taking every size-th sample."""
    import torch
    from torch.utils.data import DataLoader, Subset

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in DataLoader(Subset(dataset, range(rank, len(dataset), size)), batch_size=512):
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    correct, total = comm.allreduce(np.array([correct, total], dtype=np.int64))
    return int(correct) / max(1, int(total))


def _endless(loader):
    while True:
        yield from loader


def _staleness_counts(stats: dict, comm) -> np.ndarray:
    """All workers' staleness histograms summed (count of pushes by staleness 0, 1, ...)."""
    mine = np.asarray(stats.get("staleness_hist", [0]), dtype=np.int64)
    counts = comm.allreduce(mine)
    nonzero = np.nonzero(counts)[0]
    return counts[:nonzero[-1] + 1] if len(nonzero) else np.zeros(0, dtype=np.int64)


def train_worker(args) -> dict:
    """One worker's training loop; returns the metrics record (complete on worker 0)."""
    import torch
    import torch.nn.functional as F
    from mpi4py import MPI
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    import hvd_async as ha
    from . import data, models
    from .transport.window import staleness_summary
    from .config import algorithm_options
    from .metrics import RunMetrics

    rank, workers, comm = ha.rank(), ha.size(), ha.worker_comm()
    reporter = rank == 0
    torch.set_num_threads(_threads_per_rank(ha.world_size()))
    torch.manual_seed(args.seed)
    splits = data.load_dataset(args.dataset, args.data_dir, seed=args.seed, image_size=args.image_size)
    model = models.build_model(args.model, splits.input_shape, splits.num_classes)
    import horovod.torch as hvd

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = ha.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                        weight_decay=args.weight_decay),
        named_parameters=model.named_parameters(), algorithm=args.algo, **algorithm_options(args))
    uses_servers = ha.num_servers() > 0
    global_steps = -(-len(splits.train) // args.batch_size)  # batches in one pass over the data
    if uses_servers:
        # No barrier inside an epoch: each worker draws its own random batches for as long as it
        # takes all workers together to push one epoch's worth (fast workers push more of them).
        sampler = RandomSampler(splits.train, generator=torch.Generator().manual_seed(
            args.seed * 1000 + rank + 1))
        steps_per_epoch = -(-global_steps // workers)  # an estimate, for the progress bar
    else:
        sampler = DistributedSampler(splits.train, num_replicas=workers, rank=rank, shuffle=True,
                                     seed=args.seed)
    loader = DataLoader(splits.train, batch_size=args.batch_size, sampler=sampler)
    if not uses_servers:
        steps_per_epoch = len(loader)
    batches = _endless(loader)
    shared = None  # dbs-asgd: batches of the size the strategy says, each sample once per epoch
    if args.algo == "dbs-asgd":
        from torch.utils.data import default_collate

        from .sampling import SharedCursorBatches

        shared = SharedCursorBatches(len(splits.train), seed=args.seed,
                                     fetch_add=opt.strategy.transport.fetch_add_cursor)
        drawn = None  # (epoch index, sample indices) drawn but not trained on yet
    pacer = _Pacer(args.compute_ms, args.stragglers.get(rank, 1.0))
    metrics = RunMetrics({
        "algorithm": args.algo, "world_size": ha.world_size(), "workers": workers,
        "servers": ha.num_servers(), "dataset": args.dataset, "model": args.model,
        "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
        "compute_ms": args.compute_ms, "stragglers": {str(k): v for k, v in args.stragglers.items()},
    }, logdir=args.logdir, reporter=reporter)

    bar = None
    if reporter and (args.progress == "bar" or (args.progress == "auto" and (
            sys.stderr.isatty() or os.environ.get("HVD_ASYNC_PROGRESS") == "1"))):
        from tqdm import tqdm

        bar = tqdm(total=args.epochs * steps_per_epoch, desc=f"{args.algo} x{workers}", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    steps = samples = 0
    train_seconds = wait_total = 0.0
    loss_sum = torch.zeros(())
    staleness_seen = np.zeros(0, dtype=np.int64)
    for epoch in range(1, args.epochs + 1):
        if not uses_servers:
            sampler.set_epoch(epoch)
        epoch_start, epoch_samples, epoch_steps, wait, compute = time.perf_counter(), 0, 0, 0.0, 0.0
        blocked_before = opt.stats().get("exchange_wait_seconds")
        loss_sum.zero_()
        while True:
            if shared is not None:
                drawn = drawn or shared.draw(opt.strategy.batch_size)
                if drawn[0] >= epoch:  # the shared sequence has moved on to the next epoch
                    break
                x, y = default_collate([splits.train[i] for i in drawn[1]])
                drawn = None
            elif (opt.progress() < epoch * global_steps) if uses_servers else (epoch_steps < len(loader)):
                x, y = next(batches)
            else:
                break
            pacer.before_step(len(y) / args.batch_size)
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            t1 = time.perf_counter()
            opt.step(loss=loss.detach())  # time in here: waiting for the exchange, then the local update
            t2 = time.perf_counter()
            pacer.last_work = t1 - t0
            compute += t1 - t0
            wait += t2 - t1
            loss_sum += loss.detach()
            steps += 1
            epoch_steps += 1
            epoch_samples += len(y)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}", epoch=epoch, refresh=False)
        epoch_seconds = time.perf_counter() - epoch_start
        train_seconds += epoch_seconds
        samples += epoch_samples
        if args.algo != "ssgd":  # (ssgd has nothing in flight after step(); its synchronize reduces again)
            # first thing after the loop: finish the exchange in flight; the parameter-server
            # algorithms tell the servers this worker stopped pushing (softsync must not wait for
            # its gradients); then every worker holds the global weights to evaluate
            opt.synchronize()
        stats = opt.stats()
        timing = {"compute_ms_per_step": 1000.0 * compute / max(1, epoch_steps)}
        if blocked_before is not None:  # od-sgd, hpsgd: time step() sat waiting for the exchange
            timing["exchange_blocked_ms_per_step"] = comm.allreduce(
                1000.0 * (stats["exchange_wait_seconds"] - blocked_before) / max(1, epoch_steps)) / workers
        train_loss = comm.allreduce(float(loss_sum) / max(1, epoch_steps)) / workers
        rates = comm.gather(epoch_samples / epoch_seconds, root=0)
        accuracy = _evaluate(model, splits.test, rank, workers, comm)
        if hasattr(opt.strategy, "resume_local"):  # easgd evaluated the centre; train on its own weights
            opt.strategy.resume_local()
        wait_ms = 1000.0 * wait / max(1, epoch_steps)
        wait_total += wait
        staleness = _staleness_counts(stats, comm)
        timing["compute_ms_per_step"] = comm.allreduce(timing["compute_ms_per_step"]) / workers
        batch_sizes = comm.gather(stats.get("batch_size", args.batch_size), root=0)
        if reporter:
            entry = metrics.epoch(epoch, test_accuracy=accuracy, train_loss=train_loss,
                                  worker_samples_per_second=rates, exchange_wait_ms=wait_ms, timing=timing)
            if shared is not None:
                entry["batch_sizes"] = batch_sizes
                for worker, size in enumerate(batch_sizes):
                    metrics.scalar(f"batch_size/worker_{worker}", size, epoch)
            if staleness.sum() > staleness_seen.sum():
                metrics.staleness_histogram(staleness, staleness_seen, epoch)
            staleness_seen = staleness
            line = (f"epoch {epoch}/{args.epochs}  train loss {train_loss:.4f}  test accuracy "
                    f"{accuracy:.4f}  {sum(rates):.0f} samples/s  {entry['wall_seconds']:.1f} s")
            if bar is not None:
                bar.write(line)
            else:
                _say(line)
    if bar is not None:
        bar.close()
    total_samples = comm.allreduce(samples)
    total_steps = comm.allreduce(steps)
    train_seconds = comm.allreduce(train_seconds, op=MPI.MAX)
    opt.close()
    staleness_mean, staleness_max = staleness_summary(staleness_seen)
    final_accuracy = metrics.history[-1]["test_accuracy"] if reporter else None
    return metrics.finish(
        args.metrics_out, steps=steps, final_test_accuracy=final_accuracy, final_train_loss=train_loss,
        wall_seconds=round(metrics.elapsed(), 4), train_seconds=round(train_seconds, 4), samples=total_samples,
        samples_per_second=total_samples / max(train_seconds, 1e-9),
        step_wait_ms_mean=1000.0 * wait_total / max(1, steps),
        exchange_blocked_ms_mean=(1000.0 * comm.allreduce(stats["exchange_wait_seconds"]) / max(1, total_steps)
                                  if "exchange_wait_seconds" in stats else None),
        staleness_mean=staleness_mean, staleness_max=staleness_max,
        staleness_hist=staleness_seen.tolist(), batch_sizes=batch_sizes,
        server_ms_per_push=stats.get("server_ms_per_push"), updates=opt.progress() if uses_servers else steps * workers)


def main(argv=None) -> int:
    from . import config

    try:
        args = config.parse(argv, launcher=False)
    except ConfigError as exc:
        _say(f"hvd_async.train: error: {exc}")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        config.validate(args, world_size=world.size)
    except ConfigError as exc:
        if world.rank == 0:
            _say(f"hvd_async.train: error: {exc}")
        return 2

    import hvd_async as ha
    from .data import DataError
    from .models import ModelError

    ha.init(servers=args.servers)
    if ha.is_server():
        import torch

        torch.set_num_threads(_threads_per_rank(world.size))  # the rules' tensor math, on shared cores
        report = ha.serve()
        for shard in report.shards:
            hist = ", ".join(f"{tau}: {n}" for tau, n in enumerate(shard.staleness_hist) if n)
            _say(f"server {shard.shard}: {shard.algorithm} shard of {shard.numel} parameters: {shard.updates} "
                 f"updates from {shard.pushes} pushes, staleness mean {shard.staleness_mean:.2f} "
                 f"(counts {{{hist}}}), {shard.skipped_nonfinite} non-finite pushes skipped, "
                 f"{1000.0 * shard.busy_seconds / max(1, shard.pushes):.3f} ms server time per push")
        return 0
    try:
        record = train_worker(args)
    except (DataError, ModelError, ConfigError) as exc:  # raised alike on every worker
        if ha.rank() == 0:
            _say(f"hvd_async.train: error: {exc}")
        return 2
    except Exception:  # one rank failed alone: take the job down rather than hang the others
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
    finally:
        ha.shutdown()
    if ha.rank() == 0:
        print(f"result: {args.algo} on {args.dataset} ({args.model}), {record['workers']} worker(s), "
              f"{args.epochs} epochs: test accuracy {record['final_test_accuracy']:.4f}, train loss "
              f"{record['final_train_loss']:.4f}, {record['wall_seconds']:.1f} s, "
              f"{record['samples_per_second']:.0f} samples/s", flush=True)
        if args.metrics_out:
            print(f"metrics written to {args.metrics_out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

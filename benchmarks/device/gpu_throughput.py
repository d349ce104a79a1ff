"""gpu_throughput: ssgd against plain Horovod on the GPU, hpsgd's hidden exchange, staging through the windows.

What each part measures: ssgd through hvd_async against plain Horovod on the GPU, hpsgd's exchange
hidden behind backprop, and the cost of staging GPU parameters through the parameter servers' CPU
windows.

Three parts (``--part``, default all), each one MPI job that this script launches (mpirun, through the
project's launcher) with the ranks it needs, printing its figures and writing JSON and a plot to
``--outdir`` (benchmarks/results/), with the device, the driver and the commit:

- ``throughput`` (``--np`` workers): resnet50 on synthetic images on the GPU, ssgd through hvd_async
  against ``horovod.torch.DistributedOptimizer`` (Horovod's NCCL operations where it was built with
  them), alternating (A B, then B A, ...) so drift hits both alike; the throughput ratio ours / plain
  per pair, its median and spread. Target: >= 0.98.
- ``overlap`` (``--overlap-np`` workers): hpsgd with its CUDA stream, window ``--window``, overlap on:
  the time per step (CUDA events on the training stream) against the same steps of the same model
  with no exchange at all, alternating; the difference is the time the exchange blocked training.
  The exchange's own time: an allreduce of the same size alone, timed with CUDA events. Claim: the
  blocked time per step is at most 10% of the exchange's own time (backprop outlasts the exchange).
- ``staging`` (1 worker + 1 server): asgd, dc-asgd and od-sgd (window exchange) with the model on the
  GPU: time per step, and the part of it that copies gradients to and parameters from the flat CPU
  buffer the MPI windows use (the staging), timed alone on the same model.

Two ranks on one GPU: NCCL refuses two ranks on one device ("Duplicate GPU detected"). With
``HVD_ASYNC_NCCL_HOSTID_PER_RANK=1`` every rank sets ``NCCL_HOSTID`` to its own value before NCCL
starts, so NCCL takes the ranks for two hosts and joins them over sockets (set ``NCCL_SOCKET_IFNAME=lo``);
or use a Horovod built without GPU operations, which stages CUDA tensors through host memory and MPI.
scripts/device_check.sh finds the way that works and says which.

``--device cpu`` runs the same code on the CPU: a smoke run of the script (small model, few steps).

    python benchmarks/device/gpu_throughput.py                          # all parts, on the GPU
    python benchmarks/device/gpu_throughput.py --part overlap --overlap-np 2 --window 2
    python benchmarks/device/gpu_throughput.py --device cpu --model resnet18 --image-size 8 --batch-size 4 \\
        --steps 2 --warmup 1 --repeats 2 --np 2 --overlap-np 2 --outdir /tmp/gpu_smoke
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, ROOT

PARTS = ("throughput", "overlap", "staging")
# environment variables every rank needs (forwarded by mpirun -x when set)
FORWARD = ("HVD_ASYNC_NCCL_HOSTID_PER_RANK", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG",
           "HVD_ASYNC_GPU_HOROVOD", "DEVICE_COMMIT", "LD_LIBRARY_PATH", "OPAL_PREFIX", "PMIX_PREFIX",
           "PMIX_PKGDATADIR", "PMIX_DATADIR", "PMIX_PKGLIBDIR", "PMIX_LIBDIR", "HOROVOD_FUSION_THRESHOLD",
           "HOROVOD_CYCLE_TIME", "CUDA_VISIBLE_DEVICES")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=PARTS + ("all",), default="all")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--np", type=int, default=1,
                   help="throughput: workers (one GPU: 1, or 2 sharing it; see the module docstring)")
    p.add_argument("--overlap-np", type=int, default=2, help="overlap: workers sharing the GPU")
    p.add_argument("--model", default="resnet50", choices=("mlp", "cnn", "resnet18", "resnet50"))
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64, help="samples per step on each worker")
    p.add_argument("--fused", action="store_true",
                   help="throughput: torch's fused SGD (fused=True) in both runs, whose kernel skips a "
                        "non-finite step itself, so ssgd's guard reads nothing on the host")
    p.add_argument("--host-check", action="store_true",
                   help="throughput, unfused SGD: ssgd reads its check on the host before each step "
                        "(undo_on_device=False) instead of undoing a non-finite step on the device")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    p.add_argument("--repeats", type=int, default=6, help="throughput: timed pairs; overlap: pairs; staging: runs")
    p.add_argument("--window", type=int, default=1, help="overlap: hpsgd's window (steps per exchange)")
    p.add_argument("--exchange-repeats", type=int, default=10, help="overlap: timed allreduces alone")
    p.add_argument("--outdir", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=float, default=560, help="seconds each part's MPI job may take")
    p.add_argument("--_rank-part", dest="rank_part", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("np", "overlap_np", "image_size", "batch_size", "steps", "repeats", "window", "exchange_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


# --- the parts' shared pieces (run on every rank) ------------------------------------------------------

def nccl_host_per_rank() -> None:
    """HVD_ASYNC_NCCL_HOSTID_PER_RANK=1: a host id of this rank's own, before NCCL starts (see above)."""
    if os.environ.get("HVD_ASYNC_NCCL_HOSTID_PER_RANK") == "1":
        os.environ["NCCL_HOSTID"] = "hvd-async-rank-" + os.environ.get("OMPI_COMM_WORLD_RANK", "0")


def start(args, servers: int = 0):
    """ha.init, this rank's GPU and CPU threads; returns (torch, hvd, ha, device)."""
    nccl_host_per_rank()
    import horovod.torch as hvd
    import torch

    import hvd_async as ha

    ha.init(servers=servers)
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False; use --device cpu for a smoke run")
        index = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    return torch, hvd, ha, device


def build(args, torch, device):
    """A fresh model (seed 0) on ``device`` and one fixed synthetic batch of this worker."""
    sys.path.insert(0, ROOT)
    from hvd_async.models import build_model

    torch.manual_seed(0)
    model = build_model(args.model, (3, args.image_size, args.image_size), args.num_classes).to(device)
    g = torch.Generator().manual_seed(1000 + int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g).to(device)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g).to(device)
    return model, x, y


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Seconds of work on the current stream between start() and stop(): CUDA events on a GPU (the
    time the stream spent, including any wait for another stream), perf_counter on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def start(self):
        if self.cuda:
            self.begin = self.torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return self.begin.elapsed_time(end) / 1000.0
        return time.perf_counter() - self.begin


def barrier(hvd, name: str) -> None:
    hvd.allreduce(hvd_zero(), name=name)


def hvd_zero():
    import torch

    return torch.zeros(1)  # a CPU tensor: the barrier never needs the GPU collectives


def spread(values):
    values = sorted(values)
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": values[0], "max": values[-1]}


# --- throughput: ssgd against plain Horovod -----------------------------------------------------------

def timed_run(kind, args, torch, hvd, ha, device) -> float:
    import torch.nn.functional as F

    model, x, y = build(args, torch, device)
    base = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=args.fused or None)
    if kind == "plain":
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        opt = ha.DistributedOptimizer(base, named_parameters=model.named_parameters(), algorithm="ssgd",
                                      undo_on_device=not args.host_check)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync(torch, device)
    barrier(hvd, f"tp.{kind}.start")
    begin = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(torch, device)
    barrier(hvd, f"tp.{kind}.end")
    seconds = time.perf_counter() - begin
    if kind == "ours":
        opt.close()
    return args.steps * args.batch_size * hvd.size() / seconds


def guard_name(args) -> str:
    """How ssgd's non-finite guard runs in this benchmark's ``ours`` runs."""
    if args.fused:
        return "found_inf (the fused optimizer skips on the device flag)"
    return "host read" if args.host_check else "undone on the device (StepUndo)"


def throughput(args) -> dict:
    torch, hvd, ha, device = start(args)
    rows = []
    for r in range(args.repeats):
        order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
        rate = {kind: timed_run(kind, args, torch, hvd, ha, device) for kind in order}
        rows.append({"repeat": r, "ours": rate["ours"], "plain": rate["plain"], "ratio": rate["ours"] / rate["plain"]})
        if hvd.rank() == 0:
            print(f"repeat {r}: ours {rate['ours']:.1f}  plain {rate['plain']:.1f} samples/s  "
                  f"ratio {rows[-1]['ratio']:.4f}", flush=True)
    ratio = spread([row["ratio"] for row in rows])
    summary = {"benchmark": "gpu_throughput", "device": str(device), "workers": hvd.size(), "model": args.model,
               "image_size": args.image_size, "batch_size": args.batch_size, "steps": args.steps,
               "optimizer": "SGD(momentum=0.9, fused=True)" if args.fused else "SGD(momentum=0.9)",
               "nonfinite_check": guard_name(args), "warmup": args.warmup, "repeats": args.repeats,
               "ratio_median": ratio["median"], "ratio_q1": ratio["q1"], "ratio_q3": ratio["q3"],
               "ratio_min": ratio["min"], "ratio_max": ratio["max"], "target": 0.98,
               "ours_samples_per_second_median": statistics.median(r["ours"] for r in rows),
               "plain_samples_per_second_median": statistics.median(r["plain"] for r in rows), "runs": rows}
    if hvd.rank() == 0:
        print(f"throughput ratio ours/plain: median {ratio['median']:.4f} (IQR {ratio['q1']:.4f}..{ratio['q3']:.4f}, "
              f"min {ratio['min']:.4f}, max {ratio['max']:.4f}) over {len(rows)} pairs at {hvd.size()} worker(s) "
              f"on {device}, {summary['optimizer']}, check {summary['nonfinite_check']}; target >= 0.98", flush=True)
    return summary


def plot_throughput(summary, path, plt):
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    reps = [r["repeat"] for r in summary["runs"]]
    a.plot(reps, [r["plain"] for r in summary["runs"]], "o-", label="horovod DistributedOptimizer")
    a.plot(reps, [r["ours"] for r in summary["runs"]], "s-", label="hvd_async ssgd")
    a.set_xlabel("repeat"), a.set_ylabel("samples/s"), a.legend(fontsize=8)
    b.boxplot([r["ratio"] for r in summary["runs"]])
    b.axhline(summary["target"], color="r", ls="--", label=f"target {summary['target']}")
    b.set_ylabel("ours / plain"), b.set_xticks([]), b.legend(fontsize=8)
    fig.suptitle(f"ssgd on {summary['model']}, {summary['workers']} worker(s), {summary['device']}: "
                 f"median ratio {summary['ratio_median']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- overlap: hpsgd's exchange hidden behind backprop -------------------------------------------------

def exchange_alone(args, torch, hvd, device, numel: int) -> list:
    """Seconds of an allreduce (average) of ``numel`` floats alone, on a side stream as hpsgd runs it,
    from its launch until the result may be used there (CUDA events on that stream)."""
    buffer = torch.zeros(numel, device=device)
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    seconds = []
    for i in range(args.exchange_repeats + 1):
        sync(torch, device)
        barrier(hvd, f"own.{i}")
        if stream is None:
            begin = time.perf_counter()
            hvd.synchronize(hvd.allreduce_async_(buffer, name="own.exchange", op=hvd.Average))
            took = time.perf_counter() - begin
        else:
            with torch.cuda.stream(stream):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                hvd.synchronize(hvd.allreduce_async_(buffer, name="own.exchange", op=hvd.Average))
                end.record()
            end.synchronize()
            took = begin.elapsed_time(end) / 1000.0
        if i:  # the first one sets NCCL up
            seconds.append(took)
    return seconds


def _steps(args, torch, hvd, device, opt, model, x, y, tag: str) -> float:
    """Mean seconds per step over ``args.steps`` steps after the warm-up, timed on the training stream."""
    import torch.nn.functional as F

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync(torch, device)
    barrier(hvd, f"ov.{tag}")
    timer = Timer(torch, device)
    timer.start()
    for _ in range(args.steps):
        step()
    return timer.stop() / args.steps


def measure_overlap(args, torch, hvd, ha, device) -> dict:
    """The overlap part's figures (every worker calls it; all take part in the collectives)."""
    model, _, _ = build(args, torch, device)
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del model
    own = exchange_alone(args, torch, hvd, device, numel)
    rows = []
    for r in range(args.repeats):
        order = ("local", "hpsgd") if r % 2 == 0 else ("hpsgd", "local")
        row = {"repeat": r}
        for kind in order:
            model, x, y = build(args, torch, device)
            base = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if kind == "local":
                row["local_step_s"] = _steps(args, torch, hvd, device, base, model, x, y, f"local.{r}")
                continue
            opt = ha.DistributedOptimizer(base, named_parameters=model.named_parameters(), algorithm="hpsgd",
                                          window=args.window, overlap=True)
            if device.type == "cuda" and opt.strategy._stream is None:
                raise RuntimeError("hpsgd on the GPU made no CUDA stream of its own")
            before = opt.stats()["exchange_wait_seconds"]
            row["hpsgd_step_s"] = _steps(args, torch, hvd, device, opt, model, x, y, f"hpsgd.{r}")
            stats = opt.stats()
            row["host_wait_s_per_step"] = (stats["exchange_wait_seconds"] - before) / (args.warmup + args.steps)
            row["exchanges"] = stats["exchanges"]
            getattr(opt, "load_global_model", opt.synchronize)()
            opt.close()
        row["blocked_s_per_step"] = row["hpsgd_step_s"] - row["local_step_s"]
        rows.append(row)
    # every worker's view: the slowest worker's figures decide
    mine = {"exchange_s": statistics.median(own),
            "local_step_s": statistics.median(r["local_step_s"] for r in rows),
            "hpsgd_step_s": statistics.median(r["hpsgd_step_s"] for r in rows),
            "blocked_s_per_step": statistics.median(r["blocked_s_per_step"] for r in rows),
            "host_wait_s_per_step": statistics.median(r["host_wait_s_per_step"] for r in rows)}
    everyone = hvd.allgather_object(mine)
    worst = {key: max(w[key] for w in everyone) for key in mine}
    blocked = max(0.0, worst["blocked_s_per_step"])
    return {"benchmark": "gpu_overlap", "device": str(device), "workers": hvd.size(), "model": args.model,
            "parameters": numel, "image_size": args.image_size, "batch_size": args.batch_size,
            "window": args.window, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
            "timing": "CUDA events on the training stream" if device.type == "cuda" else "perf_counter",
            "exchange_ms": 1e3 * worst["exchange_s"], "exchange_ms_runs": [1e3 * s for s in own],
            "local_step_ms": 1e3 * worst["local_step_s"], "hpsgd_step_ms": 1e3 * worst["hpsgd_step_s"],
            "blocked_ms_per_step": 1e3 * blocked,
            "blocked_ms_per_exchange": 1e3 * blocked * args.window,
            "host_wait_ms_per_step": 1e3 * worst["host_wait_s_per_step"],
            "blocked_over_exchange": blocked / worst["exchange_s"] if worst["exchange_s"] > 0 else None,
            "backprop_outlasts_exchange": worst["local_step_s"] > worst["exchange_s"],
            "target": 0.10, "per_worker": everyone, "runs_rank0": rows}


def overlap(args) -> dict:
    torch, hvd, ha, device = start(args)
    summary = measure_overlap(args, torch, hvd, ha, device)
    if hvd.rank() == 0:
        s = summary
        print(f"hpsgd window {s['window']} on {s['model']} ({s['parameters']} parameters), {s['workers']} worker(s) "
              f"on {s['device']}: step {s['local_step_ms']:.1f} ms without exchange, {s['hpsgd_step_ms']:.1f} ms "
              f"with; blocked {s['blocked_ms_per_step']:.2f} ms/step against the exchange's own "
              f"{s['exchange_ms']:.1f} ms: {s['blocked_over_exchange']:.3f} (target <= 0.10)", flush=True)
    return summary


def plot_overlap(summary, path, plt):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ["exchange alone", "step, no exchange", "step, hpsgd", "blocked per step"]
    values = [summary["exchange_ms"], summary["local_step_ms"], summary["hpsgd_step_ms"], summary["blocked_ms_per_step"]]
    ax.bar(names, values, color=["tab:gray", "tab:blue", "tab:orange", "tab:red"])
    ax.axhline(0.1 * summary["exchange_ms"], color="r", ls="--", lw=1, label="10% of the exchange")
    ax.set_ylabel("ms"), ax.legend(fontsize=8)
    ax.set_title(f"hpsgd k={summary['window']}, {summary['model']}, {summary['workers']} worker(s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- staging: parameter servers with the model on the GPU ---------------------------------------------

STAGING = (("asgd", {}), ("dc-asgd", {"lam": 0.04}), ("od-sgd", {"exchange": "window"}))


def staging(args) -> dict:
    import torch.nn.functional as F

    torch, hvd, ha, device = start(args, servers=1)
    if ha.is_server():
        ha.serve()
        return {}
    from hvd_async.algorithms.flat import FlatModel

    rows = []
    for algorithm, options in STAGING:
        model, x, y = build(args, torch, device)
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                      named_parameters=model.named_parameters(), algorithm=algorithm, **options)
        step_s = []
        for i in range(args.warmup + args.steps):
            sync(torch, device)
            begin = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sync(torch, device)
            if i >= args.warmup:
                step_s.append(time.perf_counter() - begin)
        getattr(opt, "load_global_model", opt.synchronize)()
        opt.close()
        # the staging alone: gradients into the flat CPU buffer, the parameters out and back in
        flat = FlatModel([p for p in model.parameters() if p.requires_grad])
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        copy_s = []
        for i in range(args.warmup + args.steps):
            sync(torch, device)
            begin = time.perf_counter()
            flat.gather_grads()
            flat.store_params()
            flat.load_params()
            sync(torch, device)
            if i >= args.warmup:
                copy_s.append(time.perf_counter() - begin)
        row = {"algorithm": algorithm, "options": options, "step_ms": 1e3 * statistics.median(step_s),
               "staging_ms": 1e3 * statistics.median(copy_s), "views": flat.views}
        row["staging_fraction"] = row["staging_ms"] / row["step_ms"]
        rows.append(row)
        print(f"{algorithm:>8} on {device}: step {row['step_ms']:.1f} ms, of which staging "
              f"{row['staging_ms']:.1f} ms ({100 * row['staging_fraction']:.0f}%)", flush=True)
        del flat, model, opt
    numel = sum(p.numel() for p in build(args, torch, device)[0].parameters())
    return {"benchmark": "gpu_staging", "device": str(device), "model": args.model, "parameters": numel,
            "bytes_each_way": 4 * numel, "image_size": args.image_size, "batch_size": args.batch_size,
            "steps": args.steps, "warmup": args.warmup, "workers": 1, "servers": 1, "runs": rows}


def plot_staging(summary, path, plt):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["algorithm"] for r in summary["runs"]]
    ax.bar(names, [r["step_ms"] for r in summary["runs"]], color="tab:blue", label="step")
    ax.bar(names, [r["staging_ms"] for r in summary["runs"]], color="tab:orange", label="of which staging")
    ax.set_ylabel("ms per step"), ax.legend(fontsize=8)
    ax.set_title(f"{summary['model']} on {summary['device']}, 1 worker + 1 server", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- driver -------------------------------------------------------------------------------------------

PART_RUN = {"throughput": throughput, "overlap": overlap, "staging": staging}
PART_PLOT = {"throughput": plot_throughput, "overlap": plot_overlap, "staging": plot_staging}


def ranks_for(part: str, args) -> int:
    return {"throughput": args.np, "overlap": args.overlap_np, "staging": 2}[part]


def rank_main(args) -> int:
    """One rank of one part's job: rank 0 writes the part's JSON (and its plot)."""
    summary = PART_RUN[args.rank_part](args)
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != 0 and args.rank_part != "staging":
        return 0
    if not summary:  # a server of the staging part
        return 0
    from common import provenance
    from device_info import environment

    summary["environment"] = environment()
    summary["provenance"] = provenance()  # commit (DEVICE_COMMIT there), clean tree, machine, command
    os.makedirs(args.outdir, exist_ok=True)
    out = os.path.join(args.outdir, f"gpu_{args.rank_part}.json")
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        PART_PLOT[args.rank_part](summary, os.path.splitext(out)[0] + ".png", plt)
    except ImportError:
        pass
    print(f"wrote {out}", flush=True)
    return 0


def run_job(cmd, timeout: float):
    """Run an mpirun job in its own process group; past ``timeout`` seconds kill the whole group."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"timed out after {timeout:.0f} s"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank_part:
        return rank_main(args)
    sys.path.insert(0, ROOT)
    from hvd_async.job.launcher import mpirun_command

    failed = []
    for part in (PARTS if args.part == "all" else (args.part,)):
        print(f"== {part}", flush=True)
        program = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:]),
                   "--_rank-part", part]
        code = run_job(mpirun_command(ranks_for(part, args), program, env=[n for n in FORWARD if n in os.environ]),
                       args.timeout)
        if code != 0:
            print(f"part {part} failed ({code})", flush=True)
            failed.append(part)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

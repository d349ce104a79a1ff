"""GPU checks, run by tests/test_gpu.py under mpirun: ``SERVERS=S python gpu_checks.py [CHECK ...]``.

Workers run the named checks in order (harness.py); worker 0 prints ``GPU CHECKS OK`` at the end and
``RESULT {json}`` lines with what a check measured (test_gpu.py keeps them). The model lives on
``GPU_CHECKS_DEVICE`` (default ``cuda``; ``cpu`` runs the same code without a GPU, which only checks
the checks). With ``HVD_ASYNC_NCCL_HOSTID_PER_RANK=1`` each rank gives NCCL a host id of its own, so
that two ranks may share the one GPU (benchmarks/device/gpu_throughput.py says why).

- ``probe``: a Horovod allreduce of a CUDA tensor works at this many ranks (what Horovod was built with).
- ``hpsgd_sync``: hpsgd with ``window=1``, no overlap, merge rate 1, the model on the GPU (hpsgd's own
  CUDA stream), equals ssgd through hvd_async and plain ``horovod.torch.DistributedOptimizer``.
- ``hpsgd_cpu``: hpsgd with overlap (window 2, momentum) on the GPU equals the same run on the CPU, at
  every step and after ``load_global_model()`` (float64, so only the kernels' rounding differs).
- ``hpsgd_table``: the fixed gradient table against the hand recurrence (tests/reference.py) with a
  large tensor on the GPU, overlap on and off: a missing wait between the streams shows here.
- ``hpsgd_hidden``: resnet50 on synthetic images: the time hpsgd's exchange blocks a step is at most
  ``HIDDEN_TARGET`` (10%) of the exchange's own time (benchmarks/device/gpu_throughput.py's overlap part).
- ``ssgd_device_skip``: ssgd with torch's SGD on the GPU, fused and unfused, takes no host sync in its
  steps (torch's sync debug mode set to error) and skips a step whose averaged gradient holds NaN, exactly.
- ``ps_parity`` (SERVERS=1): asgd, dc-asgd and od-sgd (both exchanges) with the model on the GPU equal
  the CPU run of the same pushes exactly (integer gradients, lr 1).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "device"))

if os.environ.get("HVD_ASYNC_NCCL_HOSTID_PER_RANK") == "1":  # before anything starts NCCL
    os.environ["NCCL_HOSTID"] = "hvd-async-rank-" + os.environ.get("OMPI_COMM_WORLD_RANK", "0")

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hvd_async as ha  # noqa: E402
from harness import check, main, say  # noqa: E402
from reference import hpsgd as reference_hpsgd, table_grad, table_start  # noqa: E402

DEVICE_NAME = os.environ.get("GPU_CHECKS_DEVICE", "cuda")
HIDDEN_TARGET = float(os.environ.get("GPU_CHECKS_HIDDEN_TARGET", "0.10"))


def device() -> torch.device:
    if DEVICE_NAME == "cpu":
        return torch.device("cpu")
    index = ha.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def result(record: dict) -> None:
    """A measured figure for the test to keep (worker 0 only)."""
    if ha.rank() == 0:
        say("RESULT " + json.dumps(record))


def to_global(opt) -> None:
    """Collective: every worker takes the global model (``load_global_model()``; before that API,
    ``synchronize()`` did it)."""
    getattr(opt, "load_global_model", opt.synchronize)()


def _exact_math() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _all_workers_equal(tensors) -> bool:
    flat = torch.cat([t.detach().flatten().double().cpu() for t in tensors])
    everyone = ha.worker_comm().allgather(flat)
    return all(torch.equal(everyone[0], x) for x in everyone)


def probe():
    dev = device()
    x = hvd.allreduce(torch.full((1024,), float(ha.rank() + 1), device=dev), name="probe", op=hvd.Sum)
    want = sum(range(1, ha.size() + 1))
    check(bool((x == want).all()), f"allreduce on {dev} gave {x[:3].tolist()}, expected {want}")
    result({"check": "probe", "workers": ha.size(), "device": str(dev), "nccl_built": hvd.nccl_built(),
            "mpi_built": hvd.mpi_built(), "cuda_built": hvd.cuda_built()})
    if ha.rank() == 0:
        say(f"GPU PROBE OK workers={ha.size()} device={dev} nccl_built={hvd.nccl_built()}")


# --- hpsgd ---------------------------------------------------------------------------------------------

def _mlp(dev, dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10)).to(dev, dtype)


def _batches(n, dev, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + ha.rank())  # every worker sees different data
    return [(torch.randn(16, 32, generator=g).to(dev, dtype), torch.randint(0, 10, (16,), generator=g).to(dev))
            for _ in range(n)]


def _train(opt, model, batches, after_step=None):
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if after_step is not None:
            after_step()


def _hpsgd(model, **options):
    return ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), algorithm="hpsgd", **options)


def hpsgd_sync():
    """window=1 without overlap is synchronous SGD: hpsgd's stream path against ssgd and plain Horovod."""
    _exact_math()
    dev = device()
    batches = _batches(8, dev)
    start = [p.detach().clone() for p in _mlp(dev).parameters()]

    plain_model = _mlp(dev)
    plain = hvd.DistributedOptimizer(torch.optim.SGD(plain_model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=plain_model.named_parameters())
    _train(plain, plain_model, batches)

    ssgd_model = _mlp(dev)
    ssgd = ha.DistributedOptimizer(torch.optim.SGD(ssgd_model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=ssgd_model.named_parameters(), algorithm="ssgd")
    _train(ssgd, ssgd_model, batches)
    ssgd.close()

    model = _mlp(dev)
    opt = _hpsgd(model, window=1, overlap=False, merge_rate=1.0)
    check((opt.strategy._stream is not None) == (dev.type == "cuda"),
          f"hpsgd on {dev}: stream {opt.strategy._stream}")
    _train(opt, model, batches)
    opt.close()
    worst = 0.0
    for (name, p), s, h, first in zip(model.named_parameters(), ssgd_model.parameters(), plain_model.parameters(), start):
        check(p.device == dev, f"{name} left {dev}: {p.device}")
        for other, who in ((s, "ssgd"), (h, "plain Horovod")):
            err = (p - other).abs().max().item()
            worst = max(worst, err)
            check(torch.allclose(p, other, rtol=1e-5, atol=1e-6), f"{name}: hpsgd differs from {who} by {err:.2e}")
        check(not torch.equal(p, first), f"{name} never changed")
    check(_all_workers_equal(model.parameters()), "hpsgd replicas differ across workers")
    result({"check": "hpsgd_sync", "workers": ha.size(), "device": str(dev), "max_abs_difference": worst})


def hpsgd_cpu():
    """Overlap on, window 2, momentum: the GPU run equals the CPU run at every step (float64)."""
    _exact_math()
    dev = device()
    steps, window = 9, 2
    runs = {}
    for where in (dev, torch.device("cpu")):
        model = _mlp(where, torch.float64)
        opt = _hpsgd(model, window=window, overlap=True)
        trace = []
        _train(opt, model, _batches(steps, where, torch.float64),
               after_step=lambda: trace.append(torch.cat([p.detach().flatten().cpu() for p in model.parameters()])))
        to_global(opt)
        trace.append(torch.cat([p.detach().flatten().cpu() for p in model.parameters()]))
        stats = opt.stats()
        opt.close()
        runs[where.type] = (trace, stats)
    gpu_trace, gpu_stats = runs[dev.type]
    cpu_trace, cpu_stats = runs["cpu"]
    worst = 0.0
    for t, (a, b) in enumerate(zip(gpu_trace, cpu_trace)):
        err = (a - b).abs().max().item()
        worst = max(worst, err)
        check(torch.allclose(a, b, rtol=1e-9, atol=1e-10), f"step {t + 1}: {dev} run is {err:.2e} off the CPU run")
    check(gpu_stats["exchanges"] == cpu_stats["exchanges"] and gpu_stats["staleness_hist"] == cpu_stats["staleness_hist"],
          f"stats differ: {gpu_stats} against {cpu_stats}")
    check(_all_workers_equal([gpu_trace[-1]]), "workers differ after load_global_model()")
    result({"check": "hpsgd_cpu", "workers": ha.size(), "device": str(dev), "steps": steps, "window": window,
            "max_abs_difference": worst})


def hpsgd_table():
    """The fixed gradient table against the hand recurrence, a large tensor on the GPU."""
    dev = device()
    numel, steps, k, rate, momentum, lr = 1 << 20, 10, 3, 0.5, 0.9, 0.1
    rank = ha.rank()
    for overlap in (True, False):
        trace, final = reference_hpsgd(ha.size(), steps, numel=numel, lr=lr, k=k, rate=rate, momentum=momentum,
                                       overlap=overlap)
        w = nn.Parameter(table_start(rank, numel).to(dev))
        opt = ha.DistributedOptimizer(torch.optim.SGD([w], lr=lr, momentum=momentum), named_parameters=[("w", w)],
                                      algorithm="hpsgd", window=k, merge_rate=rate, overlap=overlap)
        for t, (want_rs, want_g) in enumerate(trace, start=1):
            w.grad = table_grad(rank, t, numel).to(dev)
            opt.step()
            err = (w.detach().cpu() - want_rs[rank]).abs().max().item()
            check(err < 1e-9, f"overlap={overlap}: replica of worker {rank} after step {t} is {err:.2e} off")
            err = (opt.strategy.global_model.cpu() - want_g).abs().max().item()
            check(err < 1e-9, f"overlap={overlap}: global model after step {t} is {err:.2e} off")
        to_global(opt)
        err = (w.detach().cpu() - final).abs().max().item()
        check(err < 1e-9, f"overlap={overlap}: after load_global_model() {err:.2e} off")
        opt.close()
    result({"check": "hpsgd_table", "workers": ha.size(), "device": str(dev), "numel": numel})


def hpsgd_hidden():
    """resnet50: the exchange hidden behind backprop (blocked time <= HIDDEN_TARGET of the exchange)."""
    import argparse

    import gpu_throughput as bench

    dev = device()
    env = os.environ.get
    args = argparse.Namespace(device=dev.type, model=env("GPU_CHECKS_MODEL", "resnet50"),
                              image_size=int(env("GPU_CHECKS_IMAGE", "224")), num_classes=1000,
                              batch_size=int(env("GPU_CHECKS_BATCH", "64")), steps=int(env("GPU_CHECKS_STEPS", "12")),
                              warmup=3, repeats=int(env("GPU_CHECKS_REPEATS", "2")),
                              window=int(env("GPU_CHECKS_WINDOW", "1")), exchange_repeats=5)
    summary = bench.measure_overlap(args, torch, hvd, ha, dev)
    summary.pop("runs_rank0", None)
    result({"check": "hpsgd_hidden", **summary})
    check(summary["backprop_outlasts_exchange"],
          f"the step without exchange ({summary['local_step_ms']:.1f} ms) does not outlast the exchange "
          f"({summary['exchange_ms']:.1f} ms): nothing to hide it behind; use a larger batch")
    check(summary["blocked_over_exchange"] <= HIDDEN_TARGET,
          f"hpsgd blocked {summary['blocked_ms_per_step']:.2f} ms per step, "
          f"{summary['blocked_over_exchange']:.3f} of the exchange's own {summary['exchange_ms']:.1f} ms "
          f"(target <= {HIDDEN_TARGET})")


# --- the parameter-server family with the model on the GPU ---------------------------------------------

def _integer_model(dev):
    """Two parameters (a matrix and a vector) holding small integers, on ``dev``."""
    w = nn.Parameter((torch.arange(35) % 7 - 3).float().reshape(5, 7).to(dev))
    b = nn.Parameter((torch.arange(7) % 3).float().to(dev))
    return [("layer.weight", w), ("layer.bias", b)]


def _integer_grads(turns):
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(-4, 5, (5, 7), generator=g).float(), torch.randint(-4, 5, (7,), generator=g).float())
            for _ in range(turns)]


def _push_sequence(algorithm, dev, grads, *, lockstep, rounds, **options):
    """Round robin (worker t % W pushes at turn t, one push at a time) or lockstep (every worker every
    round, od-sgd's synchronous exchange); returns the final parameters on the CPU."""
    workers, rank = ha.size(), ha.rank()
    named = _integer_model(dev)
    params = [p for _, p in named]
    opt = ha.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named, algorithm=algorithm,
                                  **options)
    if lockstep:
        for r in range(rounds):
            for p, g in zip(params, grads[r * workers + rank]):
                p.grad = g.to(dev)
            opt.step()
    else:
        opt.begin()  # collective: before the turns
        for turn in range(rounds * workers):
            if turn % workers == rank:
                for p, g in zip(params, grads[turn]):
                    p.grad = g.to(dev)
                opt.step()
            ha.worker_comm().Barrier()
    to_global(opt)
    for name, p in named:
        check(p.device == dev, f"{algorithm}: {name} left {dev} for {p.device}")
    final = [p.detach().cpu().clone() for p in params]
    opt.close()
    return final


PS_CASES = (("asgd", {}, False), ("dc-asgd", {"lam": 0.0}, False), ("dc-asgd", {"lam": 0.0625}, False),
            ("od-sgd", {"exchange": "window", "local_lr": 1.0}, True),
            ("od-sgd", {"exchange": "allreduce", "local_lr": 1.0}, True))


def ps_parity():
    """The same pushes with the model on the GPU and on the CPU: the same weights, bit for bit."""
    dev = device()
    rounds = 6
    grads = _integer_grads(rounds * ha.size())
    done = []
    for algorithm, options, lockstep in PS_CASES:
        on_gpu = _push_sequence(algorithm, dev, grads, lockstep=lockstep, rounds=rounds, **options)
        on_cpu = _push_sequence(algorithm, torch.device("cpu"), grads, lockstep=lockstep, rounds=rounds, **options)
        label = f"{algorithm} {options}"
        for a, b in zip(on_gpu, on_cpu):
            check(torch.equal(a, b), f"{label}: {dev} run differs from the CPU run by {(a - b).abs().max().item()}")
        check(any(not torch.equal(a, s.detach().cpu()) for a, (_, s) in zip(on_gpu, _integer_model("cpu"))),
              f"{label}: the weights never changed")
        check(_all_workers_equal(on_gpu), f"{label}: workers hold different weights after load_global_model()")
        done.append(label)
    result({"check": "ps_parity", "workers": ha.size(), "servers": ha.num_servers(), "device": str(dev),
            "cases": done})


# --- ssgd's non-finite guard on the device ---------------------------------------------------------------

def ssgd_device_skip():
    """SGD with momentum, fused (its kernel skips on found_inf) and unfused (the step undone on the
    device), 8 steps each; worker 0 plants a NaN at step 5. From step 2 on (the optimizer's state
    exists) no step may sync with the host; step 5 leaves weights and momentum as they were, on every
    worker; every other step moves them; the count reads 1."""
    dev = device()
    if dev.type != "cuda":
        result({"check": "ssgd_device_skip", "skipped": "no CUDA device"})
        return
    for fused in (True, False):
        _device_skip(dev, fused)


def _device_skip(dev, fused: bool) -> None:
    kind = "fused" if fused else "unfused"
    model = _mlp(dev)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused),
                                  named_parameters=model.named_parameters(), algorithm="ssgd")

    def plant(p):  # in step 5's backward (before the allreduce hook reads the gradient)
        if opt.strategy.steps == 4:
            p.grad.view(-1)[3] = float("nan")

    if ha.rank() == 0:
        model[0].weight.register_post_accumulate_grad_hook(plant)
    history = []
    for step, (x, y) in enumerate(_batches(8, dev), start=1):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step > 1:
            torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        momentum = [opt.optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
        history.append(([p.detach().clone() for p in model.parameters()], momentum))
    for step in range(2, 9):
        (before, m_before), (after, m_after) = history[step - 2], history[step - 1]
        still = all(torch.equal(a, b) for a, b in zip(before + m_before, after + m_after))
        check(still == (step == 5), f"{kind} step {step}: weights and momentum {'unchanged' if still else 'moved'}")
    skipped = opt.stats()["skipped_nonfinite"]
    check(skipped == 1, f"{kind}: skipped_nonfinite {skipped}, expected 1")
    check(all(bool(torch.isfinite(w).all()) for w in history[-1][0]), f"{kind}: non-finite weights")
    check(_all_workers_equal(history[-1][0]), f"{kind}: workers hold different weights")
    opt.close()
    result({"check": "ssgd_device_skip", "optimizer": kind, "workers": ha.size(), "device": str(dev),
            "skipped": skipped})


CHECKS = {f.__name__: f for f in (probe, hpsgd_sync, hpsgd_cpu, hpsgd_table, hpsgd_hidden, ssgd_device_skip,
                                  ps_parity)}

if __name__ == "__main__":
    if DEVICE_NAME != "cpu" and not torch.cuda.is_available():
        raise SystemExit("gpu_checks.py: no CUDA device (GPU_CHECKS_DEVICE=cpu runs the checks on the CPU)")
    main(CHECKS, sys.argv[1:], "GPU CHECKS OK")

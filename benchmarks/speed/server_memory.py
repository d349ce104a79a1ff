"""server_memory: how much memory a parameter server holds per worker, from the outside.

For every server-side algorithm and several worker counts, a job of one server and W workers trains a
model of one flat parameter (``--numel`` float32s: 16.8M, 64 MiB, by default) for a few steps through
``hvd_async.DistributedOptimizer`` with the algorithm's defaults; at exit every rank reads its peak
resident memory (``VmHWM`` in ``/proc/self/status``). The same job with a tiny model gives each
process's fixed cost (Python, torch, MPI, windows' bookkeeping), so

    copies(W) = (peak(W, numel) - peak(W, tiny)) / (4 * numel)

is how many copies of the model the server holds at W workers, and the slope of copies(W) over W
is the copies each extra worker costs. The windows live in shared memory: a server's resident set
counts the pages of its own windows it touched (its shard's slots), which is what a node must hold.

    python benchmarks/speed/server_memory.py                          # every server-side algorithm at 2, 4, 8 workers
    python benchmarks/speed/server_memory.py --algos dc-asgd --workers 2,4 --numel 4194304
    python benchmarks/speed/server_memory.py --inbox-slots 2       # the mailbox algorithms with a pool of 2 inbox slots
    python benchmarks/speed/server_memory.py --algos dc-asgd,lc-asgd,softsync --inbox-slots 2 --shared-momentum
    python benchmarks/speed/server_memory.py --algos dc-asgd --checkpoint gathered,streamed   # what a checkpoint adds
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE, ROOT

TINY = 1024
OPTIONS = {"dbs-asgd": {"batch_size": 32},  # options an algorithm cannot do without
           "od-sgd": {"exchange": "window"}}  # its exchange through a server (the default needs none)


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def algorithm_options(algo: str, inbox_slots, shared_momentum: bool = False) -> dict:
    """The options the job gives ``algo``: what it cannot do without, ``inbox_slots`` where it has them, and
    with ``shared_momentum`` one momentum buffer on the servers where that is an option."""
    from dataclasses import fields

    from hvd_async import registry

    cls = registry.algorithm(algo).Options
    options = dict(OPTIONS.get(algo, {}))
    names = {f.name for f in fields(cls)}
    if inbox_slots is not None and "inbox_slots" in names:
        options["inbox_slots"] = inbox_slots
    if shared_momentum and "server_momentum" in names:
        options["server_momentum"] = "shared"
    return options


def rank_job(algo: str, numel: int, steps: int, out_dir: str, inbox_slots=None, shared_momentum=False,
             checkpoint="none") -> None:
    """One rank of the job (under mpirun): serve, or train ``steps`` steps (then, unless ``checkpoint``
    is none, take the algorithm's state: ``gathered`` to worker 0, or ``streamed``, each server writing
    its own shard into a folder), then record the peak."""
    import atexit

    import torch

    import hvd_async as ha

    ha.init(servers=1)
    role = "server" if ha.is_server() else f"worker{ha.rank()}"
    # registered after init's own exit hook, so it runs first: before the windows are freed
    atexit.register(lambda: _write(out_dir, role, peak_rss_bytes()))
    if ha.is_server():
        ha.serve()
        return
    param = torch.nn.Parameter(torch.zeros(numel))
    opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.01, momentum=0.9),
                                  named_parameters=[("w", param)], algorithm=algo,
                                  **algorithm_options(algo, inbox_slots, shared_momentum))
    signal = torch.linspace(-1.0, 1.0, numel)
    for step in range(steps):
        opt.zero_grad()
        loss = (param * signal).sum().mul(1.0 + 0.1 * ha.rank() + 0.01 * step)
        loss.backward()
        opt.step(loss=loss.item())  # (lc-asgd's pushes carry the loss; the others ignore it)
    if checkpoint != "none":
        opt.load_global_model()
        folder = os.path.join(out_dir, "shards") if checkpoint == "streamed" else None
        opt.algorithm_state_dict(shard_dir=folder)  # taken and dropped: the peak it made is what counts
    opt.close()


def _write(out_dir: str, role: str, peak: int) -> None:
    with open(os.path.join(out_dir, f"{role}.json"), "w") as f:
        json.dump({"peak_rss_bytes": peak}, f)


def run_job(algo: str, workers: int, numel: int, steps: int, timeout: float, inbox_slots=None,
            shared_momentum=False, checkpoint="none") -> dict:
    """Peak resident bytes of the server and of worker 0 in one job."""
    from hvd_async.job.launcher import mpirun_command

    with tempfile.TemporaryDirectory() as out_dir:
        cmd = mpirun_command(workers + 1, [sys.executable, os.path.abspath(__file__), "--rank-job", "--algos", algo,
                                           "--numel", str(numel), "--steps", str(steps), "--out-dir", out_dir]
                             + ([] if inbox_slots is None else ["--inbox-slots", str(inbox_slots)])
                             + (["--shared-momentum"] if shared_momentum else [])
                             + ["--checkpoint", checkpoint])
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        peaks = {}
        for role in ("server", "worker0"):
            with open(os.path.join(out_dir, f"{role}.json")) as f:
                peaks[role] = json.load(f)["peak_rss_bytes"]
        return peaks


def slope(xs, ys) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv=None) -> int:
    from common import write_record

    from hvd_async import registry

    server_side = [name for name in registry.names() if registry.uses_servers(name, OPTIONS.get(name, {}))]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algos", default=",".join(server_side), help="comma-separated server-side algorithms")
    p.add_argument("--workers", default="2,4,8", help="comma-separated worker counts (one server each)")
    p.add_argument("--numel", type=int, default=4096 * 4096, help="float32s in the model")
    p.add_argument("--steps", type=int, default=6, help="steps each worker trains")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a job counts as hung")
    p.add_argument("--inbox-slots", type=int, default=None,
                   help="the mailbox algorithms' inbox slots per server (default: theirs)")
    p.add_argument("--shared-momentum", action="store_true",
                   help="one momentum buffer on the servers where that is an option (dc-asgd, lc-asgd, softsync)")
    p.add_argument("--checkpoint", default="none",
                   help="also measure taking the algorithm's state after training, each way given (comma-separated): "
                        "gathered (every shard sent to worker 0) or streamed (each server writes its own file); each "
                        "cell then gives the copies a checkpoint added to its peak")
    p.add_argument("--out", default=os.path.join(HERE, "results", "server_memory.json"), help="JSON path")
    p.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_job:
        rank_job(args.algos, args.numel, args.steps, args.out_dir, args.inbox_slots, args.shared_momentum,
                 args.checkpoint)
        return 0
    ways = [] if args.checkpoint == "none" else args.checkpoint.split(",")
    if any(way not in ("gathered", "streamed") for way in ways):
        p.error(f"--checkpoint {args.checkpoint}: give none, or gathered and/or streamed (comma-separated)")
    algos, counts = args.algos.split(","), [int(w) for w in args.workers.split(",")]
    unknown = [a for a in algos if a not in server_side]
    if unknown:
        p.error(f"--algos {','.join(unknown)}: not a server-side algorithm; choose from {', '.join(server_side)}")
    copy = 4 * args.numel
    rows = {}
    for algo in algos:
        cells = []
        for workers in counts:
            big = run_job(algo, workers, args.numel, args.steps, args.timeout, args.inbox_slots, args.shared_momentum)
            tiny = run_job(algo, workers, TINY, args.steps, args.timeout, args.inbox_slots, args.shared_momentum)
            copies = (big["server"] - tiny["server"]) / copy
            cells.append({"workers": workers, "server_peak_bytes": big["server"], "server_fixed_bytes": tiny["server"],
                          "server_copies": round(copies, 2),
                          "worker0_copies": round((big["worker0"] - tiny["worker0"]) / copy, 2)})
            print(f"{algo:10s} {workers} workers: server {copies:6.2f} copies of the model "
                  f"({big['server'] / 2**30:.2f} GiB peak), worker 0 {cells[-1]['worker0_copies']:.2f}", flush=True)
            for way in ways:  # the same job taking its state at the end: what that adds to each peak
                taken = run_job(algo, workers, args.numel, args.steps, args.timeout, args.inbox_slots,
                                args.shared_momentum, way)
                added = {role: round((taken[role] - big[role]) / copy, 2) for role in ("server", "worker0")}
                cells[-1].setdefault("checkpoint_added_copies", {})[way] = added
                print(f"{algo:10s} {workers} workers: a {way} checkpoint adds {added['server']:.2f} copies to the "
                      f"server's peak, {added['worker0']:.2f} to worker 0's", flush=True)
        per_worker = (slope([c["workers"] for c in cells], [c["server_copies"] for c in cells])
                      if len(cells) > 1 else None)
        rows[algo] = {"cells": cells, "copies_per_extra_worker": None if per_worker is None else round(per_worker, 2)}
        print(f"{algo:10s} copies per extra worker: {'-' if per_worker is None else f'{per_worker:.2f}'}", flush=True)
    write_record({"benchmark": "server_memory", "numel": args.numel, "copy_bytes": copy, "steps": args.steps,
                  "workers": counts, "servers": 1, "inbox_slots": args.inbox_slots,
                  "shared_momentum": args.shared_momentum, "checkpoint": ways, "algorithms": rows}, args.out)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

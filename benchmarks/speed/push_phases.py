"""push_phases: where a worker's dc-asgd push spends its time, call by call, with fp32 and fp16 on
the wire.

One server rank and ``--np - 1`` workers; each worker pushes (gradient up, new weights back) through
both transports in alternating blocks, as ``fp16_push.py`` does. The transport's MPI objects are
wrapped, in this process only, so that each call the worker makes is timed:

- ``put``: the gradient's ``Put`` into the server's inbox, and the ``Flush_all`` that waits until it
  has landed (across hosts, this is where a server that does not poll shows);
- ``request``: sending the request header (and posting the answer's receive);
- ``answer``: waiting for the server's answer (the server's step, from the request's arrival);
- ``weights``: the ``Get`` of the new weights and the ``Flush`` that waits for it;
- ``rest``: the remainder of the push (the fp16 rounding and widening, Python).

Printed and written per size and wire: the mean milliseconds per push of each part. ``--spin-yield``
sets ``ha.serve``'s ``spin_yield``. ``--slots`` sets the netns hosts' slots (1: every rank on a host
of its own). torch runs as many threads per rank as the training job gives it, unless ``--threads``.

    python benchmarks/speed/push_phases.py --mode netns --np 2 --slots 1
    python benchmarks/speed/push_phases.py --mode netns --np 2 --slots 1 --spin-yield on
"""
import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import (HERE, MODES, MODES_HELP, SPIN_YIELD, add_slots, add_spin_yield, dc_pushes, launch_mode,
                    parse_size, under_mpirun, use_slots, write_record)

PARTS = ("put", "request", "answer", "weights", "rest")
CALLS = {"inbox.Put": "put", "inbox.Flush_all": "put", "comm.Send": "request", "comm.Irecv": "request",
         "outbox.Get": "weights", "outbox.Flush": "weights"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="netns", help=MODES_HELP)
    p.add_argument("--np", type=int, default=2, help="MPI ranks: 1 server + np-1 workers")
    add_slots(p)
    p.add_argument("--sizes", default="4MB,16MB", help="comma-separated fp32 buffer sizes")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks (fp32, fp16) per size")
    p.add_argument("--pushes", type=int, default=5, help="pushes per block")
    add_spin_yield(p)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: as the training job sets them, its CPUs over the ranks on them)")
    p.add_argument("--out", default=None, help="JSON path (default: results/push_phases_<mode>.json)")
    args = p.parse_args(argv)
    try:
        args.size_bytes = [parse_size(s) for s in args.sizes.split(",")]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.np < 2 or args.slots < 1 or args.blocks < 1 or args.pushes < 1 or args.threads < 0:
        p.error(f"--np must be >= 2, --slots, --blocks, --pushes >= 1 and --threads >= 0, got {args.np}, "
                f"{args.slots}, {args.blocks}, {args.pushes}, {args.threads}")
    args.out = args.out or os.path.join(HERE, "results", f"push_phases_{args.mode}.json")
    return args


class _Timed:
    """``target`` with each method call's time added to ``spent[label.method]``."""

    def __init__(self, target, label, spent):
        self._target, self._label, self._spent = target, label, spent

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self._spent[f"{self._label}.{name}"] += time.perf_counter() - start
        return timed


class _TimedMPI:
    """The ``MPI`` module as the transport sees it, with ``Request.Waitall`` timed: in a push it waits
    for the answer. On an oversubscribed node the answer is waited for with ``Testall`` checks instead
    (the transport's polite wait): their time, and the sleeps between them, count as the answer's, and
    the answer's wait ends with the check that finds it."""

    def __init__(self, mpi, spent):
        self._mpi, self._spent = mpi, spent
        outer = self
        polling = []  # when the current run of Testall checks began

        class Request:
            @staticmethod
            def Waitall(requests, *args):
                start = time.perf_counter()
                try:
                    return mpi.Request.Waitall(requests, *args)
                finally:
                    outer._spent["answer"] += time.perf_counter() - start

            @staticmethod
            def Testall(requests, *args):
                if not polling:
                    polling.append(time.perf_counter())
                done = mpi.Request.Testall(requests, *args)
                if done:
                    outer._spent["answer"] += time.perf_counter() - polling.pop()
                return done
        self.Request = Request

    def __getattr__(self, name):
        return getattr(self._mpi, name)


def bench(args) -> int:
    import torch

    import hvd_async as ha

    ha.init(servers=1)
    threads = args.threads or ha.runtime.threads_per_rank()  # (as the job: every rank, servers too)
    torch.set_num_threads(threads)
    if ha.is_server():
        ha.serve(spin_yield=SPIN_YIELD[args.spin_yield])
        return 0
    workers = ha.worker_comm()
    rows = []
    for size in args.size_bytes:
        grad, out, header, transports = dc_pushes(size // 4)
        spent = {wire: defaultdict(float) for wire in transports}
        totals = {wire: [] for wire in transports}
        for wire, t in transports.items():
            t._MPI = _TimedMPI(t._MPI, spent[wire])
            t._win.inbox = _Timed(t._win.inbox, "inbox", spent[wire])
            t._win.outbox = _Timed(t._win.outbox, "outbox", spent[wire])
            t.comm = _Timed(t.comm, "comm", spent[wire])
        for block in range(args.blocks):
            for wire in (("fp32", "fp16") if block % 2 == 0 else ("fp16", "fp32")):
                start = time.perf_counter()
                for _ in range(args.pushes):
                    transports[wire].push(grad, out, header)
                totals[wire].append((time.perf_counter() - start) / args.pushes)
        pushes = args.blocks * args.pushes
        mine = {}
        for wire, calls in spent.items():
            parts = dict.fromkeys(PARTS, 0.0)
            for call, seconds in calls.items():
                parts[CALLS.get(call, call)] += seconds
            parts = {part: 1e3 * seconds / pushes for part, seconds in parts.items()}
            parts["rest"] = 1e3 * statistics.mean(totals[wire]) - sum(parts.values())
            mine[wire] = {"push_ms_mean": 1e3 * statistics.mean(totals[wire]),
                          "push_ms_median_block": 1e3 * statistics.median(totals[wire]), "parts_ms": parts}
        workers.Barrier()
        for t in transports.values():
            t.close()
        everyone = workers.gather(mine, root=0)
        if ha.rank() == 0:
            row = {"bytes_fp32": size, "pushes_per_worker": pushes, "workers": everyone}
            rows.append(row)
            for wire in ("fp32", "fp16"):
                first = everyone[0][wire]
                print(f"{size >> 20:4d}MB {wire}: push {first['push_ms_mean']:8.2f} ms = "
                      + "  ".join(f"{p} {first['parts_ms'][p]:.2f}" for p in PARTS) + "  (worker 0)", flush=True)
    if ha.rank() == 0:
        write_record({"benchmark": "push_phases", "mode": args.mode, "np": workers.size + 1,
                      "slots_per_host": args.slots if args.mode == "netns" else None, "algorithm": "dc-asgd",
                      "server_spin_yield": args.spin_yield, "torch_threads": threads,
                      "parts": {p: PART_HELP[p] for p in PARTS}, "rows": rows}, args.out)
        print(f"written {args.out}")
    return 0


PART_HELP = {"put": "the gradient's Put and the Flush_all until it landed",
             "request": "sending the request header, posting the answer's receive",
             "answer": "waiting for the server's answer (its step)",
             "weights": "the Get of the new weights and its Flush",
             "rest": "the remainder (fp16 rounding and widening, Python)"}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not under_mpirun():
        use_slots(args)
        return launch_mode(__file__, args.np, args.mode)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

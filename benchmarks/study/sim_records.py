"""sim_records: the simulator's metrics record of each algorithm at one setting, to compare two versions
of the library run for run (a change to the simulator or to a transport it runs).

Runs ``hvd-async simulate`` in-process for every algorithm the simulator runs, with the given flags,
and writes one JSON of the records. The library is whichever ``hvd_async`` Python imports (put an
older checkout first on ``PYTHONPATH`` to record it): the record names it and its commit
(``simjobs.library_info``) beside this script's own provenance.

    python benchmarks/study/sim_records.py --latency-ms 0 --out runs/sim-new.json
    PYTHONPATH=/tmp/old python benchmarks/study/sim_records.py --latency-ms 0 --out runs/sim-old.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import write_record
from simjobs import library_info

ALGORITHMS = ("asgd", "dc-asgd", "lc-asgd", "softsync", "dbs-asgd", "easgd", "gossip", "ssgd")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--latency-ms", default="0", help="the simulator's --latency-ms")
    p.add_argument("--workers", default="3", help="the simulator's --workers")
    p.add_argument("--epochs", default="1", help="the simulator's --epochs")
    p.add_argument("--delay-dist", default="lognormal", help="the simulator's --delay-dist")
    p.add_argument("--out", required=True, help="JSON path")
    args = p.parse_args(argv)
    from hvd_async.sim import simulate

    records = {}
    for algo in ALGORITHMS:
        print(f"{algo} ...", flush=True)
        records[algo] = simulate(["--algo", algo, "--workers", args.workers, "--epochs", args.epochs,
                                  "--delay-dist", args.delay_dist, "--latency-ms", args.latency_ms])
    write_record({"library": library_info(), "settings": vars(args), "records": records}, args.out,
                 command=" ".join([sys.executable, *sys.argv]))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""predictor_cost: microseconds per observe and per predict of lc-asgd's loss predictors (the servers
pay them on every push), at a full window of 32 reports, with torch single-threaded and with its
default thread count. Prints the figures; writes nothing (a figure to quote would need a record:
add --out if one is ever quoted).

    python benchmarks/speed/predictor_cost.py
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT

sys.path.insert(0, ROOT)
from hvd_async.rules.loss_prediction import PREDICTORS, make_predictor  # noqa: E402


def noisy_curve(versions: int, seed: int = 0, noise: float = 0.07):
    """A decaying loss, 2 exp(-0.01 v) + 0.3, with multiplicative log-normal noise."""
    v = np.arange(versions)
    clean = 2.0 * np.exp(-0.01 * v) + 0.3
    return clean * np.exp(noise * np.random.default_rng(seed).standard_normal(versions))


def measure(name: str, threads: int, calls: int, window: int = 32):
    torch.set_num_threads(threads)
    observed = noisy_curve(200 + calls)
    predictor = make_predictor(name, window=window)
    for v in range(200):  # warm: full window, past the mlp's warm-up
        predictor.observe(v, float(observed[v]))
    observe_us, predict_us = [], []
    for v in range(200, 200 + calls):
        start = time.perf_counter()
        predictor.observe(v, float(observed[v]))
        middle = time.perf_counter()
        predictor.predict(v + 8)
        end = time.perf_counter()
        observe_us.append(1e6 * (middle - start))
        predict_us.append(1e6 * (end - middle))
    return observe_us, predict_us


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--calls", type=int, default=1000, help="observe + predict pairs timed per predictor")
    args = p.parse_args(argv)
    default_threads = torch.get_num_threads()
    for name in sorted(PREDICTORS):
        for threads in sorted({1, default_threads}):
            for what, values in zip(("observe", "predict"), measure(name, threads, args.calls)):
                q = statistics.quantiles(values, n=10)
                print(f"{name} {what}, torch threads {threads}: median {statistics.median(values):.1f} us "
                      f"(p10 {q[0]:.1f}, p90 {q[-1]:.1f}; {len(values)} calls, window 32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

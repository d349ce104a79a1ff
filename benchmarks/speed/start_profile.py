"""start_profile: where each rank of the main job spends the seconds before its first training step.

Runs the Makefile's main job (``hvd-async train``'s job, ``--np 4``, one epoch) under mpirun with
every rank's process profiled (cProfile) from its first line of Python, and reads out per rank the
seconds of the start's parts:

- ``python_start``: from the launch to this rank's first line of Python (mpirun, the interpreter);
- ``import_torch``: ``import torch``;
- ``import_package``: ``import hvd_async.job.train`` once torch is in (the package's own modules);
- ``parse_and_check``: the options parsed and checked on the rank;
- ``mpi_and_horovod_init``: ``hvd_async.init`` (MPI, Horovod's start, the roles);
- ``data``: the data set on every rank (digits: read on worker 0, broadcast: the others wait);
- ``model``: the model built and broadcast;
- ``first_optimizer``: ``torch.optim.SGD(...)``: PyTorch imports ``torch._dynamo`` at the first
  optimizer of a process;
- ``wrap``: the package's ``DistributedOptimizer`` and its ``begin()``;
- ``to_first_step``: the job's own seconds from the launch to worker 0's first step.

The profiler slows Python; the parts are for where the time goes, ``setup_time.py --job-only``'s
record for how long it takes.

    python benchmarks/speed/start_profile.py [--out benchmarks/results/start_profile.json]
"""
import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import ROOT, write_record  # noqa: E402

JOB = ["--np", "4", "--epochs", "1"]  # the Makefile's main job (hvd-async train --np 4), one epoch
LAUNCHED = "START_PROFILE_LAUNCHED_AT"

# part -> (file ending, function) whose cumulative time in the rank's profile is that part
PARTS = {
    "parse_and_check": ("hvd_async/job/config.py", "validate"),
    "mpi_and_horovod_init": ("hvd_async/runtime.py", "init"),
    "data": ("hvd_async/data.py", "load_dataset_on"),
    "model": ("hvd_async/models.py", "build_model"),
    "first_optimizer": ("hvd_async/job/train.py", "job_sgd"),
    "wrap": ("hvd_async/wrapping.py", "wrap"),
    "build": ("hvd_async/job/train.py", "_build"),
}


def rank_main(out_dir: str, job_argv) -> None:
    """One rank: its start timed, then the job under the profiler; the parts written to ``out_dir``."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    parts = {"python_start": time.time() - float(os.environ[LAUNCHED])}
    began = time.perf_counter()
    import torch  # noqa: F401
    parts["import_torch"] = time.perf_counter() - began
    began = time.perf_counter()
    from hvd_async.job import train
    from hvd_async.job.job_process import exit_process
    parts["import_package"] = time.perf_counter() - began
    profile = cProfile.Profile()
    profile.enable()
    code = train.main(job_argv)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for part, (ending, function) in PARTS.items():
        found = [v[3] for (path, _, name), v in stats.items() if path.endswith(ending) and name == function]
        if not found:  # renamed or moved: say so rather than record a part of 0 s
            sys.exit(f"start_profile: error: no call of {function}() in {ending} in rank {rank}'s profile; "
                     f"update PARTS in {__file__}")
        parts[part] = sum(found)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(parts, f)
    exit_process(code)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "start_profile.json"))
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)  # (set by the launch below: a rank's run)
    args, job_argv = parser.parse_known_args(argv)
    if args.rank_out:
        rank_main(args.rank_out, job_argv)
        return 0
    with tempfile.TemporaryDirectory(prefix="hvd-start-profile-") as work:
        metrics = os.path.join(work, "metrics.json")
        launched = time.time()
        env = dict(os.environ, **{LAUNCHED: repr(launched), "HVD_ASYNC_LAUNCHED_AT": repr(launched)})
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", "-x", LAUNCHED, "-x",
               "HVD_ASYNC_LAUNCHED_AT", sys.executable, os.path.abspath(__file__), "--rank-out", work, *JOB,
               "--metrics-out", metrics]
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        if done.returncode != 0:
            sys.exit(f"start_profile: error: the job exited with status {done.returncode}:\n{done.stdout[-3000:]}")
        ranks = {}
        for name in sorted(os.listdir(work)):
            if name.startswith("rank"):
                with open(os.path.join(work, name)) as f:
                    ranks[name[4:-5]] = {k: round(v, 3) for k, v in json.load(f).items()}
        with open(metrics) as f:
            to_first_step = json.load(f)["seconds_to_first_step"]
    summary = {
        "benchmark": "start_profile",
        "what": ("the main job (hvd-async train " + " ".join(JOB) + ") with each rank profiled by cProfile: "
                 "seconds of each part of its start (see the script's docstring); the profiler slows Python"),
        "job": JOB,
        "to_first_step": to_first_step,
        "ranks": ranks,
    }
    write_record(summary, args.out, command="python benchmarks/speed/start_profile.py")
    width = max(len(k) for k in next(iter(ranks.values())))
    print(f"{'part':<{width}}  " + "  ".join(f"rank {r:>3}" for r in ranks))
    for part in next(iter(ranks.values())):
        print(f"{part:<{width}}  " + "  ".join(f"{ranks[r][part]:8.3f}" for r in ranks))
    print(f"worker 0's first step {to_first_step} s after the launch (profiled); written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``hvd-async`` command: ``train`` launches the reference job over mpirun; ``simulate`` runs it on a
virtual clock in one process (:mod:`hvd_async.sim`); ``algorithms`` lists the registry; ``doctor``
checks the installation (:mod:`hvd_async.job.doctor`)."""
import argparse
import os
import signal
import sys
import time
from typing import Callable, List, Optional, cast

from .. import registry
from . import launcher

# (config imports torch, through the algorithms' options: each command imports it when it starts, after
# the first line a terminal shows)


def _algorithms(argv: List[str]) -> int:
    from . import config

    try:
        config.load_plugins(argv)
    except config.ConfigError as exc:
        print(f"hvd-async algorithms: error: {exc}", file=sys.stderr)
        return 2
    width = max(map(len, registry.names()))
    for row in registry.ALGORITHMS.values():
        server = "server" if row.uses_servers else "      "
        origin = f"  (plugin: {row.plugin})" if row.plugin else ""
        print(f"{row.name:<{width}}  {server}  {row.summary}{origin}")
    return 0


def _pending(text: str) -> Callable[[], None]:
    """On a terminal, ``text`` at once and without its newline, for the seconds before the next line;
    returns what erases it (elsewhere, in a log, nothing is shown and nothing erased)."""
    if not sys.stderr.isatty():
        return lambda: None
    sys.stderr.write(text)
    sys.stderr.flush()
    return lambda: print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def _train(argv: List[str]) -> int:
    done_checking = _pending("hvd-async train: checking the options (importing torch takes a few seconds) ...")
    from . import config

    try:
        args = config.parse(argv, launcher=True)
        spec = config.validate(args)
        launch = config.launch_options(args, spec)
    except config.ConfigError as exc:
        done_checking()
        print(f"hvd-async train: error: {exc}", file=sys.stderr)
        return 2
    done_checking()
    from .. import checkpoint  # (imports torch: not for --help)

    job = spec.job
    if job.resume:  # refused here, before mpirun starts every rank, rather than by the job
        from .jobstate import load_newest

        try:
            load_newest(cast(str, job.checkpoint_dir), spec.meta(), mmap=True)  # (--resume needs the folder)
        except checkpoint.CheckpointError as exc:
            print(f"hvd-async train: error: {exc}", file=sys.stderr)
            return 2

    job_argv = _launcher_only_removed(argv, ("--mpi-args", "--max-restarts"))
    if "--np" not in job_argv and not any(a.startswith("--np=") for a in job_argv):
        job_argv += ["--np", str(spec.layout.world_size)]
    if sys.stderr.isatty() and job.progress == "auto":  # ranks' output is piped: tell them
        os.environ["HVD_ASYNC_PROGRESS"] = "1"
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(f"hvd-async train: {_starting(spec)}", file=sys.stderr, flush=True)  # the ranks take seconds to start
    restarts = 0
    while True:
        run_argv = list(job_argv)
        # (a restart needs --max-restarts, which needs --checkpoint-dir)
        if restarts and not job.resume and checkpoint.latest(cast(str, job.checkpoint_dir)):
            run_argv.append("--resume")
        os.environ[launcher.LAUNCHED_AT] = repr(time.time())  # before mpirun_command, which forwards it
        try:
            cmd = launcher.mpirun_command(cast(int, spec.layout.world_size),  # (the launcher's --np has a default)
                                          launcher.python_module("hvd_async.job.train", run_argv), mpi_args=launch.mpi_args)
        except FileNotFoundError as exc:
            print(f"hvd-async train: error: {exc}", file=sys.stderr)
            return 2
        started = time.monotonic()
        code, interrupted = launcher.run(cmd)
        if interrupted:  # a cancel is not a crash: never restarted
            print(f"hvd-async train: interrupted ({interrupted}) after {time.monotonic() - started:.0f} s; "
                  f"not restarted", file=sys.stderr)
            return code if code > 128 else 128 + signal.SIGINT
        if code in FINAL_EXIT_CODES:
            return code
        why = _failure(code, time.monotonic() - started)
        if restarts >= launch.max_restarts:
            hint = (f"; --max-restarts {launch.max_restarts} used up" if launch.max_restarts else
                    "; with --checkpoint-dir and --max-restarts K it is relaunched from the newest checkpoint")
            print(f"hvd-async train: error: {why}{hint}", file=sys.stderr)
            return code
        restarts += 1
        newest = checkpoint.latest(cast(str, job.checkpoint_dir))
        print(f"hvd-async train: {why}; restart {restarts} of {launch.max_restarts} from "
              f"{newest or 'the start (no checkpoint was written yet)'}", file=sys.stderr, flush=True)


def _starting(spec) -> str:
    """The first line on the screen: what starts, on how many processes."""
    layout, job = spec.layout, spec.job
    servers = f" + {layout.servers} server(s)" if layout.servers else ""
    return (f"starting {spec.algo} on {job.dataset} ({job.model}), {job.epochs} epoch(s): {layout.workers} "
            f"worker(s){servers}, {layout.world_size} MPI processes (importing torch and starting Horovod "
            f"takes some seconds)")


# exit codes of the job that a restart would not change: done, bad input, stopped on a non-finite
# streak, done without a stalled worker (--worker-timeout), Ctrl-C
FINAL_EXIT_CODES = (0, 2, 3, 4, 130)


def _failure(code: int, seconds: float) -> str:
    """The launcher's line on a failed job (the job or mpirun said above what went wrong)."""
    what = f"exit status {code}"
    if code > 128 and code - 128 in signal.valid_signals():
        what += (f": a process was killed by {signal.Signals(code - 128).name}; mpirun names its rank above "
                 f"(ranks count the servers first: world rank r >= servers is worker r - servers)")
    elif code == 5:
        what += ": a worker stopped making progress (--worker-timeout; named above)"
    else:
        what += "; the error is above"
    return f"the job failed after {seconds:.0f} s ({what})"


def _launcher_only_removed(argv: List[str], options) -> List[str]:
    """``argv`` less the options only the launcher reads (``--opt VALUE`` and ``--opt=VALUE``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not any(arg.startswith(option + "=") for option in options):
            out.append(arg)
    return out


def _doctor(argv: List[str]) -> int:
    from . import doctor

    return doctor.main(argv)


def _simulate(argv: List[str]) -> int:
    from .. import sim

    return sim.main(argv)


COMMANDS = {
    "train": (_train, "launch the reference training job on --np MPI processes (see 'hvd-async train --help')"),
    "simulate": (_simulate, "simulate the job with N workers on a virtual clock, deterministically "
                            "(see 'hvd-async simulate --help')"),
    "algorithms": (_algorithms, "list the algorithms of the registry: which use parameter servers, what each does"),
    "doctor": (_doctor, "check what a job needs here: MPI windows, Horovod's build, GPUs, /dev/shm, each "
                        "with its fix"),
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog="hvd-async", description="Asynchronous and semi-synchronous SGD for PyTorch on Horovod and MPI.",
        epilog="commands:\n" + "\n".join(f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND", help="one of: "
                     + ", ".join(COMMANDS))
    top.add_argument("args", nargs=argparse.REMAINDER, help="the command's options")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"hvd-async: error: unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    command = COMMANDS[argv[0]][0]
    if argv[0] in ("train", "simulate", "algorithms") and any(a in ("-h", "--help") for a in argv[1:]):
        from . import config

        try:
            config.load_plugins(argv[1:])  # their algorithms' flags are part of the help
        except config.ConfigError as exc:
            print(f"hvd-async {argv[0]}: error: {exc}", file=sys.stderr)
            return 2
        if argv[0] == "train":
            config.build_parser(launcher=True).print_help()
        elif argv[0] == "simulate":
            from ..sim.options import build_parser

            build_parser().print_help()
        else:
            print("usage: hvd-async algorithms [--plugin MODULE ...]\n\nList the registry's algorithms "
                  "(with those the --plugin modules register).")
        return 0
    return command(argv[1:])


def run() -> None:
    """The ``hvd-async`` command: :func:`main`, then the process ends. After a command that succeeded
    (its output flushed, its files closed) without the interpreter's teardown, which frees torch's
    modules one by one (most of a second, more than many commands take); otherwise the normal exit."""
    code = main()
    if code != 0:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run()

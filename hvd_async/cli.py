"""The ``hvd-async`` command: ``train`` launches the reference job over mpirun; ``algorithms`` lists the registry."""
import argparse
import os
import sys
from typing import List, Optional

from . import config, launcher, registry


def _algorithms(_argv: List[str]) -> int:
    width = max(map(len, registry.NAMES))
    for row in registry.ALGORITHMS.values():
        status = "built" if row.built else "planned"
        server = "server" if row.uses_servers else "      "
        print(f"{row.name:<{width}}  {status:<7}  {server}  {row.summary}")
    return 0


def _train(argv: List[str]) -> int:
    try:
        args = config.validate(config.parse(argv, launcher=True))
    except config.ConfigError as exc:
        print(f"hvd-async train: error: {exc}", file=sys.stderr)
        return 2
    job_argv = list(argv)
    if "--mpi-args" in job_argv:  # launcher-only option: not for the job
        i = job_argv.index("--mpi-args")
        del job_argv[i:i + 2]
    job_argv = [a for a in job_argv if not a.startswith("--mpi-args=")]
    if "--np" not in job_argv and not any(a.startswith("--np=") for a in job_argv):
        job_argv += ["--np", str(args.np)]
    if sys.stderr.isatty() and args.progress == "auto":  # ranks' output is piped: tell them
        os.environ["HVD_ASYNC_PROGRESS"] = "1"
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        cmd = launcher.mpirun_command(args.np, launcher.python_module("hvd_async.train", job_argv),
                                      mpi_args=args.mpi_args)
    except FileNotFoundError as exc:
        print(f"hvd-async train: error: {exc}", file=sys.stderr)
        return 2
    return launcher.run(cmd)


COMMANDS = {
    "train": (_train, "launch the reference training job on --np MPI processes (see 'hvd-async train --help')"),
    "algorithms": (_algorithms, "list the algorithms of the registry and which are built"),
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
    if argv[0] == "train" and any(a in ("-h", "--help") for a in argv[1:]):
        config.build_parser(launcher=True).print_help()
        return 0
    return command(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

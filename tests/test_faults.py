"""The fast part of the fault matrix (the whole: ``make faults``, benchmarks/faults/faults.py): one worker
leaving a job early, in the ways that used to hang (``sys.exit(0)``, ``opt.close()`` in a ``finally``,
a DataError on that worker alone), ends the whole job within seconds, with a non-zero exit status and
a line naming it; and frozen parameters stay bit for bit under every algorithm."""
import os
import re
import sys

import pytest

from hvd_async import registry
from procs import mpirun, python, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "faults"))
import faults  # noqa: E402  (benchmarks/faults/faults.py: the matrix's cell runner)

SERVERLESS = registry.serverless()


@pytest.mark.parametrize("algo,fault,shm", [
    ("asgd", "exit0", True), ("asgd", "close", False), ("dc-asgd", "close", True),
    ("softsync", "exit0", False), ("gossip", "exit0", True), ("gossip", "close", False),
    ("easgd", "close", True), ("ssgd", "exit0", True), ("asgd", "data-error", True),
])
def test_one_worker_leaving_ends_the_job(algo, fault, shm):
    cell = faults.run_cell(algo, fault, shm, hang=150, limit=30)
    assert not cell["hang"], (f"{algo} {fault}: the job hung; still there when it was killed:\n"
                              + "\n".join(cell.get("alive_at_hang", [])) + f"\n{cell.get('output_tail', '')}")
    assert cell["exit_status"] != 0, cell
    assert cell["named"], f"no line names the leaving worker:\n{cell.get('output_tail', '')}"
    assert not cell["left_processes"], cell
    assert cell["seconds_after_fault"] <= 30, cell


def test_the_line_naming_the_worker_is_the_last_thing_on_stderr():
    """The data-error cell launched as ``hvd-async train`` launches a job (launcher.mpirun_command and
    launcher.run, whose relay drops what Open MPI prints that only repeats the failure): the job's line
    naming the worker is the last line on stderr, with none of Open MPI's below it (neither the MPI_ABORT
    banner nor mpirun's "ORTE_ERROR_LOG ... show_help.c" where that banner reached it cut short)."""
    env = {"ALGO": "asgd", "FAULT": "data-error", "SERVERS": "1", "LEAVER": str(faults.LEAVER)}
    launch = ("import os, sys; from hvd_async.job import launcher; "
              "os.dup2(os.open(os.devnull, os.O_WRONLY), 1); "  # the ranks' stdout: only stderr is kept
              "cmd = launcher.mpirun_command(int(sys.argv[1]), [sys.executable, sys.argv[2]], env=sys.argv[3:]); "
              "sys.exit(launcher.run(cmd).code)")
    result = run(python("-c", launch, str(faults.WORKERS + 1), faults.JOB, *env), env=env, timeout=120)
    assert result.returncode == 2, result  # the job's bad-input status
    lines = [line for line in result.out.splitlines() if line.strip()]
    assert lines and re.search(faults.NAMES["data-error"], lines[-1]), result.out[-3000:]
    assert "ORTE_ERROR_LOG" not in result.out and "MPI_ABORT" not in result.out, result.out[-3000:]


@pytest.mark.parametrize("algo", registry.NAMES)
def test_a_frozen_layer_stays_bit_for_bit(algo):
    """torch.optim.SGD with momentum and weight decay over a model whose first layer does not require
    grad: that layer is neither stepped nor exchanged (as under torch and Horovod); the head trains."""
    servers = 0 if algo in SERVERLESS else 1
    env = {"ALGO": algo, "SERVERS": str(servers)}
    result = mpirun(2 + servers, [sys.executable, "tests/mpi/frozen_job.py"], env=env, timeout=180)
    assert result.returncode == 0, result
    lines = [line for line in result.out.splitlines() if line.startswith("WORKER")]
    assert len(lines) == 2, result
    for line in lines:
        assert "frozen_same=True" in line and "head_moved=True" in line, line
        # opt.state_dict() alone would not resume the servers' state: said once, where there is any
        warned = not registry.algorithm(algo).runs_user_optimizer  # its rule's state is on the servers
        assert f"state_warnings={int(warned)}" in line, line

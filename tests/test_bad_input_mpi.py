"""Bad input under mpirun, rows of docs/bad-input.md that need MPI: workers whose models differ,
--servers >= ranks under plain mpirun, a bad keyword that reaches a real transport and a corrupt
checkpoint under --resume. procs.run fails on a hang and on any process left behind."""
import os
import re

import pytest

from procs import mpirun, python, run


DIFFERENT_MODELS = """
import sys

import torch
import hvd_async as ha

ha.init()
rank = ha.rank()
cases = {"ssgd": [(2, 3)] if rank == 0 else [(3, 3)],      # a shape differs
         "gossip": [(2, 3)] if rank == 0 else [(2, 3), (3,)],  # a parameter more
         "hpsgd": [(2, 3)]}                                  # a dtype differs
for algorithm, shapes in cases.items():
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64 if algorithm == "hpsgd" and rank else None))
              for s in shapes]
    try:
        ha.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), algorithm=algorithm,
                                named_parameters=[(f"layer{i}.weight", p) for i, p in enumerate(params)])
    except ValueError as exc:
        # one write per line: print() writes the text and the newline apart, and mpirun can then
        # interleave the two workers' lines
        sys.stdout.write(f"REFUSED {algorithm} on worker {rank}: {exc}\\n")
        sys.stdout.flush()
"""


def _error_lines(out):
    return [line for line in out.splitlines() if "error:" in line]


def test_workers_whose_models_differ_are_refused_on_every_worker():
    result = mpirun(2, python("-c", DIFFERENT_MODELS), timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.out, result.out[-3000:]
    for algorithm, fragment in (
            ("ssgd", "parameter #0 is 'layer0.weight' (2, 3) torch.float32 on worker 0 but 'layer0.weight' (3, 3) "
                     "torch.float32 on worker 1; every worker must build the same model"),
            ("gossip", "worker 0 has 1 parameters, worker 1 has 2; every worker must build the same model"),
            ("hpsgd", "(2, 3) torch.float32 on worker 0 but 'layer0.weight' (2, 3) torch.float64 on worker 1")):
        lines = [line for line in result.out.splitlines() if line.startswith(f"REFUSED {algorithm} ")]
        assert len(lines) == 2 and all(fragment in line for line in lines), result.out[-3000:]


def test_servers_at_least_ranks_under_plain_mpirun():
    result = mpirun(2, python("-m", "hvd_async.job.train", "--algo", "asgd", "--servers", "2"), timeout=120)
    assert result.returncode == 2, result.out[-3000:]
    assert _error_lines(result.out) == ["hvd_async.job.train: error: --servers 2 leaves no worker: --np 2 counts every "
                                        "MPI process, servers included; use --servers < 2 or a larger --np"], result.out
    assert "Traceback" not in result.out


UNCAUGHT_KEYWORD = """
import torch
import hvd_async as ha

ha.init(servers=1)
if ha.is_server():
    ha.serve()
else:
    p = torch.nn.Parameter(torch.zeros(3))
    ha.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], algorithm="softsync", n=3)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_bad_keyword_reaching_a_real_transport_ends_every_rank_with_one_line(tmp_path, debug):
    """softsync's n is checked against the worker count when its windows are made: the uncaught
    error ends both workers, and the server ends too. Both workers raise it; it is said once, in one
    line naming the script's call, without a traceback (with HVD_ASYNC_DEBUG=1: the traceback too).
    Each rank's stderr is read from its own file (--output-filename)."""
    result = mpirun(3, python("-c", UNCAUGHT_KEYWORD), timeout=120, env={"HVD_ASYNC_DEBUG": "1"} if debug else None,
                    mpi_args=["--output-filename", str(tmp_path)])
    assert result.returncode != 0
    message = "ValueError: n must be between 1 and the number of workers (2), got 3"
    stderr = {path.parent.name: path.read_text() for path in tmp_path.glob("*/rank.*/stderr")}
    said = "".join(stderr.values())
    if debug:
        assert said.count(message) >= 1 and "Traceback" in said, stderr
        return
    lines = [line for line in said.splitlines() if message in line]
    assert len(lines) == 1 and "Traceback" not in said, stderr
    assert re.fullmatch(r"hvd_async: error: worker [01]: " + re.escape(message) +
                        r" \(the call at <string>:10; HVD_ASYNC_DEBUG=1 prints the traceback\)", lines[0]), lines


def test_an_error_init_raises_is_one_line(tmp_path):
    """ha.init(servers=2) in a job of 2 processes: every rank raises alike; it is said once, in one line
    naming the script's call, without a traceback, and the job ends. The same for a launch init refuses
    in a process alone (horovodrun without --mpi), which just ends with status 1."""
    script = "import hvd_async as ha\n\nha.init(servers=2)\n"
    result = mpirun(2, python("-c", script), timeout=120, mpi_args=["--output-filename", str(tmp_path)])
    assert result.returncode != 0
    said = "".join(path.read_text() for path in tmp_path.glob("*/rank.*/stderr"))
    message = "ValueError: servers=2 leaves no worker: the job has 2 MPI process(es) in all"
    lines = [line for line in said.splitlines() if message in line]
    assert len(lines) == 1 and "Traceback" not in said, said
    assert re.fullmatch(r"hvd_async: error: rank [01]: " + re.escape(message) + r".* \(the call at <string>:3; "
                        r"HVD_ASYNC_DEBUG=1 prints the traceback\)", lines[0]), lines
    alone = run(python("-c", "import hvd_async as ha; ha.init()"), timeout=60, env={"HOROVOD_SIZE": "3"})
    assert alone.returncode == 1 and "Traceback" not in alone.out, alone.out
    (line,) = [line for line in alone.out.splitlines() if line.strip()]
    assert line.startswith("hvd_async: error: rank 0: RuntimeError: this process sees 1 MPI process(es) but "
                           "horovodrun started 3"), line


IDLE_SERVERS = """
import sys

import torch
import hvd_async as ha

ha.init(servers=1, serve=True)  # an asgd script run with algorithm='ssgd'
p = torch.nn.Parameter(torch.zeros(3))
for algorithm in ("ssgd", "hpsgd", "asgd", "ssgd"):  # once asgd has used the servers, ssgd may follow it
    try:
        opt = ha.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], algorithm=algorithm)
        opt.close()
        sys.stdout.write(f"BUILT {algorithm} on worker {ha.rank()}\\n")
    except RuntimeError as exc:
        sys.stdout.write(f"REFUSED {algorithm} on worker {ha.rank()}: {exc}\\n")
    sys.stdout.flush()
"""


def test_an_algorithm_without_servers_in_a_job_with_idle_servers_is_refused():
    """ha.init(servers=1) and algorithm='ssgd' (or hpsgd): the server rank would sit idle while two
    train; refused on every worker, where the command line refuses --servers 1 with ssgd alike."""
    result = mpirun(3, python("-c", IDLE_SERVERS), timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.out, result.out[-3000:]
    lines = sorted(line for line in result.out.splitlines() if line.startswith(("BUILT", "REFUSED")))
    said = ("uses no parameter server, but hvd_async.init(servers=1) set 1 of the job's 3 processes aside as "
            "servers: they would sit idle while 2 train; call hvd_async.init(servers=0) so that every process trains")
    assert [line.split(":")[0] for line in lines] == [
        "BUILT asgd on worker 0", "BUILT asgd on worker 1", "BUILT ssgd on worker 0", "BUILT ssgd on worker 1",
        "REFUSED hpsgd on worker 0", "REFUSED hpsgd on worker 1", "REFUSED ssgd on worker 0",
        "REFUSED ssgd on worker 1"], result.out[-3000:]
    assert all(said in line for line in lines if line.startswith("REFUSED")), lines


def test_corrupt_checkpoint_under_resume(tmp_path):
    path = str(tmp_path / "ckpt-12.pt")
    with open(path, "wb") as out:
        out.write(os.urandom(512))
    # the job's own check (the launcher refuses before mpirun: tests/test_checkpoint_resume.py)
    result = mpirun(2, python("-m", "hvd_async.job.train", "--np", "2", "--epochs", "2", "--checkpoint-dir",
                              str(tmp_path), "--resume"), timeout=120)
    assert result.returncode == 2, result.out[-3000:]
    lines = _error_lines(result.out)
    assert len(lines) == 1 and lines[0].startswith(f"hvd_async.job.train: error: checkpoint {path} is truncated, "
                                                   f"corrupt or not a torch file ("), result.out[-3000:]
    assert lines[0].endswith("); use an older checkpoint or start without --resume") and "Traceback" not in result.out

"""The drop-in promise under mpirun: Horovod's calls and options against hvd_async's optimizer for every
algorithm (tests/mpi/dropin_checks.py) at 2 and 3 workers, 1 and 2 server shards, shared memory on
and off; a Horovod script with three changed lines; a fault on a server ends the job at once."""
import re
import time

import pytest

from procs import mpirun, python

CHECKS = ("DROPIN CHECKS OK broadcast rank0_load clipping_and_accumulation step_after_synchronize_warns "
          "options fp16_through_the_windows fp16_overflow_skips_the_whole_push sparse_embeddings "
          "names_and_requires_grad lr_annealed_to_zero schedulers_see_the_step")


@pytest.mark.parametrize("np,servers,no_shm", [(3, 1, False), (5, 2, True), (2, 0, False)])
def test_horovod_idioms_under_every_algorithm(np, servers, no_shm):
    result = mpirun(np, python("tests/mpi/dropin_checks.py"), no_shm=no_shm, env={"SERVERS": str(servers)},
                    timeout=420)
    assert result.returncode == 0, result.out[-6000:]
    assert CHECKS in result.out, result.out[-3000:]


def test_a_torch_lr_scheduler_sees_every_algorithms_step():
    """Under every algorithm of the registry (2 workers and a server: the server-side rules first, then
    the others), a scheduler on opt.optimizer or on opt warns nothing about its order."""
    result = mpirun(3, python("tests/mpi/dropin_checks.py", "schedulers_see_the_step"), env={"SERVERS": "1"},
                    timeout=240)
    assert result.returncode == 0, result.out[-6000:]
    assert "DROPIN CHECKS OK schedulers_see_the_step" in result.out, result.out[-3000:]


@pytest.mark.parametrize("np", [3, 4])
def test_a_horovod_script_with_three_changed_lines(np):
    result = mpirun(np, python("tests/mpi/serve_job.py"), timeout=120)
    assert result.returncode == 0, result.out[-4000:]
    done = re.findall(r"WORKER (\d) of (\d) DONE finite=True", result.out)
    assert sorted(done) == [(str(r), str(np - 1)) for r in range(np - 1)], result.out[-3000:]


def test_an_exception_on_a_server_ends_the_job_at_once():
    start = time.monotonic()
    result = mpirun(3, python("tests/mpi/serve_job.py"), env={"FAULT": "1"}, timeout=90)
    took = time.monotonic() - start
    assert result.returncode != 0, result.out[-3000:]
    assert ("hvd_async: server 0 (world rank 0) failed, ending the job: RuntimeError: injected fault in the "
            "server program") in result.out, result.out[-3000:]
    assert "WORKER" not in result.out, "the workers finished although the server failed"
    assert took < 30, f"the job took {took:.0f} s to end after the server's fault"


def test_ssgd_over_a_process_set_is_horovods():
    """ssgd passes Horovod's process_set through: two of three workers train over their set, bit for
    bit as Horovod's optimizer over it; the third alone; gossip refuses a set in one line."""
    result = mpirun(3, python("tests/mpi/process_set_job.py"), env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}, timeout=120)
    assert result.returncode == 0, result.out[-4000:]
    assert sorted(re.findall(r"PROCESS SET OK worker (\d)", result.out)) == ["0", "1", "2"], result.out[-3000:]


def test_ssgd_over_a_process_set_this_worker_is_not_in_steps_locally():
    """As Horovod's test_optimizer_process_sets: both workers build the optimizer over the set {0}; worker 1,
    outside it, steps locally and exchanges nothing, as Horovod's optimizer there; the job ends cleanly."""
    result = mpirun(2, python("tests/mpi/process_set_job.py"), env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}, timeout=120)
    assert result.returncode == 0, result.out[-4000:]
    found = sorted(re.findall(r"OUTSIDE THE SET OK worker (\d) member=(\w+)", result.out))
    assert found == [("0", "True"), ("1", "False")], result.out[-3000:]

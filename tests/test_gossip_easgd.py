"""gossip and easgd under mpirun (tests/mpi/gossip_checks.py): gossip with every rank a worker at 1 to 4
workers, easgd with one server and 2 to 4 workers; shared memory on and off (both at 4 workers; one
mode per smaller size, to keep the file near two minutes on two cores: each run costs ~5 s of
start-up, and the first window over TCP ~5 s more)."""
import re

import pytest

from procs import mpirun, python

MODES = {"shm": False, "no-shm": True}
GOSSIP = "GOSSIP CHECKS OK push_sum_keeps_the_sum pull_contracts peer_sequence_reproducible gossip_trains"
EASGD = "EASGD CHECKS OK easgd_moves_add_up easgd_sync_replay easgd_trains"


@pytest.mark.parametrize("workers,mode", [(1, "shm"), (2, "shm"), (3, "no-shm"), (4, "shm"), (4, "no-shm")])
def test_gossip_checks(workers, mode):
    result = mpirun(workers, python("tests/mpi/gossip_checks.py"), no_shm=MODES[mode], env={"SERVERS": "0"},
                    timeout=180)
    assert result.returncode == 0, result.out[-6000:]
    assert GOSSIP in result.out, result.out[-3000:]


@pytest.mark.parametrize("workers,mode", [(2, "no-shm"), (3, "shm"), (4, "shm"), (4, "no-shm")])
def test_easgd_checks(workers, mode):
    result = mpirun(workers + 1, python("tests/mpi/gossip_checks.py"), no_shm=MODES[mode],
                    env={"SERVERS": "1"}, timeout=180)
    assert result.returncode == 0, result.out[-6000:]
    assert EASGD in result.out, result.out[-3000:]
    assert len(re.findall(r"SERVER 0 DONE", result.out)) == 1
    assert re.search(r"SHARD 0 easgd numel=37 updates=\d+", result.out), result.out[-3000:]

"""od-sgd's window exchange with a tiny worker timeout and a 10x straggler that also reads slowly
(tests/mpi/odsgd_timeout_checks.py): the servers apply global steps while a set-aside worker still
reads the previous one, and every global weight vector a worker receives must be one its server held
(CRCs compared), at 1 and 2 server shards, shared memory on and off."""
import re

import pytest

from procs import mpirun, python

MODES = {"shm": False, "no-shm": True}


@pytest.mark.parametrize("np,servers,mode", [(4, 1, "shm"), (4, 1, "no-shm"), (5, 2, "shm")])
def test_odsgd_reads_only_global_steps_the_servers_held(np, servers, mode):
    result = mpirun(np, python("tests/mpi/odsgd_timeout_checks.py"), no_shm=MODES[mode],
                    env={"SERVERS": str(servers)}, timeout=300)
    assert result.returncode == 0, result.out[-6000:]
    found = re.search(r"ODSGD TIMEOUT CHECKS OK reads=(\d+) torn=0 set_aside=(\d+) .*overlapped=\[([\d, ]+)\]",
                      result.out)
    assert found, result.out[-3000:]
    reads, set_aside = int(found.group(1)), int(found.group(2))
    overlapped = [int(v) for v in found.group(3).split(",")]
    assert reads == 100 * (np - servers)
    # the race was there to catch: the servers went on without a worker, and reads overlapped writes
    assert set_aside > 0 and sum(overlapped) > 0, result.out[-3000:]

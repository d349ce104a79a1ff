"""hvd_async.failures.abort: a process that calls MPI_Abort and is still alive some seconds later (its
exit held up) is ended by the kernel (SIGALRM), so that mpirun sees a rank die and ends the job. Here
the world's ``Abort`` never returns and never ends the process, as a held-up exit would."""
import signal
import subprocess
import sys
import time

STUCK = """
import signal, time
from hvd_async import failures
failures.ABORT_BACKSTOP_SECONDS = 1
signal.signal(signal.SIGALRM, lambda *a: print("the script's own handler ran"))  # replaced by the default

class World:
    def Abort(self, code):
        print("Abort called", code, flush=True)
        while True:
            time.sleep(0.1)

failures.abort(World(), 3, wait=0.2)
"""


def test_an_abort_that_does_not_end_the_process_is_ended_by_the_alarm():
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=30)
    assert done.returncode == -signal.SIGALRM, (done.returncode, done.stdout, done.stderr)
    assert "Abort called 3" in done.stdout and "own handler" not in done.stdout
    assert time.monotonic() - start < 15

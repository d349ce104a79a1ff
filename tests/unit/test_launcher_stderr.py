"""The launcher's stderr relay: mpirun's exit-status banner is dropped after the job's own one-line
error, and nothing else is held back or lost."""
import io
import sys
import time

from hvd_async.job import launcher
from hvd_async.job.launcher import BannerFilter

ERROR = b"hvd_async.job.train: error: --lr must be > 0, got -1\n"
DASHES = b"-" * 74 + b"\n"
PRIMARY = DASHES + b"Primary job  terminated normally, but 1 process returned\n" \
                   b"a non-zero exit code. Per user-direction, the job has been aborted.\n" + DASHES
DETECTED = DASHES + b"mpirun detected that one or more processes exited with non-zero status, thus causing\n" \
                    b"the job to be terminated. The first process to do so was:\n\n  Process name: [[1,1],2]\n" \
                    b"  Exit code:    2\n" + DASHES
# mpirun's line when the aborting rank's MPI_ABORT banner reached it cut short
CUT = b"[vm:05041] [[32591,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file " \
      b"../../../orte/util/show_help.c at line 507\n"
# the same cut, where Open MPI's relay failed on another error
CUT_RESOURCE = b"[vm:11461] [[16443,0],0] ORTE_ERROR_LOG: Out of resource in file " \
               b"../../../orte/util/show_help.c at line 501\n"
ABORT = DASHES + b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 2.\n" + DASHES
KILLED = DASHES + b"mpirun noticed that process rank 2 with PID 0 on node x exited on signal 9 (Killed).\n" + DASHES


def relay(*chunks: bytes) -> bytes:
    out = io.TextIOWrapper(io.BytesIO(), write_through=True)
    sink = BannerFilter(out)
    for chunk in chunks:
        sink.feed(chunk)
    sink.close()
    return out.buffer.getvalue()


def test_the_exit_banners_after_an_error_line_are_dropped():
    assert relay(ERROR + PRIMARY + DETECTED) == ERROR
    data = ERROR + PRIMARY + DETECTED
    assert relay(*(data[i:i + 7] for i in range(0, len(data), 7))) == ERROR  # whatever the chunks


def test_open_mpis_repeats_of_an_abort_are_dropped_where_the_job_said_its_error():
    """The MPI_ABORT banner, or mpirun's ORTE_ERROR_LOG line where that banner reached it cut short:
    dropped where the job's error line came, before or after them; kept without one."""
    for data in (ERROR + CUT, ERROR + ABORT, ERROR + CUT + DETECTED, ABORT + ERROR, CUT + ERROR + DETECTED,
                 ERROR + CUT_RESOURCE, CUT_RESOURCE + ERROR + DETECTED):
        assert relay(data) == ERROR, data  # (they reach mpirun apart from the rank's stderr: sometimes first)
        assert relay(*(data[i:i + 7] for i in range(0, len(data), 7))) == ERROR
    assert relay(b"epoch 1/2\n" + CUT) == b"epoch 1/2\n" + CUT
    other = b"[vm:1] [[2,0],0] ORTE_ERROR_LOG: Out of resource in file ../orte/runtime/orte_init.c at line 9\n"
    assert relay(ERROR + other) == ERROR + other  # an ORTE error elsewhere than the help relay is kept


def test_banners_are_kept_without_an_error_line_and_a_signal_banner_always():
    assert relay(b"epoch 1/2\n" + PRIMARY + DETECTED) == b"epoch 1/2\n" + PRIMARY + DETECTED
    assert relay(ERROR + KILLED + DETECTED) == ERROR + KILLED


def test_progress_text_after_a_carriage_return_goes_out_at_once():
    out = io.TextIOWrapper(io.BytesIO(), write_through=True)
    sink = BannerFilter(out)
    sink.feed(b"\r 10%|#   | 3/30")
    assert out.buffer.getvalue() == b"\r 10%|#   | 3/30"
    sink.feed(b"\r 20%|##  | 6/30")
    assert out.buffer.getvalue() == b"\r 10%|#   | 3/30\r 20%|##  | 6/30"
    sink.feed(b"--")  # the same line goes on: out at once
    assert out.buffer.getvalue().endswith(b"6/30--")
    sink.feed(b"\n" + b"-" * 30)  # a new line that could open a banner: held until it is complete
    assert out.buffer.getvalue().endswith(b"6/30--\n")
    sink.close()  # nothing is lost at the end
    assert out.buffer.getvalue().endswith(b"6/30--\n" + b"-" * 30)



def test_a_benchmark_relaunched_under_mpirun_returns_its_exit_status(tmp_path):
    """benchmarks/common.relaunch hands back the job's exit status as an int (what sys.exit() and the
    callers' ``code != 0`` expect), not the launcher's Outcome. In a fresh interpreter with
    os.environ's variables: where another test initialised MPI in this process, MPI set variables of
    its own in the process's environment, which a child mpirun would inherit and refuse."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nsys.exit(3)\n")
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); from common import relaunch; "
             "code = relaunch(sys.argv[2], 1); print('RELAUNCHED', type(code).__name__, code)")
    done = subprocess.run([sys.executable, "-c", probe, os.path.join(root, "benchmarks"), str(script)],
                          capture_output=True, text=True, timeout=120, cwd=root, env=dict(os.environ))
    assert "RELAUNCHED int 3" in done.stdout, done.stdout + done.stderr


def test_the_abort_banner_is_reported_once_with_its_error_code():
    """The relay tells the launcher that a rank called MPI_Abort: once, with the banner's error code
    (1 where only the cut banner's ORTE_ERROR_LOG line came), and never for the other banners."""
    for data, codes in ((ERROR + ABORT, [2]), (ABORT + ERROR + CUT, [2]), (ERROR + CUT + DETECTED, [1]),
                        (CUT + ABORT, [1]), (ERROR + PRIMARY + DETECTED + KILLED, [])):
        seen = []
        sink = BannerFilter(io.TextIOWrapper(io.BytesIO(), write_through=True), on_abort=seen.append)
        for i in range(0, len(data), 7):
            sink.feed(data[i:i + 7])
        sink.close()
        assert seen == codes, (data, seen)


def _fake_mpirun(tmp_path, then: str):
    """A command that writes the job's error line and the MPI_ABORT banner to stderr, then does ``then``."""
    script = tmp_path / "fake_mpirun.py"
    script.write_text(f"import sys, time\nsys.stderr.buffer.write({(ERROR + ABORT)!r})\nsys.stderr.flush()\n{then}\n")
    return [sys.executable, str(script)]


def test_an_mpirun_that_does_not_end_after_an_abort_is_stopped(tmp_path, monkeypatch, capfd):
    """mpirun still running ABORT_END_SECONDS after the abort banner (stuck itself: the ranks are gone)
    is stopped, with one line saying so, and the job's status is the abort's error code; an mpirun that
    ends by itself meanwhile is left alone."""
    monkeypatch.setattr(launcher, "ABORT_END_SECONDS", 1.0)
    start = time.monotonic()
    outcome = launcher.run(_fake_mpirun(tmp_path, "time.sleep(60)"))
    assert time.monotonic() - start < 20
    assert outcome == launcher.Outcome(2, None)
    err = capfd.readouterr().err
    assert err.startswith(ERROR.decode()) and "mpirun had not ended 1 s after a rank called MPI_Abort" in err, err

    outcome = launcher.run(_fake_mpirun(tmp_path, "time.sleep(0.2)\nsys.exit(2)"))
    time.sleep(1.5)  # past the guard's time: its timer was cancelled when mpirun ended
    assert outcome == launcher.Outcome(2, None)
    assert capfd.readouterr().err == ERROR.decode()

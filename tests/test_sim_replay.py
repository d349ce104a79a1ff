"""The simulator runs the same strategy and rule code as a real MPI run: a real 3-worker asgd run
(tests/mpi/sim_replay_job.py: 1 server + 3 workers under mpirun, shared memory on and off) records its
push order and what each pull read (HVD_ASYNC_WINDOW_TRACE); the simulator fed that order
(``--replay``) ends with the same final weights, to the bit.

Bit-exact needs every pull of the real run to have read a state of the global weights that the
order of versions describes. In a free-running job two pushes can land in the other order than their
version fetches, or a read can overlap an accumulate (the real transport tolerates both: they only
change float rounding order or count as staleness); after such a race the replay reads the recorded
version instead, and from there the runs differ (chaotically, not by a bounded tolerance). So the
bit-exact runs hold a mutex over the workers around each ``opt.step()`` (the order is still decided
by real timing); the free-running run checks that the replay follows its order and that every pull
before the first such race read exactly what the real one did.

dc-asgd's server takes the pushes one at a time through its mailbox and answers each with the
weights its worker goes on from, so nothing races: a free-running dc-asgd run replays to the bit.
"""
import numpy as np
import pytest

from hvd_async.sim import simulate
from hvd_async.transport.trace import Trace
from procs import mpirun, python

EPOCHS = 2


def real_run(tmp_path, *, serial: bool, no_shm: bool, algo: str = "asgd", workers: int = 3,
             flags=()) -> Trace:
    folder = tmp_path / "real"
    result = mpirun(workers + 1, python("tests/mpi/sim_replay_job.py", str(EPOCHS), *(["serial"] if serial else []),
                                        algo, *flags),
                    no_shm=no_shm, env={"HVD_ASYNC_WINDOW_TRACE": str(folder)}, timeout=300)
    assert result.returncode == 0, result.out[-4000:]
    assert "REPLAY JOB OK" in result.out, result.out[-4000:]
    return Trace(str(folder))


def replay(tmp_path, real: Trace, algo: str = "asgd", workers: int = 3, args=()):
    folder = tmp_path / "sim"
    record = simulate(["--algo", algo, "--workers", str(workers), "--epochs", str(EPOCHS), "--replay", real.directory,
                       "--trace-out", str(folder), *args])
    sim = Trace(str(folder))
    assert sim.check_order() == real.check_order() >= EPOCHS * 45
    for worker in range(workers):
        assert sim.pushes(worker) == real.pushes(worker)
        assert [p["version"] for p in sim.pulls(worker)] == [p["version"] for p in real.pulls(worker)]
    return record, sim


@pytest.mark.parametrize("mode", ["shm", "no-shm"])
def test_replay_of_a_real_asgd_run_gives_the_same_final_weights(tmp_path, mode):
    real = real_run(tmp_path, serial=True, no_shm=mode == "no-shm")
    record, sim = replay(tmp_path, real)
    counts = record["simulator"]["replay"]
    assert counts["pulls_matched"] == counts["pulls"] > EPOCHS * 45, counts
    for worker in range(3):
        assert [p["digest"] for p in sim.pulls(worker)] == [p["digest"] for p in real.pulls(worker)]
        np.testing.assert_array_equal(sim.final(worker), real.final(worker))
    assert record["updates"] >= EPOCHS * 45


def test_replay_of_a_free_running_asgd_run_follows_its_order(tmp_path):
    real = real_run(tmp_path, serial=False, no_shm=False)
    record, sim = replay(tmp_path, real)
    counts = record["simulator"]["replay"]
    assert counts["pulls_matched"] >= 3, counts  # at least every worker's pull of the published weights
    for worker in range(3):
        pairs = list(zip(sim.pulls(worker), real.pulls(worker)))
        first_race = next((i for i, (s, r) in enumerate(pairs) if s["digest"] != r["digest"]), len(pairs))
        assert first_race >= 1  # the published weights
    if counts["pulls_matched"] == counts["pulls"]:  # no race this time: then nothing may differ
        for worker in range(3):
            np.testing.assert_array_equal(sim.final(worker), real.final(worker))
    print(f"free-running replay: {counts['pulls_matched']} of {counts['pulls']} pulls read what the real ones read")


@pytest.mark.parametrize("mode", ["shm", "no-shm"])
def test_replay_of_a_free_running_dc_asgd_run_gives_the_same_final_weights(tmp_path, mode):
    """dc-asgd's server takes one push at a time through its mailbox and answers with the weights the
    worker goes on from: no read can race a push, so a free-running run replays to the bit (the
    look-ahead and the compensation included), every answer bringing what the real one brought."""
    _check_dc_asgd_replay(tmp_path, mode, workers=3)


@pytest.mark.parametrize("algo,workers,mode", [("dc-asgd", 3, "shm"), ("dc-asgd", 2, "no-shm"),
                                               ("lc-asgd", 2, "no-shm")])
def test_replay_of_a_run_with_the_compiled_push(tmp_path, algo, workers, mode):
    """The servers' compiled push (``server_kernel='compiled'``, hvd_async/rules/fused.py) in a real run
    under mpirun, replayed by the simulator with the same kernel: the same bits, every answer included
    (tests/unit/test_compiled_push.py compares the kernel with the eager push, to rounding); lc-asgd's
    push is the same loop with its ratio r scaling the step."""
    real = _check_dc_asgd_replay(tmp_path, mode, workers=workers, compiled=True, algo=algo)
    # and the real servers did run the compiled loop: the eager push, on the same order, ends elsewhere
    # (in the last bits: the same operations in another order)
    _, eager = replay(tmp_path / "eager", real, algo=algo, workers=workers)
    assert any(not np.array_equal(eager.final(w), real.final(w)) for w in range(workers))
    # rounding differences grow over two epochs of training (a few weights of thousands move by 1e-4 to
    # 1e-3 on some orders), so the two end close as whole vectors, not weight by weight
    for w in range(workers):
        apart = np.linalg.norm(eager.final(w) - real.final(w)) / np.linalg.norm(real.final(w))
        assert apart < 1e-3, (w, apart)


def _check_dc_asgd_replay(tmp_path, mode, *, workers, compiled=False, algo="dc-asgd") -> Trace:
    real = real_run(tmp_path, serial=False, no_shm=mode == "no-shm", algo=algo, workers=workers,
                    flags=["compiled"] if compiled else [])
    record, sim = replay(tmp_path, real, algo=algo, workers=workers,
                         args=["--server-kernel", "compiled"] if compiled else [])
    counts = record["simulator"]["replay"]
    assert counts["pulls_matched"] == counts["pulls"] > EPOCHS * 45, counts
    for worker in range(workers):
        assert [p["after_push"] for p in real.pulls(worker)].count(True) == len(real.pushes(worker))
        assert [p["digest"] for p in sim.pulls(worker)] == [p["digest"] for p in real.pulls(worker)]
        np.testing.assert_array_equal(sim.final(worker), real.final(worker))
    return real

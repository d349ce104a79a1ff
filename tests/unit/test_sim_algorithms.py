"""Every algorithm the simulator supports trains digits to a sane accuracy at a few workers, through
the real strategy and server code; unsupported algorithms and bad values fail with one line."""
import pytest

from hvd_async import registry
from hvd_async.job import cli
from hvd_async.sim import simulate

DEFAULT_CASE = ([], 5, 0.85)  # (extra flags, epochs, accuracy it must reach): every algorithm of the registry
OWN_CASES = {  # where the default does not fit
    "softsync": (["--softsync-n", "2"], 5, 0.85), "dbs-asgd": (["--straggler", "1=3"], 5, 0.85),
    "ssgd": ([], 5, 0.9), "easgd": ([], 5, 0.9), "gossip": (["--gossip-variant", "push"], 5, 0.9),
    "hpsgd": ([], 5, 0.9), "od-sgd": (["--od-exchange", "allreduce"], 8, 0.9),
    "backup-sgd": (["--straggler", "1=3"], 5, 0.9), "lb-sgd": (["--straggler", "1=3"], 5, 0.9),
}
CASES = {name: OWN_CASES.get(name, DEFAULT_CASE) for name in registry.NAMES}


def test_no_case_for_an_algorithm_that_is_gone():
    assert set(OWN_CASES) <= set(registry.NAMES), sorted(set(OWN_CASES) - set(registry.NAMES))


@pytest.mark.parametrize("algo", sorted(CASES))
def test_trains_digits(algo):
    extra, epochs, floor = CASES[algo]
    record = simulate(["--algo", algo, "--workers", "4", "--epochs", str(epochs), "--delay-dist", "uniform",
                       "--latency-ms", "0.2", *extra])
    assert record["final_test_accuracy"] >= floor, record["history"]
    assert record["history"][-1]["train_loss"] < record["history"][0]["train_loss"]
    assert record["workers"] == 4 and len(record["history"]) == epochs
    if algo in ("dbs-asgd", "lb-sgd"):  # the slow worker is told to draw fewer samples (sizes by simulated speed)
        assert record["batch_sizes"][1] < min(record["batch_sizes"][0], record["batch_sizes"][2])


def test_dc_asgd_reports_the_compensation_its_real_server_program_applied():
    """lam=0: the program applies no compensation and the record says exactly 0; lam=0.5: some;
    lam=1.0 from the same seed: more (the term is linear in lam at equal staleness)."""
    rms = {lam: simulate(["--algo", "dc-asgd", "--workers", "4", "--epochs", "1", "--lam", str(lam)])
           ["compensation_rms_norm"] for lam in (0.0, 0.5, 1.0)}
    assert rms[0.0] == 0.0, rms
    assert 0 < rms[0.5] < rms[1.0], rms


def test_dc_asgd_compensates_only_the_delay_its_look_ahead_did_not_cover():
    """In a strict round robin (constant compute times) the look-ahead covers every push's delay,
    so under ``--dc-compensate uncovered`` no push is compensated; every push is by default
    (``always``) or without the look-ahead; with a 3x straggler the straggler's pushes are."""
    def relative(*extra):
        return simulate(["--algo", "dc-asgd", "--workers", "4", "--epochs", "2", "--delay-dist", "constant",
                         *extra])["compensation_relative"]

    assert relative("--dc-compensate", "uncovered") == 0.0
    assert relative() > 0.005
    assert relative("--dc-compensate", "uncovered", "--no-lookahead") > 0.005
    assert relative("--dc-compensate", "uncovered", "--straggler", "1=3") > 0.005


def test_lc_asgd_damps_only_the_delay_its_look_ahead_did_not_cover():
    """Constant compute times make a strict round robin (every push 3 versions stale at 4 workers).
    The look-ahead answered each worker with the point the other three's momentum will have carried
    the weights to, so the loss ratio r is 1 there (with lam 0 the compensation is |r - 1| alone);
    without the look-ahead the same delay is damped; with a 3x straggler the straggler's extra
    rounds are damped with the look-ahead too."""
    def relative(*extra):
        return simulate(["--algo", "lc-asgd", "--workers", "4", "--epochs", "2", "--lam", "0",
                         "--delay-dist", "constant", *extra])["compensation_relative"]

    assert relative() == 0.0
    assert relative("--no-lookahead") > 0.01
    assert relative("--straggler", "1=3") > 0.005


@pytest.mark.parametrize("argv,match", [
    (["--algo", "od-sgd"], "--algo od-sgd (its default options) cannot be simulated (its exchange runs on a thread "
                           "of its own); the simulator runs: ssgd, asgd"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
    (["--compute-ms", "0"], "--compute-ms must be > 0 in the simulator"),
    (["--delay-dist", "pareto", "--delay-shape", "0.5"], "pareto's alpha must be > 1"),
    (["--delay-dist", "gamma"], "invalid choice: 'gamma'"),
    (["--slow-workers", "5"], "--slow-workers must be between 0 and --workers (4), got 5"),
    (["--slow-factor", "0.5"], "--slow-factor must be >= 1"),
    (["--straggler", "7=2"], "there is no worker 7"),
    (["--algo", "softsync", "--softsync-n", "9"], "--softsync-n 9 must be between 1 and the number of workers (4)"),
    (["--algo", "nope"], "unknown algorithm 'nope'"),
    (["--algo", "softsync", "--replay", "somewhere"], "--replay supports asgd, dc-asgd, lc-asgd"),
    (["--algo", "asgd", "--replay", "/nonexistent-trace"], "--replay /nonexistent-trace"),
])
def test_bad_values_exit_2_with_one_line(capsys, argv, match):
    assert cli.main(["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_help_lists_the_simulator_options(capsys):
    assert cli.main(["simulate", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--workers", "--delay-dist", "--delay-shape", "--latency-ms", "--slow-workers", "--slow-factor",
                 "--replay", "--lam", "--softsync-n", "--straggler"):
        assert flag in out
    assert cli.main(["--help"]) == 0 and "simulate" in capsys.readouterr().out

"""An algorithm added from outside the package (issue 18): examples/local_sgd.py registers local SGD,
and it runs in DistributedOptimizer, ``hvd-async train --algo`` (flags and a YAML preset), and the
simulator, with no line of hvd_async/ naming it."""
import dataclasses
import json
import os
import subprocess

import pytest

from procs import ROOT, mpirun, python, run

from hvd_async import registry
from hvd_async.job import config
from hvd_async.algorithms.algorithm import Algorithm
from hvd_async.algorithms.base import Strategy
from hvd_async.sim import simulate
from hvd_async.job.train import TrainingStopped

PLUGIN = os.path.join(ROOT, "examples", "local_sgd.py")
PRESET = os.path.join(ROOT, "examples", "local_sgd.yaml")


pytestmark = pytest.mark.usefixtures("registry_as_it_was")  # (tests/conftest.py)


def test_the_package_does_not_know_the_plugin():
    """Adding local-sgd needed no change inside hvd_async/: no tracked file there names it."""
    tracked = subprocess.run(["git", "ls-files", "hvd_async"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked, "git ls-files found no package files"
    naming = [path for path in tracked
              if any(word in open(os.path.join(ROOT, path), errors="replace").read().lower()
                     for word in ("local-sgd", "local_sgd", "localsgd"))]
    assert naming == [], f"files inside the package name the example plugin: {naming}"


@pytest.mark.parametrize("np,no_shm", [(2, False), (3, True)])
def test_plugin_through_the_python_api(np, no_shm):
    result = mpirun(np, python("tests/mpi/plugin_checks.py"), no_shm=no_shm, timeout=120)
    assert result.returncode == 0, result.out[-4000:]
    assert "PLUGIN CHECKS OK" in result.out, result.out[-3000:]


@pytest.mark.parametrize("how", ["flags", "preset"])
def test_plugin_in_the_training_job(how, tmp_path):
    metrics = tmp_path / "m.json"
    argv = (["--plugin", PLUGIN, "--algo", "local-sgd", "--local-sgd-period", "2", "--np", "2"] if how == "flags"
            else ["--config", PRESET, "--np", "3"])
    result = run(python("-m", "hvd_async.job.cli", "train", *argv, "--epochs", "2", "--metrics-out", str(metrics),
                        "--progress", "epochs"), timeout=120)
    assert result.returncode == 0, result.out[-4000:]
    record = json.loads(metrics.read_text())
    assert (record["algorithm"], record["workers"]) == ("local-sgd", 2 if how == "flags" else 3)
    # two epochs of digits at lr 0.1, momentum 0.9 (measured 0.93-0.95): far above chance (0.1)
    assert record["final_test_accuracy"] >= 0.8, record["history"]


def _sim(*extra):
    return simulate(["--plugin", PLUGIN, "--workers", "4", "--epochs", "1", "--momentum", "0", *extra])


def test_plugin_in_the_simulator_is_ssgd_at_period_one():
    """Local SGD averaging the weights after every plain-SGD step moves them as ssgd's averaged
    gradient does; a longer period gives another run (the option reaches the strategy)."""
    ssgd = _sim("--algo", "ssgd")
    one = _sim("--algo", "local-sgd", "--local-sgd-period", "1")
    four = _sim("--algo", "local-sgd", "--local-sgd-period", "4")
    assert one["algorithm"] == "local-sgd" and one["steps"] == ssgd["steps"]
    assert one["history"][-1]["train_loss"] == pytest.approx(ssgd["history"][-1]["train_loss"], abs=1e-5)
    assert one["final_test_accuracy"] == pytest.approx(ssgd["final_test_accuracy"], abs=1 / 360)
    assert abs(four["history"][-1]["train_loss"] - one["history"][-1]["train_loss"]) > 1e-3


def test_plugin_skips_count_towards_max_nonfinite():
    """The plugin counts its skipped steps in Strategy's ``skipped_nonfinite``: at --lr 1e30 every
    gradient after the first step is non-finite, and --max-nonfinite 5 stops the run (it ran to the end)."""
    with pytest.raises(TrainingStopped, match=r"5 gradients in a row held NaN or infinity.*--max-nonfinite 5"):
        _sim("--algo", "local-sgd", "--lr", "1e30", "--max-nonfinite", "5")
    assert Strategy.skipped_nonfinite == 0, "the base class declares the count every strategy keeps"


def test_bad_plugins_get_one_line():
    with pytest.raises(config.ConfigError, match=r"--plugin nope\.py: no such file"):
        config.parse(["--plugin", "nope.py"])
    with pytest.raises(config.ConfigError, match=r"--plugin no_such_module_here: cannot import it"):
        config.parse(["--plugin", "no_such_module_here"])
    with pytest.raises(config.ConfigError, match=r"--local-sgd-period must be an integer >= 1 .*got 0"):
        config.validate(config.parse(["--plugin", PLUGIN, "--algo", "local-sgd", "--local-sgd-period", "0"]))


def test_register_refuses_what_it_cannot_run():
    class NoOptions(Strategy):
        def step(self, closure=None):
            return None

    @dataclasses.dataclass
    class Empty:
        pass

    with pytest.raises(ValueError, match="'asgd' is taken"):
        registry.register("asgd", NoOptions, options=Empty, summary="x")
    with pytest.raises(ValueError, match="'asgd' is taken"):
        registry.register("asgd", type("Mine", (Algorithm,), {"Options": Empty, "strategy": NoOptions}), summary="x")
    with pytest.raises(TypeError, match="give its options dataclass as options="):
        registry.register("mine", NoOptions, summary="x")
    with pytest.raises(TypeError, match=r"Options must be a dataclass"):
        registry.register("mine", NoOptions, options=object, summary="x")
    with pytest.raises(TypeError, match=r"MineAlgorithm\.strategy must be a subclass of .*Strategy"):
        registry.register("mine", type("MineAlgorithm", (Algorithm,), {"Options": Empty, "strategy": dict}), summary="x")
    with pytest.raises(TypeError, match="give a subclass of hvd_async.algorithms.algorithm.Algorithm"):
        registry.register("mine", dict, summary="x")
    assert "mine" not in registry.names()

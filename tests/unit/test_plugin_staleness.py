"""The server-side plugin examples/staleness_asgd.py (issue 44): registered from outside the package,
it runs in ``hvd-async simulate`` through the real strategy and server code and trains digits, and no
file of the package names it."""
import os
import subprocess

import pytest

from hvd_async.sim import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = os.path.join(ROOT, "examples", "staleness_asgd.py")


pytestmark = pytest.mark.usefixtures("registry_as_it_was")  # (tests/conftest.py)


def test_the_staleness_plugin_trains_in_the_simulator():
    record = simulate(["--plugin", PLUGIN, "--algo", "staleness-asgd", "--workers", "4", "--epochs", "3",
                       "--delay-dist", "uniform", "--latency-ms", "0.2", "--straggler", "1=3"])
    assert record["final_test_accuracy"] >= 0.85, record["history"]
    assert record["history"][-1]["train_loss"] < record["history"][0]["train_loss"]
    assert record["staleness_max"] >= 1  # the straggler's pushes were stale, and still applied


def test_the_package_does_not_know_the_staleness_plugin():
    tracked = subprocess.run(["git", "ls-files", "hvd_async"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked
    naming = [path for path in tracked if "staleness-asgd" in open(os.path.join(ROOT, path), errors="replace").read()
              or "staleness_asgd" in open(os.path.join(ROOT, path), errors="replace").read()]
    assert naming == [], naming

"""benchmarks/speed/setup_time.py, the README's first-setup figure: the packages it reports are the setup's
own list, the setup it times runs outside this process's virtual environment with a fresh cache, and
the job it times is the Makefile's."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
import setup_time  # noqa: E402


def test_the_packages_are_the_setup_scripts():
    found = setup_time.packages()
    assert {"openmpi-bin", "libopenmpi-dev", "dataset-fashion-mnist"} <= set(found), found
    assert all(name and "(" not in name and ")" not in name for name in found), found


def test_the_setup_runs_outside_this_venv_with_a_fresh_cache(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin"]))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    env = setup_time.clean_env(str(tmp_path / "cache"))
    assert env["PATH"].split(os.pathsep) == ["/usr/local/bin", "/usr/bin"]
    assert "VIRTUAL_ENV" not in env and "PYTHONPATH" not in env
    assert env["HVD_ASYNC_CACHE"] == str(tmp_path / "cache") and env["PIP_NO_CACHE_DIR"] == "1"


def test_the_timed_job_is_the_makefiles():
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    assert f"hvd-async train {' '.join(setup_time.TRAIN)} --metrics-out runs/metrics.json" in makefile

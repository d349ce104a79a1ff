"""The package passes its linter (ruff) and its type checker (mypy), both configured in pyproject.toml and
installed by the setup."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_package_is_lint_clean():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "hvd_async"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "No module named ruff" not in done.stderr, "ruff is missing: run make setup (scripts/requirements.txt)"
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_type_checks():
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", os.devnull], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "No module named mypy" not in done.stderr, ("mypy is missing: run HVD_ASYNC_TEST_TOOLS=1 make setup "
                                                       "(scripts/requirements-test.txt)")
    assert done.returncode == 0, done.stdout + done.stderr

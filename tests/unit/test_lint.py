"""The package passes its linter (ruff, configured in pyproject.toml; the setup installs it)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_package_is_lint_clean():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "hvd_async"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "No module named ruff" not in done.stderr, "ruff is missing: run make setup (scripts/requirements.txt)"
    assert done.returncode == 0, done.stdout + done.stderr

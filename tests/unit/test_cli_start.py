"""The start of ``hvd-async``: the package and the command load without torch, and on a terminal the
command's first line is on the screen before torch is imported, then gives way to what follows."""
import importlib
import os
import pty
import subprocess
import sys

import pytest

import hvd_async


def test_the_package_and_the_command_load_without_torch():
    probe = ("import sys, hvd_async, hvd_async.job.cli; "
             "print(sorted(m for m in ('torch', 'horovod', 'mpi4py', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_every_public_name_loads_from_its_module():
    assert sorted(hvd_async.__all__) == sorted(hvd_async._PUBLIC)
    for name, (module, attribute) in hvd_async._PUBLIC.items():
        assert getattr(hvd_async, name) is getattr(importlib.import_module(module, "hvd_async"), attribute), name
    from hvd_async import DistributedOptimizer, init  # noqa: F401  (the from-import form)
    with pytest.raises(AttributeError, match="no_such_name"):
        hvd_async.no_such_name  # noqa: B018


def _on_a_terminal(argv) -> tuple:
    """Run ``hvd-async ARGV`` with its output on a pseudo-terminal: (exit status, what it wrote)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hvd_async.job.cli", *argv], stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    try:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # every process that had the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
    return proc.wait(timeout=120), b"".join(chunks).decode()


def test_on_a_terminal_the_first_line_comes_before_the_check_and_gives_way_to_the_error():
    code, text = _on_a_terminal(["train", "--np", "0"])
    assert code == 2, text
    pending, _, after = text.partition("\r\x1b[K")
    assert pending == "hvd-async train: checking the options (importing torch takes a few seconds) ...", text
    assert after.startswith("hvd-async train: error: --np must be >= 1, got 0") and after.count("\n") == 1, text


def test_in_a_log_only_the_error_line():
    done = subprocess.run([sys.executable, "-m", "hvd_async.job.cli", "train", "--np", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("hvd-async train: error: --np must be >= 1, got 0") and done.stderr.count("\n") == 1, done.stderr


def test_the_submodules_are_attributes_as_before():
    assert hvd_async.registry.names() == hvd_async.ALGORITHM_NAMES  # (as examples/guide_example.py reads them)
    assert hvd_async.checkpoint.__name__ == "hvd_async.checkpoint"

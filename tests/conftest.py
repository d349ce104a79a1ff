"""Test layout: tests/unit run in one process; tests/mpi run only under mpirun (tests/test_mpirun.py launches them)."""
import os

collect_ignore = [] if os.environ.get("HVD_ASYNC_UNDER_MPIRUN") == "1" else ["mpi"]

import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each test's call report on its item (``item.call_report``), for fixtures that record outcomes."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.call_report = report


@pytest.fixture
def registry_as_it_was():
    """What a test registers in this process (a plugin algorithm) is gone after it: the other tests see
    the built-in algorithms only."""
    import sys

    from hvd_async import registry

    before = dict(registry.ALGORITHMS)
    modules = set(sys.modules)
    yield
    registry.ALGORITHMS.clear()
    registry.ALGORITHMS.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith("hvd_async_plugin_"):
            del sys.modules[name]


@pytest.fixture
def train_in_process(capsys):
    """``hvd-async train ARGV`` through the command's ``main()`` in this process (a process per case
    would pay torch's import each time): ``(status, stdout and stderr together)``."""
    from hvd_async.job import cli

    def train(argv):
        code = cli.main(["train", *argv])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return train

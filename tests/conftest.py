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

"""Protocol v2's CPU-bound rule, as benchmarks/study/convergence.py applies it: a cell is CPU-bound when a
run's workers waited for a core 5% of their training time or more (core_wait), whatever the cores
were kept busy by MPI's polling (cpu_utilisation, reported only)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "study"))

import convergence  # noqa: E402


def rows(core_wait, cpu_utilisation=1.0):
    row = {"cpu_utilisation": [cpu_utilisation], "core_wait": [core_wait], "seconds_to_target": [10.0]}
    return {"ssgd": dict(row), "asgd": dict(row)}


@pytest.mark.parametrize("wait, bound", [(0.049, False), (0.05, True), (0.2, True), (None, False)])
def test_a_cell_is_cpu_bound_when_a_run_waited_for_a_core_five_percent_of_its_time(wait, bound):
    out = convergence.v2_criterion("fmnist-v2-4", rows(wait))
    assert out["cpu_bound"] is bound and out["max_core_wait"] == wait


def test_cores_kept_busy_by_polling_do_not_make_a_cell_cpu_bound():
    out = convergence.v2_criterion("fmnist-v2-4", rows(0.02, cpu_utilisation=1.9))
    assert out["cpu_bound"] is False and out["max_cpu_utilisation"] == 1.9

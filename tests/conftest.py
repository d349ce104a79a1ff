"""Test layout: tests/unit run in one process; tests/mpi run only under mpirun (tests/test_mpirun.py launches them)."""
import os

collect_ignore = [] if os.environ.get("HVD_ASYNC_UNDER_MPIRUN") == "1" else ["mpi"]

"""hvd-async doctor on the CPU paths: here every piece a job needs is found (two real ranks allocate,
put, accumulate, fetch-and-add and get through a window); each missing piece is one MISSING line with
its fix: mpirun off the PATH, Horovod that cannot be imported, a one-sided component that refuses
windows under MPI_THREAD_MULTIPLE (Open MPI's pt2pt), a small /dev/shm. (GPUs: scripts/device_check.sh.)"""
import os
import re

from procs import ROOT, python, run

from hvd_async.job import doctor

DOCTOR = python("-m", "hvd_async.job.cli", "doctor")
NAMES = ["mpirun", "mpi4py", "MPI one-sided windows between 2 ranks", "Open MPI's one-sided components", "Horovod",
         "GPUs per rank", "/dev/shm"]


def _lines(out: str):
    """{name: (status, the rest)} of the report's check lines, which must be one per check."""
    found = re.findall(r"^(OK     |MISSING) ([^:]+): (.*)$", out, re.M)
    assert [name for _, name, _ in found] == NAMES, out
    return {name: (status.strip(), rest) for status, name, rest in found}


def test_everything_is_found_here():
    result = run(DOCTOR, timeout=240)
    lines = _lines(result.out)
    assert lines["MPI one-sided windows between 2 ranks"] == (
        "OK", "Allocate, Lock, Put, Accumulate, Fetch_and_op, Get (osc: Open MPI's choice, OMPI_MCA_osc unset)"), lines
    assert lines["mpi4py"][1].endswith("(MPI 3.1, thread level MULTIPLE)") and "Open MPI" in lines["mpi4py"][1]
    assert "controllers: MPI" in lines["Horovod"][1] and lines["GPUs per rank"][0] == "OK"
    assert result.returncode == (0 if all(s == "OK" for s, _ in lines.values()) else 1), result.out
    assert len(result.out.splitlines()) <= 12, "one screen"


def test_no_mpirun_on_the_path(tmp_path):
    result = run(DOCTOR, timeout=120, env={"PATH": str(tmp_path)})  # (python is named by its full path)
    lines = _lines(result.out)
    assert result.returncode == 1
    assert lines["mpirun"] == ("MISSING", "not on PATH; fix: load your site's MPI (e.g. 'module load openmpi') or "
                                          "install Open MPI, so that 'mpirun --version' runs"), lines
    assert lines["MPI one-sided windows between 2 ranks"][1].startswith("not run (no mpirun); fix:")
    assert "ompi_info not found" in lines["Open MPI's one-sided components"][1]
    assert result.out.splitlines()[-1].startswith("4 missing: mpirun, MPI one-sided windows between 2 ranks, ")


def test_horovod_that_cannot_be_imported(tmp_path):
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("raise ImportError('simulated: built against another MPI')\n")
    result = run(DOCTOR, timeout=240, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    lines = _lines(result.out)
    assert result.returncode == 1 and lines["MPI one-sided windows between 2 ranks"][0] == "OK", result.out
    assert lines["Horovod"] == ("MISSING", "cannot be imported (simulated: built against another MPI); fix: "
                                           + doctor.HOROVOD_FIX), lines


def test_a_one_sided_component_that_refuses_windows():
    result = run(DOCTOR, timeout=240, env={"OMPI_MCA_osc": "pt2pt"})  # refuses MPI_THREAD_MULTIPLE
    lines = _lines(result.out)
    status, rest = lines["MPI one-sided windows between 2 ranks"]
    assert result.returncode == 1 and status == "MISSING", result.out
    assert re.fullmatch(r"MPI_ERR_WIN: .* \(OMPI_MCA_osc=pt2pt\); fix: an MPI whose one-sided calls work under "
                        r"MPI_THREAD_MULTIPLE .*--mca osc ucx\)", rest), rest


def test_a_small_dev_shm(tmp_path):
    size = os.statvfs(str(tmp_path)).f_blocks * os.statvfs(str(tmp_path)).f_frsize
    check = doctor.check_shm(str(tmp_path), minimum=size + 1)
    assert not check.ok and check.line().startswith(f"MISSING {tmp_path}: ") and "fix: docker run --ipc=host" in \
        check.line(), check.line()
    assert doctor.check_shm(str(tmp_path), minimum=1).ok

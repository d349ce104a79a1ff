"""``hvd-async doctor``: what a job needs here, checked and said in one screen, a line a piece (OK, or
MISSING with the fix): mpirun, mpi4py, MPI one-sided windows between two ranks (launched under mpirun,
as a job is), Open MPI's one-sided components, Horovod's build, the GPUs each rank sees, /dev/shm.

    hvd-async doctor                                               # two ranks on this machine
    hvd-async doctor --mpi-args '--hostfile hosts --map-by node'   # a rank on each of two nodes
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, List, NamedTuple, Optional, cast

SHM_MINIMUM = 1 << 30  # below it NCCL, UCX between a node's ranks and DataLoader workers run out
RANKS = 2
HOROVOD_FIX = ("HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 pip install --no-cache-dir horovod, with the MPI above "
               "first on PATH (add HOROVOD_GPU_OPERATIONS=NCCL on GPU nodes)")


class Check(NamedTuple):
    """One line of the report: ``ok``, what was checked, what was found, and the fix where it is missing."""
    ok: bool
    name: str
    found: str
    fix: str = ""

    def line(self) -> str:
        text = f"{'OK     ' if self.ok else 'MISSING'} {self.name}: {self.found}"
        return text if self.ok else f"{text}; fix: {self.fix}"


def check_mpirun() -> Check:
    path = shutil.which("mpirun")
    if path is None:
        return Check(False, "mpirun", "not on PATH", "load your site's MPI (e.g. 'module load openmpi') or install "
                                                     "Open MPI, so that 'mpirun --version' runs")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(False, "mpirun", f"{path} does not run ({exc})", "check your MPI installation")
    return Check(True, "mpirun", f"{path} ({(out.strip().splitlines() or ['version unknown'])[0]})")


def check_mpi4py(ranks: Optional[dict]) -> Check:
    try:
        import mpi4py
    except ImportError as exc:
        return Check(False, "mpi4py", f"cannot be imported ({exc})", "MPICC=$(which mpicc) pip install "
                                                                     "--no-binary mpi4py mpi4py (built against the MPI above)")
    library = f" on {ranks['library']} (MPI {ranks['version']}, thread level {ranks['thread']})" if ranks else ""
    return Check(True, "mpi4py", f"{mpi4py.__version__}{library}")


def check_windows(ranks: Optional[dict], why_not: str) -> Check:
    name = f"MPI one-sided windows between {RANKS} ranks"
    setting = os.environ.get("OMPI_MCA_osc")
    osc = f"OMPI_MCA_osc={setting}" if setting else "osc: Open MPI's choice, OMPI_MCA_osc unset"
    if ranks is None:
        return Check(False, name, why_not, "fix the lines above, or see the error the ranks printed")
    if not ranks["window"]:
        return Check(False, name, f"{ranks['window_error']} ({osc})",
                     "an MPI whose one-sided calls work under MPI_THREAD_MULTIPLE (Open MPI 4.1: osc sm or rdma on "
                     "a node, osc ucx across nodes: --mca osc ucx)")
    return Check(True, name, f"Allocate, Lock, Put, Accumulate, Fetch_and_op, Get ({osc})")


def check_osc_components() -> Check:
    name = "Open MPI's one-sided components"
    ompi_info = shutil.which("ompi_info")
    if ompi_info is None:
        return Check(False, name, "ompi_info not found (not Open MPI?)", "hvd_async is tested on Open MPI 4.1; "
                                                                         "with another MPI run a 2-node job")
    out = subprocess.run([ompi_info, "--parsable"], capture_output=True, text=True, timeout=60).stdout
    found = sorted(set(re.findall(r"^mca:osc:(\w+):version", out, re.M)))
    if "ucx" not in found:
        return Check(False, name, f"{', '.join(found) or 'none'}; no ucx, which windows across nodes need",
                     "an Open MPI built with UCX (one node works without)")
    return Check(True, name, f"{', '.join(found)} (ucx: windows across nodes)")


def check_horovod(gpus: int) -> Check:
    name = "Horovod"
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as exc:  # (an ImportError, or a library built against another MPI or torch)
        return Check(False, name, f"cannot be imported ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                     HOROVOD_FIX)
    controllers = [c for c, built in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built())) if built]
    operations = [op for op, built in (("NCCL", hvd.nccl_built()), ("oneCCL", hvd.ccl_built()), ("DDL", hvd.ddl_built()))
                  if built]
    found = (f"{horovod.__version__}, controllers: {', '.join(controllers) or 'none'}; GPU operations: "
             f"{', '.join(operations) or 'none'}{' (built with CUDA)' if hvd.cuda_built() else ''}")
    if "MPI" not in controllers:
        return Check(False, name, found + " (hvd_async needs the MPI controller)", HOROVOD_FIX)
    if gpus and not hvd.nccl_built():
        return Check(False, name, found + " (the ranks see GPUs: allreduce would run on the CPU)", HOROVOD_FIX)
    return Check(True, name, found)


def check_gpus(ranks: Optional[dict]) -> Check:
    name = "GPUs per rank"
    if ranks is None:
        return Check(False, name, "not known (the ranks did not run)", "fix the lines above")
    if not any(g["count"] for g in ranks["gpus"]):
        return Check(True, name, f"none on ranks 0-{len(ranks['gpus']) - 1}: the job trains on the CPU")
    seen = ", ".join(f"rank {r}: {g['count']} (CUDA_VISIBLE_DEVICES={g['visible']})" for r, g in enumerate(ranks["gpus"]))
    return Check(True, name, f"{seen}; torch's NCCL {ranks['gpus'][0]['nccl']}")


def check_shm(path: str = "/dev/shm", minimum: int = SHM_MINIMUM) -> Check:
    name = path
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        return Check(False, name, f"cannot be read ({exc})", "mount a tmpfs of several GiB on /dev/shm")
    size = stat.f_blocks * stat.f_frsize
    found = f"{size / (1 << 30):.1f} GiB"
    if size < minimum:
        return Check(False, name, f"{found}, under {minimum / (1 << 30):.0f} GiB: NCCL, UCX between a node's ranks "
                                  f"and DataLoader workers run out", "docker run --ipc=host (or --shm-size=16g); "
                                                                     "Kubernetes: an emptyDir of medium Memory on /dev/shm")
    return Check(True, name, found)


def run_ranks(mpi_args: str, timeout: float):
    """(what the ranks reported, or None, and why not) from ``RANKS`` ranks of this module under mpirun."""
    from .launcher import mpirun_command

    try:
        cmd = mpirun_command(RANKS, [sys.executable, "-m", "hvd_async.job.doctor", "--ranks"], mpi_args=mpi_args)
    except FileNotFoundError:
        return None, "not run (no mpirun)"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, (f"the ranks did not finish in {timeout:.0f} s (a window that makes no progress, or ranks that "
                      f"cannot reach each other)")
    for line in done.stdout.splitlines():
        if line.startswith("DOCTOR "):
            return json.loads(line[len("DOCTOR "):]), ""
    said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    return None, f"mpirun exited {done.returncode}: {said[-1][:200] if said else 'no output'}"


def ranks_main() -> None:
    """One rank of the check (``python -m hvd_async.job.doctor --ranks`` under mpirun): windows from the last
    rank into rank 0's, the GPUs it sees; rank 0 prints everything as one JSON line."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    report = {"window": False, "window_error": ""}
    try:
        win = MPI.Win.Allocate(4 * 8, 8, comm=comm)
        comm.Barrier()
        if comm.rank == comm.size - 1:
            got, old = np.zeros(4, dtype=np.int64), np.zeros(1, dtype=np.int64)
            win.Lock(0)
            win.Put(np.array([7, 0, 0, 0], dtype=np.int64), 0)
            win.Unlock(0)
            win.Lock(0, MPI.LOCK_SHARED)
            win.Accumulate(np.array([0, 5, 0, 0], dtype=np.int64), 0, op=MPI.SUM)
            win.Unlock(0)
            win.Lock(0, MPI.LOCK_SHARED)
            win.Fetch_and_op(np.array([1], dtype=np.int64), old, 0, target_disp=2, op=MPI.SUM)
            win.Unlock(0)
            win.Lock(0, MPI.LOCK_SHARED)
            win.Get(got, 0)
            win.Unlock(0)
            report["window"] = got.tolist() == [7, 5, 1, 0]
            report["window_error"] = "" if report["window"] else f"read back {got.tolist()}, expected [7, 5, 1, 0]"
        comm.Barrier()
        win.Free()
    except MPI.Exception as exc:
        report["window_error"] = exc.Get_error_string().splitlines()[0]
    window = comm.gather((report["window"], report["window_error"]), root=0)
    gpus = comm.gather(_gpus(), root=0)
    if comm.rank == 0:
        window = cast(List[Any], window)  # gather returns the list on the root (None elsewhere)
        last = window[-1]
        sys.stdout.write("DOCTOR " + json.dumps({
            "window": last[0], "window_error": last[1] or next((e for _, e in window if e), ""),
            "library": MPI.Get_library_version().splitlines()[0].split(",")[0],
            "version": "%d.%d" % MPI.Get_version(), "thread": _thread_name(MPI.Query_thread()), "gpus": gpus}) + "\n")
        sys.stdout.flush()


def _gpus() -> dict:
    import torch

    count = torch.cuda.device_count()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if count and hasattr(torch.cuda, "nccl") else None
    return {"count": count, "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), "nccl": nccl}


def _thread_name(level: int) -> str:
    from mpi4py import MPI

    names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED",
             MPI.THREAD_MULTIPLE: "MULTIPLE"}
    return names.get(level, str(level))


DESCRIPTION = """\
Check, in one screen, what a hvd_async job needs here: mpirun, mpi4py, MPI one-sided windows
between two ranks (started by mpirun, as a job is), Open MPI's one-sided components, Horovod's
build, the GPUs each rank sees and /dev/shm. Each line says OK, or MISSING with its fix; the exit
status is 0 when nothing is missing, 1 otherwise.

examples:
  hvd-async doctor                                               # two ranks on this machine
  hvd-async doctor --mpi-args '--hostfile hosts --map-by node'   # a rank on each of two nodes"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvd-async doctor", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mpi-args", default="", metavar="'ARGS'",
                   help="more mpirun arguments for the two ranks, e.g. '--hostfile hosts --map-by node' to put them "
                        "on two nodes (then the windows cross the network)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long the two ranks may take (default: 120)")
    p.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)  # (one rank of the check)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ranks:
        ranks_main()
        return 0
    print("hvd-async doctor: what a job needs here (each line OK, or MISSING with its fix)", flush=True)
    checks = [check_mpirun()]
    ranks, why_not = run_ranks(args.mpi_args, args.timeout) if checks[0].ok else (None, "not run (no mpirun)")
    gpus = sum(g["count"] for g in ranks["gpus"]) if ranks else 0
    checks += [check_mpi4py(ranks), check_windows(ranks, why_not), check_osc_components(), check_horovod(gpus),
               check_gpus(ranks), check_shm()]
    for check in checks:
        print(check.line())
    missing = [c.name for c in checks if not c.ok]
    print(f"{len(missing)} missing: {', '.join(missing)}" if missing else "everything a job needs is here")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

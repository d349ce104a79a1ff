#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 against the torch already in the given Python's environment.
#
#   scripts/build_horovod.sh PYTHON WHEEL_CACHE_DIR
#
# Why a script: Horovod 0.28.1 does not build against torch >= 2.1 as released. Its CMake asks for
# C++14 and torch's headers need C++17; and when nvcc is on the machine and torch is a CUDA build,
# Horovod builds its CUDA parts and must find the real toolkit directory (the nvcc on PATH may be a
# wrapper script elsewhere). Horovod's setup.py honours HOROVOD_CMAKE, so cmake-wrapper.sh adds
# -DCMAKE_PROJECT_INCLUDE=horovod-cxx17.cmake (and -DCUDAToolkit_ROOT) to each configure step.
#
# The wheel is cached under WHEEL_CACHE_DIR, keyed on Horovod's and torch's versions, the CUDA
# toolkit, the GPU-operation settings and these build files: a second run installs it in seconds.
# On a GPU cluster, export HOROVOD_GPU_OPERATIONS=NCCL (and HOROVOD_NCCL_HOME if NCCL is not in a
# system path) before running the setup; CPU-only machines build with MPI and Gloo CPU operations.
set -euo pipefail
py=${1:?usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR}
cache=${2:?usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${HOROVOD_VERSION:-0.28.1}

cuda_root() {
  # The real toolkit: CUDA_HOME if set, else where nvcc says it lives (works through wrappers).
  if [[ -n ${CUDA_HOME:-} && -x ${CUDA_HOME}/bin/nvcc ]]; then readlink -f "$CUDA_HOME"; return; fi
  command -v nvcc >/dev/null || return 0
  local tmp top; tmp=$(mktemp -d); : >"$tmp/probe.cu"
  top=$(cd "$tmp" && nvcc --dryrun -c probe.cu 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1) || true
  rm -rf "$tmp"
  [[ -n $top && -d $top ]] && readlink -f "$top"
}

torch_version=$("$py" -c 'import torch; print(torch.__version__)')
torch_cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
cuda=""
[[ -n $torch_cuda ]] && cuda=$(cuda_root)
key=$( { echo "$version $torch_version $cuda ${HOROVOD_GPU_OPERATIONS:-} ${HOROVOD_NCCL_HOME:-}";
         cat "$here/build_horovod.sh" "$here/cmake-wrapper.sh" "$here/horovod-cxx17.cmake"; } | sha256sum | cut -c1-16)
wheels="$cache/horovod-$key"

if "$py" -c "import horovod, sys; sys.exit(horovod.__version__ != '$version')" 2>/dev/null \
   && [[ -f "$wheels/.installed-in-$(echo "$py" | sha256sum | cut -c1-12)" ]]; then
  echo "horovod $version already installed (build $key)"; exit 0
fi

if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
  echo "building horovod $version against torch $torch_version${cuda:+ with CUDA toolkit $cuda} (a few minutes)"
  mkdir -p "$wheels.tmp"
  export HOROVOD_CMAKE="$here/cmake-wrapper.sh" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
  export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  [[ -n ${HOROVOD_GPU_OPERATIONS:-} ]] || export HOROVOD_CPU_OPERATIONS=${HOROVOD_CPU_OPERATIONS:-MPI}
  if [[ -n $cuda ]]; then export HVD_CUDA_ROOT=$cuda CUDA_HOME=$cuda HOROVOD_CUDA_HOME=$cuda; fi
  MAKEFLAGS="-j$(nproc)"
  export MAKEFLAGS
  "$py" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$wheels.tmp" "horovod==$version"
  rm -rf "$wheels"; mv "$wheels.tmp" "$wheels"
fi
"$py" -m pip install --no-deps --force-reinstall "$wheels"/horovod-*.whl
touch "$wheels/.installed-in-$(echo "$py" | sha256sum | cut -c1-12)"

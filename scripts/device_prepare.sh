#!/usr/bin/env bash
# Download, here (a Debian machine with the package registries), what scripts/device_check.sh needs on
# the GPU device machine, which has CUDA, torch and mpi4py but no MPI, no Horovod and no network:
#
#   .device/debs/   OpenMPI 4.1 and the libraries it loads, as Debian packages (unpacked there with
#                   dpkg -x into a prefix; nothing is installed into the system)
#   .device/wheels/ cffi and pycparser for the device's Python (Horovod's build asks for cffi)
#   .device/src/    the source archives of Horovod (built there by scripts/build_horovod.sh) and of
#                   mpi4py (built there only if the preinstalled mpi4py cannot load Open MPI 4.1)
#
#   bash scripts/device_prepare.sh [DIR]     # DIR defaults to .device (ignored by git)
#
# Prints the size: the device tool carries at most 64 MiB (working tree included). Idempotent: what
# is already there is not downloaded again.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=$(mkdir -p "${1:-$root/.device}" && cd "${1:-$root/.device}" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3
horovod_version=${HOROVOD_VERSION:-0.28.1}
mpi4py_version=${MPI4PY_VERSION:-4.1.2}
log() { echo "[device_prepare] $*"; }

# The packages whose files the Open MPI programs, libraries and components load (found with ldd on
# bookworm's openmpi-bin, libopenmpi3 and libpmix2), without the C/C++ runtime every system has
# (libc6, libgcc-s1, libstdc++6, zlib1g). device_check.sh drops any library the device already has.
DEBS=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers
      librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1 libmunge2
      libatomic1 libudev1 libuuid1 libgfortran5 libquadmath0)

mkdir -p "$dest/debs" "$dest/src"
missing=()
for pkg in "${DEBS[@]}"; do
  ls "$dest/debs/${pkg}_"*.deb >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if ! apt-cache show openmpi-bin >/dev/null 2>&1; then
    log "apt package lists are empty: apt-get update"
    apt-get update -qq
  fi
  log "downloading ${#missing[@]} Debian package(s): ${missing[*]}"
  (cd "$dest/debs" && apt-get download -qq -o APT::Sandbox::User=root "${missing[@]}")
fi
# the list the device unpacks, with the distribution it came from
# shellcheck disable=SC1091
{ . /etc/os-release; echo "# $PRETTY_NAME, $(dpkg --print-architecture)"; } >"$dest/debs/SOURCE"

if ! ls "$dest/src/horovod-$horovod_version.tar.gz" >/dev/null 2>&1; then
  log "downloading the Horovod $horovod_version source archive"
  "$python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$dest/src" \
    "horovod==$horovod_version"
fi
if ! ls "$dest/src/mpi4py-$mpi4py_version.tar.gz" >/dev/null 2>&1; then
  log "downloading the mpi4py $mpi4py_version source archive (the fallback if the device's mpi4py cannot load Open MPI)"
  "$python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$dest/src" \
    "mpi4py==$mpi4py_version"
fi

# Horovod's setup.py asks setuptools for cffi (its setup_requires) when it builds; the device image
# has the others (cloudpickle, psutil, pyyaml, packaging) but not cffi, and cannot fetch it
device_python=${DEVICE_PYTHON_VERSION:-3.12}
mkdir -p "$dest/wheels"
if ! ls "$dest/wheels"/cffi-*.whl >/dev/null 2>&1 || ! ls "$dest/wheels"/pycparser-*.whl >/dev/null 2>&1; then
  log "downloading cffi and pycparser wheels for the device's Python $device_python"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$device_python" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dest/wheels" cffi pycparser
fi

bytes=$(du -sb "$dest" | cut -f1)
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
limit=$((64 * 1024 * 1024))
log "$(compgen -G "$dest/debs/*.deb" | wc -l) packages, $(cd "$dest/src" && compgen -G "*" | tr '\n' ' ')"
log "size: $dest $((bytes / 1024)) KiB + working tree $((tree / 1024)) KiB = $(((bytes + tree) / 1024)) KiB of the device tool's 64 MiB limit"
if ((bytes + tree > limit)); then
  log "TOO LARGE for the device tool's carry limit (64 MiB): drop something"
  exit 1
fi
log "fits; run on the device: carry [\"${dest#"$root"/}\"], command: bash scripts/device_check.sh"

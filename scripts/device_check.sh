#!/usr/bin/env bash
# Issue 21 on the GPU device machine, in one command: install what the bare machine lacks from files
# carried with the working tree, then run the GPU tests and benchmarks and write their JSON to one
# folder ($OUT when set, else benchmarks/results/device/).
#
# The device machine has CUDA (nvcc), torch, mpi4py, cmake and no network; scripts/device_prepare.sh,
# run beforehand on a machine with the package registries, puts into .device/ (carried: name it in
# the device tool's `carry`) what is missing:
#   .device/debs/*.deb      Open MPI 4.1 and the libraries it loads: unpacked with dpkg -x into
#                           $DEVICE_WORK/openmpi (nothing is installed into the system), used through
#                           PATH, LD_LIBRARY_PATH and the relocation variables (OPAL_PREFIX, PMIX_*);
#                           a library the machine already has is taken from the machine
#   .device/wheels/*.whl    cffi and pycparser (Horovod's setup.py asks setuptools for cffi), put on PYTHONPATH
#   .device/src/horovod-0.28.1.tar.gz   built by scripts/build_horovod.sh (PIP_NO_INDEX + PIP_FIND_LINKS
#                           make its `pip wheel horovod==0.28.1` take the archive) into a folder of its own
#   .device/src/mpi4py-*.tar.gz         built only if the machine's mpi4py cannot load this Open MPI
#   .device/prebuilt/*.tar.gz           optional: Horovod (and mpi4py) folders an earlier run returned;
#                           used instead of building when they match this machine's torch and Python
#
# Horovod, two ways (HVD_VARIANTS, default "auto"):
#   nccl    HOROVOD_GPU_OPERATIONS=NCCL, NCCL from torch's own nvidia-nccl package (the issue's build)
#   staged  no GPU operations: CUDA tensors go through host memory and MPI (DoAllreduceCudaOnCPU)
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the probe tries NCCL as it is, then
# with a host id per rank (NCCL_HOSTID, sockets on lo), and "auto" builds `staged` only if both fail.
#
#   bash scripts/device_check.sh [--dry-run] [--parts LIST] [--variants auto|nccl|staged|nccl,staged]
#
# --parts (default setup,tests,gpu-bench), in this order:
#   setup      Open MPI, mpi4py check, Horovod build(s), the two-rank probe (always run when a later
#              part needs it; listed alone it stops there)
#   tests      pytest -m gpu tests/test_gpu.py once per Horovod build (junit XML and RESULT figures)
#   gpu-bench  benchmarks/device/gpu_throughput.py: throughput (ssgd vs Horovod, NCCL build), overlap, staging
#   cpu-study  benchmarks/study/cpu_study.py on the CPU cores (CPU_STUDY_ARGS are added; it resumes from a
#              carried .device/prebuilt/cpu_study.json)
# --dry-run: checks the carried files, unpacks Open MPI and runs a 2-rank MPI program with it, and
# prints what it would build and run; no Horovod build, no GPU needed (runs on any Debian-like box).
#
# What comes back in $OUT (the device tool returns at most 8 files): log.txt (everything printed),
# summary.json (every result JSON of this run, merged, with the machine, the driver and the commit),
# results.tar.gz (the JSON, plots, junit XML and logs, to unpack into benchmarks/results/), cpu_study.json
# (when run; rewritten after every job), and prebuilt-*.tar.gz (the Horovod builds, stripped, ~3 MB
# each: put them into .device/prebuilt/ and carry them to skip the build next time).
# Several calls on one warm machine (device time is short): --parts picks the parts, DEVICE_BENCHES the
# benchmarks of gpu-bench (default throughput_1w,throughput_2w,overlap,staging), DEVICE_PYTEST_ARGS adds
# to pytest's arguments (-k ...), DEVICE_PROBE_TIMEOUT bounds each two-rank probe (default 180 s); the
# Horovod build and the probe's answer are kept in DEVICE_WORK and reused by the next call.
# DEVICE_COMMIT=<sha> names the commit (the device gets no .git); DEVICE_KEEP_LIBS=1 uses every carried
# library even where the machine has its own (to test the carried ones).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
carry=${DEVICE_CARRY:-$root/.device}
work=${DEVICE_WORK:-/tmp/hvd_device}
out=${OUT:-$root/benchmarks/results/device}
py=${PYTHON:-python3}
parts=setup,tests,gpu-bench
variants=${HVD_VARIANTS:-auto}
benches=${DEVICE_BENCHES:-throughput_1w,throughput_2w,overlap,staging}
dry=0
while (($#)); do
  case $1 in
    --dry-run) dry=1 ;;
    --parts) parts=$2; shift ;;
    --parts=*) parts=${1#*=} ;;
    --variants) variants=$2; shift ;;
    --variants=*) variants=${1#*=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out" "$work/results/logs"
results=$work/results
exec > >(tee -a "$out/log.txt") 2>&1
say() { echo "[device_check $(date +%H:%M:%S)] $*"; }
has_part() { [[ ",$parts," == *",$1,"* ]]; }
status=0
fail() { say "FAILED: $*"; status=1; echo "$*" >>"$results/failures.txt"; }
cd "$root" || exit 2

# --- results: refreshed after every step, so a run cut off at its time limit still returns them ---
publish() {
  "$py" - "$results" "$out" <<'EOF' || true
import glob, json, os, sys, tarfile
results, out = sys.argv[1], sys.argv[2]
summary = {}
for path in sorted(glob.glob(os.path.join(results, "*.json"))):
    try:
        summary[os.path.basename(path)] = json.load(open(path))
    except ValueError as exc:
        summary[os.path.basename(path)] = {"unreadable": str(exc)}
fail = os.path.join(results, "failures.txt")
summary["failures"] = open(fail).read().splitlines() if os.path.exists(fail) else []
with open(os.path.join(out, "summary.json.tmp"), "w") as f:
    json.dump(summary, f, indent=1)
os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))
with tarfile.open(os.path.join(out, "results.tar.gz.tmp"), "w:gz") as tar:
    tar.add(results, arcname="device_results")
os.replace(os.path.join(out, "results.tar.gz.tmp"), os.path.join(out, "results.tar.gz"))
EOF
}

# --- 0. the machine ------------------------------------------------------------------------------
say "root $root, carried files $carry, work $work, results to $out, parts $parts, variants $variants$( ((dry)) && echo ' (dry run)')"
"$py" - "$results/device.json" <<'EOF' || fail "could not describe the machine"
import json, os, shutil, subprocess, sys
sys.path.insert(0, "benchmarks/device")
from device_info import environment
info = environment()
def cmd(*c):
    try:
        return subprocess.run(c, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return f"({exc})"
for tool in ("nvcc", "cmake", "gcc", "g++", "dpkg-deb", "ar", "mpirun", "nvidia-smi"):
    info.setdefault("tools", {})[tool] = shutil.which(tool)
info["nvcc_version"] = cmd("nvcc", "--version").splitlines()[-1:] if shutil.which("nvcc") else None
info["os"] = cmd("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME")
try:
    import mpi4py
    info["mpi4py"] = mpi4py.__version__
except Exception as exc:
    info["mpi4py"] = repr(exc)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: info.get(k) for k in ("commit", "os", "device", "driver", "torch", "torch_cuda", "nccl", "cpus", "mpi4py", "tools")}))
EOF

# --- 1. Open MPI from the carried Debian packages ------------------------------------------------
prefix=$work/openmpi
unpack_deb() {  # dpkg-deb -x where there is one, else the ar archive's data.tar.* by hand
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  "$py" - "$1" "$2" <<'EOF'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb"
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        mode = {"xz": "r:xz", "gz": "r:gz", "zst": None}.get(name.rsplit(".", 1)[-1], "r:*")
        if mode is None:
            sys.exit("data.tar.zst needs dpkg-deb or zstd")
        tarfile.open(fileobj=io.BytesIO(body), mode=mode).extractall(sys.argv[2])
        break
    pos += 60 + size + (size % 2)
EOF
}
setup_mpi() {
  local debs=("$carry"/debs/*.deb)
  [[ -e ${debs[0]} ]] || { fail "no Debian packages in $carry/debs: run scripts/device_prepare.sh here and carry .device"; return 1; }
  if [[ ! -f $prefix/.ok ]]; then
    rm -rf "$prefix"; mkdir -p "$prefix/root" "$prefix/bin"
    say "unpacking ${#debs[@]} Debian packages into $prefix/root ($(head -1 "$carry/debs/SOURCE" 2>/dev/null))"
    for deb in "${debs[@]}"; do unpack_deb "$deb" "$prefix/root" || { fail "could not unpack $deb"; return 1; }; done
    local lib=$prefix/root/usr/lib/x86_64-linux-gnu
    for f in "$prefix"/root/usr/bin/*.openmpi; do ln -sf "$f" "$prefix/bin/$(basename "$f" .openmpi)"; done
    # Debian's alternatives, which dpkg -x does not make
    local psm; psm=$(compgen -G "$prefix/root/usr/lib/libpsm1/libpsm_infinipath.so.1.*" | head -1)
    [[ -n $psm ]] && ln -sf "$psm" "$lib/libpsm_infinipath.so.1"
    # a library the machine already has comes from the machine (not Open MPI's own ones)
    local cache dropped=()
    cache=$(ldconfig -p 2>/dev/null)
    for f in "$lib"/lib*.so.*; do
      local name; name=$(basename "$f")
      case $name in libmpi*|libopen-*|libompitrace*|liboshmem*|libmca_common_*|libpmix*) continue ;; esac
      [[ $name =~ \.so\.[0-9]+$ ]] || continue   # the soname links only
      [[ -n ${DEVICE_KEEP_LIBS:-} ]] && continue  # (tests: use every carried library)
      if grep -q "^[[:space:]]*$name " <<<"$cache"; then rm -f "$f"; dropped+=("$name"); fi
    done
    ((${#dropped[@]})) && say "taken from the machine instead: ${dropped[*]}"
    touch "$prefix/.ok"
  fi
  local P=$prefix/root/usr pmix=$prefix/root/usr/lib/x86_64-linux-gnu/pmix2
  cat >"$work/env.sh" <<EOF
# Open MPI unpacked from Debian packages into $prefix (source this file)
export PATH=$prefix/bin:$P/bin:\$PATH
export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu/openmpi/lib:$pmix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export OPAL_PREFIX=$P
# Debian's MCA defaults (pml ^ucx, osc ^ucx,pt2pt, btl ^uct,openib,ofi, mtl ^ofi) live in its /etc: without
# them pml ucx is chosen and mpi4py's matched receives fail (MPI_ERR_OTHER)
export OPAL_SYSCONFDIR=$prefix/root/etc/openmpi
export PMIX_PREFIX=$pmix PMIX_LIBDIR=$pmix/lib PMIX_PKGLIBDIR=$pmix/lib/pmix PMIX_DATADIR=$pmix/share PMIX_PKGDATADIR=$pmix/share/pmix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mca_base_component_show_load_errors=0
EOF
  # shellcheck disable=SC1091
  . "$work/env.sh"
  say "mpirun: $(command -v mpirun) ($(mpirun --version 2>&1 | head -1))"
  cat >"$work/hello.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  int rank, size; double x, sum;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
  x = rank + 1; MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("MPI HELLO OK size=%d sum=%g\n", size, sum);
  MPI_Finalize(); return 0;
}
EOF
  mpicc "$work/hello.c" -o "$work/hello" || { fail "mpicc could not build an MPI program"; return 1; }
  timeout 120 mpirun --oversubscribe -np 2 "$work/hello" | grep -q "MPI HELLO OK size=2 sum=3" \
    || { fail "a 2-rank MPI program did not run with the unpacked Open MPI"; return 1; }
  say "Open MPI works: mpicc built a program and mpirun ran it on 2 ranks"
}

# --- 2. mpi4py on that Open MPI ------------------------------------------------------------------
setup_mpi4py() {
  local probe='from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])'
  local site=$work/mpi4py
  [[ -d $site ]] && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  local got; got=$(timeout 120 mpirun -np 1 "$py" -c "$probe" 2>&1 | tr -d '\0' | tail -1)
  if [[ $got == *"Open MPI"* ]]; then say "mpi4py loads $got"; return 0; fi
  say "the machine's mpi4py does not load this Open MPI ($got): building it from $carry/src"
  local sdist; sdist=$(compgen -G "$carry/src/mpi4py-*.tar.gz" | head -1)
  [[ -n $sdist ]] || { fail "no mpi4py source archive in $carry/src"; return 1; }
  ((dry)) && { say "(dry run) would build $sdist into $site"; return 0; }
  rm -rf "$site"
  MPICC=$(command -v mpicc) "$py" -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" "$sdist" \
    >"$results/logs/mpi4py_build.log" 2>&1 || { fail "mpi4py build (logs/mpi4py_build.log)"; return 1; }
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  got=$(timeout 120 mpirun -np 1 "$py" -c "$probe" 2>&1 | tr -d '\0' | tail -1)
  [[ $got == *"Open MPI"* ]] || { fail "the mpi4py built here still does not load Open MPI: $got"; return 1; }
  say "mpi4py (built here) loads $got"
}

# --- 3. Horovod ----------------------------------------------------------------------------------
carried_wheels() {  # .device/wheels (cffi, pycparser: Horovod's setup_requires) onto PYTHONPATH
  local site=$work/site
  ls "$carry"/wheels/*.whl >/dev/null 2>&1 || return 0
  "$py" -c 'import cffi' 2>/dev/null && { say "cffi is there: the carried wheels are not needed"; return 0; }
  if [[ ! -f $site/.ok ]]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$carry"/wheels/*.whl \
      || { fail "could not install the carried wheels ($carry/wheels)"; return 1; }
    touch "$site/.ok"
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  say "carried wheels on PYTHONPATH: $(cd "$carry/wheels" && compgen -G "*.whl" | tr '\n' ' ')"
}
stamp() { "$py" -c 'import sys, torch; print(f"py{sys.version_info[0]}.{sys.version_info[1]} torch{torch.__version__}")'; }
nccl_home() {  # torch's own NCCL (the nvidia-nccl package), with the libnccl.so link CMake looks for
  local dir; dir=$("$py" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)
  [[ -n $dir && -f $dir/include/nccl.h ]] || return 1
  mkdir -p "$work/nccl/lib"
  ln -sfn "$dir/include" "$work/nccl/include"
  local so; so=$(compgen -G "$dir/lib/libnccl.so*" | head -1)
  ln -sf "$so" "$work/nccl/lib/libnccl.so"; ln -sf "$so" "$work/nccl/lib/libnccl.so.2"
  echo "$work/nccl"
}
distutils_shim() {  # Horovod's torch CMake asks distutils for Python's include folder (gone in 3.12)
  "$py" -c 'from distutils.sysconfig import get_python_inc' 2>/dev/null && return 0
  mkdir -p "$work/shim/distutils"
  : >"$work/shim/distutils/__init__.py"
  printf 'import sysconfig\ndef get_python_inc(plat_specific=0, prefix=None):\n    return sysconfig.get_paths()["include"]\n' \
    >"$work/shim/distutils/sysconfig.py"
  echo "$work/shim"
}
build_variant() {  # build_variant nccl|staged -> Horovod in $work/hvd-VARIANT
  local v=$1
  local target=$work/hvd-$v
  local pre=$carry/prebuilt/prebuilt-hvd-$v.tar.gz
  if [[ -f $pre && ! -d $target ]]; then
    tar xzf "$pre" -C "$work" && if [[ $(cat "$target/.stamp" 2>/dev/null) == "$(stamp)" ]]; then
      say "horovod ($v): the carried build matches ($(stamp))"
    else
      say "horovod ($v): the carried build is for $(cat "$target/.stamp" 2>/dev/null), not $(stamp): rebuilding"; rm -rf "$target"
    fi
  fi
  if [[ -d $target ]] && PYTHONPATH=$target:${PYTHONPATH:-} "$py" -c 'import horovod.torch' 2>/dev/null; then
    say "horovod ($v) ready in $target"; return 0
  fi
  local cc; cc=$("$py" -c 'import torch; a, b = torch.cuda.get_device_capability(); print(f"{a}{b}")' 2>/dev/null || echo 90)
  # CMAKE_POLICY_VERSION_MINIMUM: CMake >= 4 refuses gloo's and flatbuffers' cmake_minimum_required(2.8.12)
  local env=(PIP_NO_INDEX=1 "PIP_FIND_LINKS=$carry/src" "HOROVOD_BUILD_CUDA_CC_LIST=$cc" CMAKE_POLICY_VERSION_MINIMUM=3.5)
  command -v cmake >/dev/null && env+=("HVD_REAL_CMAKE=$(command -v cmake)")
  if [[ $v == nccl ]]; then
    local home; home=$(nccl_home) || { fail "horovod (nccl): torch's NCCL (nvidia.nccl) not found"; return 1; }
    env+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_NCCL_HOME=$home" HOROVOD_NCCL_LINK=SHARED)
  fi
  local shim; shim=$(distutils_shim)
  [[ $shim == /* ]] && env+=("PYTHONPATH=$shim:${PYTHONPATH:-}")
  if ((dry)); then say "(dry run) would build horovod ($v): ${env[*]} PIP_TARGET=$target bash scripts/build_horovod.sh $py $work/wheels-$v"; return 0; fi
  say "building horovod ($v) for sm_$cc (log: logs/horovod_$v.log)"
  rm -rf "$target"
  # build_horovod.sh installs with pip; PIP_TARGET puts it into the folder of this variant
  env "${env[@]}" PIP_TARGET="$target" bash "$root/scripts/build_horovod.sh" "$py" "$work/wheels-$v" \
    >"$results/logs/horovod_$v.log" 2>&1
  if ! PYTHONPATH=$target:${PYTHONPATH:-} "$py" -c 'import horovod.torch' 2>>"$results/logs/horovod_$v.log"; then
    fail "horovod ($v) build (tail of logs/horovod_$v.log below)"; tail -30 "$results/logs/horovod_$v.log"; return 1
  fi
  stamp >"$target/.stamp"
  find "$target" -name '*.so' -exec strip --strip-debug {} + 2>/dev/null
  tar czf "$out/prebuilt-hvd-$v.tar.gz" -C "$work" "hvd-$v"
  say "horovod ($v) built ($(du -sh "$target" | cut -f1)); returned as prebuilt-hvd-$v.tar.gz"
}
probe_two_ranks() {  # which way lets two ranks share the GPU with this build: plain|hostid|none
  local v=$1 way
  # an earlier run on this machine already probed this build (a run in several calls, --parts)
  [[ -s $work/way-$v ]] && { cat "$work/way-$v"; return 0; }
  for way in plain hostid; do
    local extra=()
    [[ $way == hostid ]] && extra=(-x HVD_ASYNC_NCCL_HOSTID_PER_RANK=1 -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1)
    if PYTHONPATH=$work/hvd-$v:$root:${PYTHONPATH:-} timeout "${DEVICE_PROBE_TIMEOUT:-180}" mpirun --oversubscribe --bind-to none -np 2 \
         -x PYTHONPATH -x LD_LIBRARY_PATH "${extra[@]}" -x SERVERS=0 "$py" tests/mpi/gpu_checks.py probe \
         >"$results/logs/probe_${v}_$way.log" 2>&1 && grep -q "GPU PROBE OK workers=2" "$results/logs/probe_${v}_$way.log"; then
      echo "$way" | tee "$work/way-$v"; return 0
    fi
  done
  echo none | tee "$work/way-$v"
}

need_setup=0
for p in setup tests gpu-bench cpu-study; do has_part $p && need_setup=1; done
built=()
declare -A ways=()
if ((need_setup)); then
  setup_mpi || { publish; exit 1; }
  setup_mpi4py || { publish; exit 1; }
  carried_wheels || { publish; exit 1; }
  want=$variants; [[ $want == auto ]] && want=nccl
  for v in ${want//,/ }; do build_variant "$v" && built+=("$v"); done
  if ((!dry)); then
    for v in "${built[@]}"; do ways[$v]=$(probe_two_ranks "$v"); say "horovod ($v): two ranks on one GPU: ${ways[$v]}"; done
    if [[ $variants == auto && ${ways[nccl]:-none} == none ]]; then
      if grep -qs "Duplicate GPU" "$results"/logs/probe_nccl_plain.log; then say "NCCL refused two ranks on one GPU (Duplicate GPU detected)"; fi
      say "auto: no NCCL way for two ranks on the one GPU: building the staged variant too"
      build_variant staged && built+=(staged) && ways[staged]=$(probe_two_ranks staged) && say "horovod (staged): two ranks: ${ways[staged]}"
    fi
    "$py" - "$results/setup.json" "${built[*]}" "$(for v in "${built[@]}"; do echo -n "$v=${ways[$v]} "; done)" <<'EOF'
import json, sys
ways = dict(item.split("=") for item in sys.argv[3].split())
json.dump({"horovod_builds": sys.argv[2].split(), "two_ranks_one_gpu": ways,
           "meaning": {"plain": "Horovod as built, no extra settings", "hostid": "NCCL with NCCL_HOSTID per rank "
                       "(HVD_ASYNC_NCCL_HOSTID_PER_RANK=1), sockets on lo", "none": "neither worked"}},
          open(sys.argv[1], "w"), indent=1)
EOF
  fi
  publish
fi
if ((dry)); then
  say "(dry run) tests: for each build: PYTHONPATH=$work/hvd-VARIANT:$root HVD_ASYNC_GPU_HOROVOD=VARIANT $py -m pytest -m gpu tests/test_gpu.py -rs"
  say "(dry run) gpu-bench: $py benchmarks/device/gpu_throughput.py --part throughput --np 1 (nccl build), --part overlap --overlap-np 2, --part staging"
  say "(dry run) cpu-study: $py benchmarks/study/cpu_study.py --out $out/cpu_study.json --resume ${CPU_STUDY_ARGS:-}"
  say "dry run done: Open MPI unpacked and working${built:+, builds planned: ${built[*]}}"
  publish; exit $status
fi
[[ ${#built[@]} -gt 0 ]] || { fail "no Horovod build"; publish; exit 1; }
pick() {  # the build for two ranks on the GPU: one with a way, NCCL first
  local v; for v in nccl staged; do [[ -n ${ways[$v]:-} && ${ways[$v]} != none ]] && { echo "$v"; return; }; done
  echo "${built[0]}"
}
way_env() {  # the environment of the two-rank way of build $1
  [[ ${ways[$1]:-} == hostid ]] && echo "HVD_ASYNC_NCCL_HOSTID_PER_RANK=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 HVD_ASYNC_GPU_TWO_RANKS=hostid"
  [[ ${ways[$1]:-} == plain ]] && echo "HVD_ASYNC_GPU_TWO_RANKS=plain"
  [[ ${ways[$1]:-} == none ]] && echo "HVD_ASYNC_GPU_TWO_RANKS=none"
}

# --- 4. the GPU tests, once per build ------------------------------------------------------------
if has_part tests; then
  for v in "${built[@]}"; do
    say "GPU tests with horovod ($v), two ranks: ${ways[$v]:-?}"
    # shellcheck disable=SC2046,SC2086  # way_env and DEVICE_PYTEST_ARGS are split into words on purpose
    env PYTHONPATH="$work/hvd-$v:$root:${PYTHONPATH:-}" HVD_ASYNC_GPU_HOROVOD="$v" HVD_ASYNC_GPU_RESULTS="$results/gpu_tests_$v" \
      $(way_env "$v") timeout 900 "$py" -m pytest -m gpu tests/test_gpu.py -rs -v -p no:cacheprovider \
      --junitxml="$results/logs/gpu_tests_$v.xml" ${DEVICE_PYTEST_ARGS:-} 2>&1 | tee "$results/logs/gpu_tests_$v.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|^E "
    code=${PIPESTATUS[0]}
    "$py" - "$results/logs/gpu_tests_$v.xml" "$results/gpu_tests_$v/gpu_checks.json" "$results/gpu_tests_$v.json" "$v" <<'EOF' || true
import json, os, sys
import xml.etree.ElementTree as ET
cases = []
if os.path.exists(sys.argv[1]):
    for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, detail = tag, (node.get("message") or "")[:500]
        cases.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)), "detail": detail})
figures = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else []
counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
json.dump({"horovod": sys.argv[4], "counts": counts, "tests": cases, "figures": figures}, open(sys.argv[3], "w"), indent=1)
print(f"gpu tests ({sys.argv[4]}): {counts}")
EOF
    ((code == 0)) || fail "GPU tests with horovod ($v) (exit $code; logs/gpu_tests_$v.log)"
    publish
  done
fi

# --- 5. the GPU benchmarks -----------------------------------------------------------------------
if has_part gpu-bench; then
  nccl=${built[0]}; [[ " ${built[*]} " == *" nccl "* ]] && nccl=nccl
  two=$(pick)
  bench() {  # bench BUILD PART NAME ARGS...: the part's JSON is kept as NAME.json
    local v=$1 part=$2 name=$3; shift 3
    say "benchmark $part with horovod ($v) $* -> $name.json"
    rm -rf "$results/bench_$v"
    # shellcheck disable=SC2046,SC2086  # way_env and GPU_BENCH_ARGS are split into words on purpose
    env PYTHONPATH="$work/hvd-$v:$root:${PYTHONPATH:-}" HVD_ASYNC_GPU_HOROVOD="$v" $(way_env "$v") PYTHONUNBUFFERED=1 \
      timeout 600 "$py" benchmarks/device/gpu_throughput.py --part "$part" --outdir "$results/bench_$v" "$@" ${GPU_BENCH_ARGS:-} \
      2>&1 | tee "$results/logs/bench_${part}_$v.log" | grep -v '^\[' | tail -15
    local code=${PIPESTATUS[0]}
    [[ -f $results/bench_$v/gpu_$part.json ]] && cp "$results/bench_$v/gpu_$part.json" "$results/$name.json"
    [[ -f $results/bench_$v/gpu_$part.png ]] && cp "$results/bench_$v/gpu_$part.png" "$results/$name.png"
    ((code == 0)) || fail "benchmark $part with horovod ($v) (exit $code)"
    publish
  }
  wants() { [[ ",$benches," == *",$1,"* ]]; }
  wants throughput_1w && bench "$nccl" throughput "gpu_throughput_${nccl}_1w" --np 1
  wants throughput_2w && [[ ${ways[$nccl]:-none} != none ]] && bench "$nccl" throughput "gpu_throughput_${nccl}_2w" --np 2
  wants overlap && [[ ${ways[$two]:-none} != none ]] && bench "$two" overlap "gpu_overlap_${two}_2w" --overlap-np 2
  wants staging && bench "$two" staging "gpu_staging_$two"
fi

# --- 6. the CPU study ----------------------------------------------------------------------------
if has_part cpu-study; then
  v=${built[0]}; [[ " ${built[*]} " == *" staged "* ]] && v=staged
  [[ -f $carry/prebuilt/cpu_study.json && ! -f $out/cpu_study.json ]] && cp "$carry/prebuilt/cpu_study.json" "$out/cpu_study.json"
  say "CPU study with horovod ($v) on $(nproc) cores: ${CPU_STUDY_ARGS:-(defaults)}"
  # shellcheck disable=SC2086
  env PYTHONPATH="$work/hvd-$v:$root:${PYTHONPATH:-}" CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 \
    "$py" benchmarks/study/cpu_study.py --out "$out/cpu_study.json" --resume ${CPU_STUDY_ARGS:-} \
    2>&1 | tee "$results/logs/cpu_study.log" | grep -v '^\['
  ((PIPESTATUS[0] == 0)) || fail "CPU study (logs/cpu_study.log)"
  cp "$out/cpu_study.json" "$results/cpu_study.json" 2>/dev/null
  publish
fi

publish
say "done: $( ((status)) && echo "with failures: $(tr '\n' ';' <"$results/failures.txt")" || echo "all parts passed"); results in $out"
exit $status

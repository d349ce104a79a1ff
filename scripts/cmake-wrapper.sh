#!/bin/sh
# CMake as Horovod's setup.py calls it (HOROVOD_CMAKE points here): configure steps get the C++17
# include and, when HVD_CUDA_ROOT is set, the real CUDA toolkit directory; other calls
# (--build, -E, --version) pass through untouched.
here=$(cd "$(dirname "$0")" && pwd)
cmake=${HVD_REAL_CMAKE:-/usr/bin/cmake}
case "${1:-}" in
  --build|-E|--version|--install|-P) exec "$cmake" "$@" ;;
esac
if [ -n "${HVD_CUDA_ROOT:-}" ]; then
  exec "$cmake" -DCMAKE_PROJECT_INCLUDE="$here/horovod-cxx17.cmake" \
    -DCUDAToolkit_ROOT="$HVD_CUDA_ROOT" -DCMAKE_CUDA_COMPILER="$HVD_CUDA_ROOT/bin/nvcc" "$@"
fi
exec "$cmake" -DCMAKE_PROJECT_INCLUDE="$here/horovod-cxx17.cmake" "$@"

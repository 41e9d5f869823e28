#!/usr/bin/env bash
# The extension's CPU kernels and error paths under AddressSanitizer, without touching the install:
# builds margrpo._C (CPU part) with -fsanitize=address in a scratch copy of this checkout and runs the
# kernel tests against it. A memory error in a kernel would corrupt the heap silently in a normal
# build and surface later, e.g. as a crash in the first exception thrown (the H200's segfault in
# test_errors_name_the_argument, 2026-12-04 run 2). About 5 minutes on 2 cores.
#
#   bash benchmarks/gpu/asan_extension.sh [SCRATCH_DIR]   (python: the venv's, or $PYTHON)
set -euo pipefail
cd "$(dirname "$0")/../.."
SCRATCH=${1:-/tmp/margrpo-asan}
PYTHON=${PYTHON:-python}
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH/src" "$SCRATCH/pkg"
git archive HEAD | tar -x -C "$SCRATCH/src"
(cd "$SCRATCH/src" && MARGRPO_BUILD_CUDA=0 CFLAGS="-fsanitize=address -fno-omit-frame-pointer" \
  LDFLAGS="-fsanitize=address" "$PYTHON" setup.py build_ext --inplace >"$SCRATCH/build.log" 2>&1)
# the package beside (not inside) the test tree: tests/conftest.py takes the checkout root off sys.path
cp -r "$SCRATCH/src/margrpo" "$SCRATCH/pkg/"
# libstdc++ preloaded with libasan: python itself does not link it, and ASAN's __cxa_throw
# interceptor then fails on the first C++ exception
cd "$SCRATCH/src"
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)" ASAN_OPTIONS=detect_leaks=0 \
  PYTHONPATH="$SCRATCH/pkg" "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_extension.py \
  tests/test_ops_gaussian_logprob.py tests/test_ops_topk.py tests/test_ops_trajectory_std.py tests/test_ops_consistency.py \
  tests/test_ops_grpo_surrogate.py -k "not triton and not hopper"

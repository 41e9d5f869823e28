#!/usr/bin/env bash
# Downloads (here, where the package registry is reachable) the wheels the GPU machine lacks into
# .gpu-wheels/ for the device tool's `carry`. The GPU machine runs Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-wheels
python -m pip download --only-binary=:all: --python-version 3.12 --no-deps -d .gpu-wheels \
  diffusers open_clip_torch ftfy wcwidth

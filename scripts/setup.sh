#!/usr/bin/env bash
# Creates .venv beside this checkout and installs margrpo with everything its tests and main job need.
# torch==2.14.1 is the CUDA build (from the local wheel cache here, PyPI elsewhere): it runs on the CPU
# and lets setup.py compile csrc/*.cu for sm_90 when nvcc is present.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
pip install -q --upgrade pip setuptools wheel ninja
pip install -q "torch==2.14.1"
# --no-build-isolation: the extension must build against the torch just installed
pip install -q --no-build-isolation -e ".[test,plot,train,rewards,models]"
python - <<'PY'
import margrpo.ops as ops
print("margrpo installed; backends:", ", ".join(ops.available_backends()))
PY

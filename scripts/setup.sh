#!/usr/bin/env bash
# Creates .venv beside this checkout and installs margrpo with everything its tests and main job need.
# torch==2.14.1 is the CUDA build (from the local wheel cache here, PyPI elsewhere): it runs on the CPU
# and lets setup.py compile csrc/*.cu for sm_90 when nvcc is present.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# torch's CUDA build needs about 6 GB in the venv plus its downloaded wheels: say so up front instead
# of pip's "No space left on device" halfway through (MARGRPO_SETUP_MIN_FREE_GB=0 skips the check).
need_gb=${MARGRPO_SETUP_MIN_FREE_GB:-10}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  for dir in . "${TMPDIR:-/tmp}"; do
    free_gb=$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')
    if [ "$free_gb" -lt "$need_gb" ]; then
      echo "setup.sh: $free_gb GB free on the filesystem of $(cd "$dir" && pwd); installing torch ==2.14.1" \
        "(CUDA build) needs about $need_gb GB. Free some space (or set MARGRPO_SETUP_MIN_FREE_GB)." >&2
      exit 1
    fi
  done
fi
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

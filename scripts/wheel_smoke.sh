#!/usr/bin/env bash
# Builds a wheel of this checkout, installs it (not editable) into a fresh venv, and smoke-tests the
# installed package from outside the checkout: every module imports, `margrpo --help` runs, and one
# tiny GRPO step runs on the shipped model (which must come from the wheel's package data).
#
#   bash scripts/wheel_smoke.sh            (after scripts/setup.sh; about 3-5 minutes on 2 cores)
#
# The fresh venv borrows torch and the other dependencies from .venv (a .pth line after its own
# site-packages) instead of downloading them again; .venv's editable margrpo stays invisible, since
# .pth files inside a borrowed directory are not run. Environment: PYTHON (default .venv/bin/python),
# MARGRPO_WHEEL (install this wheel instead of building one), and setup.py's MARGRPO_BUILD_CUDA etc.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ -n "${MARGRPO_WHEEL:-}" ]; then
  WHEEL=$MARGRPO_WHEEL
else
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" .
  WHEEL=$(ls "$WORK"/dist/margrpo-*.whl)
fi
echo "wheel: $WHEEL"

"$PY" -m venv --without-pip "$WORK/venv"
VPY=$WORK/venv/bin/python
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib "$PY" > "$(purelib "$VPY")/_borrowed_site_packages.pth"
"$PY" -m pip --python "$VPY" install -q --no-deps "$WHEEL"

cd "$WORK"  # outside the checkout: nothing may come from the source tree
"$VPY" - "$(purelib "$VPY")" <<'PY'
import importlib, pkgutil, sys
import margrpo
site = sys.argv[1]
assert margrpo.__file__.startswith(site), f"margrpo imported from {margrpo.__file__}, not the wheel in {site}"
names = sorted(m.name for m in pkgutil.walk_packages(margrpo.__path__, "margrpo."))
for name in names:
    importlib.import_module(name)
missing = [n for n in ("margrpo._C", "margrpo.grpo", "margrpo.kernels", "margrpo.checkpoints") if n not in names]
assert not missing, f"not in the wheel: {missing}"
from margrpo.checkpoints import resolve_checkpoint
shipped = resolve_checkpoint("builtin:shapes-tiny")
assert str(shipped).startswith(site) and (shipped / "model.safetensors").is_file(), shipped
print(f"imported {len(names)} modules from {site}")
PY
"$WORK/venv/bin/margrpo" --help > /dev/null
"$WORK/venv/bin/margrpo" train --config "$ROOT/configs/shapes-tiny.yaml" run.steps=1 run.out_dir="$WORK/run" \
  run.eval_per_category=1 run.eval_samples_per_prompt=1 run.tensorboard=false run.threads=1 \
  grpo.prompts_per_step=2 rollout.num_mask_steps=4 rollout.record_mask_steps=2 rollout.record_diffusion_steps=2
"$VPY" -c "import json, sys; s = json.load(open(sys.argv[1])); assert set(s) == {'before', 'after'}, s" \
  "$WORK/run/summary.json"
echo "wheel smoke test passed"

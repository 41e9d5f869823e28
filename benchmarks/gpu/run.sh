#!/usr/bin/env bash
# The ONE GPU script (H200): install from this source tree, build the extension, check every kernel on
# the GPU against its reference, time every op / the fused denoiser / the rollout / the models / the
# rewards against eager PyTorch and torch.compile, print a short table last, and write JSON to OUT.
#
#   bash benchmarks/gpu/run.sh OUT_DIR            # on the GPU machine (about 8 minutes)
#   bash benchmarks/gpu/run.sh OUT_DIR --smoke    # tiny sizes on CPU: checks the script itself
#
# Wheels the GPU machine lacks (diffusers, open-clip-torch, ...) travel in .gpu-wheels/ (made by
# benchmarks/gpu/fetch_wheels.sh, git-ignored, passed with the device tool's `carry`).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT_DIR [--smoke]}
MODE=${2:-full}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STATUS="$OUT/status.txt"
: >"$STATUS"

step() {  # step NAME SECONDS CMD...: run with a time limit, keep going on failure, log the outcome
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$STATUS"
  tail -n 25 "$OUT/$name.log"
}

if [ "$MODE" = "--smoke" ]; then
  DEV=cpu
  export TRITON_INTERPRET=1
  SIZE=(--tokens 16 --steps 2 --repeats 1)
  ROLL=(--batch 2 --tokens 16 --mask-steps 4 --diffusion-steps 2 --repeats 1)
  OPS=(--shapes nova --min-time 0.05 --no-compile)
  MODELS=(--tiny)
else
  DEV=cuda
  SIZE=()
  ROLL=()
  OPS=()
  MODELS=()
  if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    step wheels 300 python -m pip install --no-index --find-links .gpu-wheels diffusers open_clip_torch ftfy
  fi
  # --no-deps: keep the machine's torch/triton; setup.py builds the CUDA kernels for the visible GPU
  step install 420 python -m pip install --no-deps --no-build-isolation -e .
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
fi

python - <<'PY' | tee "$OUT/backends.txt"
import torch, margrpo.ops as ops
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
print("backends", ops.available_backends())
PY

if [ "$MODE" != "--smoke" ]; then
  # correctness on the GPU: every backend (triton, cuda) against the float64 references
  step tests 240 python -m pytest -q -x -m "not slow" -p no:cacheprovider \
    tests/test_ops_gaussian_logprob.py tests/test_ops_trajectory_std.py tests/test_ops_topk.py \
    tests/test_ops_consistency.py tests/test_ops_grpo_surrogate.py tests/test_triton_kernels.py \
    tests/test_extension.py tests/test_heads.py tests/test_multi_seed.py
fi
step bench_ops 240 python -m margrpo.bench.ops --device "$DEV" "${OPS[@]}" --json "$OUT/ops.json"
step bench_denoise 180 python -m margrpo.bench.denoise --device "$DEV" "${SIZE[@]}" --json "$OUT/denoise.json"
step bench_rollout 180 python -m margrpo.bench.rollout --device "$DEV" "${ROLL[@]}" --json "$OUT/rollout.json"
for model in nova harmon; do
  if [ -f "benchmarks/gpu/$model.py" ]; then
    step "bench_$model" 180 python "benchmarks/gpu/$model.py" --out "$OUT" "${MODELS[@]}"
  fi
done
if [ "$MODE" != "--smoke" ]; then
  step bench_rewards 180 python -m margrpo.bench.rewards --device cuda --size full --dtype bfloat16 \
    --rewards hps,pickscore,aesthetic,jpeg_compressibility --json "$OUT/rewards.json"
fi
python benchmarks/gpu/summarize.py "$OUT" | tee "$OUT/summary.md"

#!/usr/bin/env bash
# The GPU script (H200): install from this source tree, check every kernel on the GPU against its
# reference, time the ops / the fused denoiser / the rollout / one GRPO step / the rewards against
# eager PyTorch and torch.compile, and write JSON to OUT_DIR as it goes.
#
#   bash benchmarks/gpu/run.sh OUT_DIR [--smoke] [PHASE ...]
#
# Phases, in this order (default: all): setup kernels ops denoise rollout step rewards. Each has its
# own time limit (LIMIT below, all under 4 minutes); a failed or timed-out phase is logged in
# OUT_DIR/status.txt and the next one runs; every benchmark rewrites its JSON after each row, so a
# timeout keeps the rows it finished. On a bare 15-minute GPU machine the run is two commands whose
# limits add up to under 8 minutes (setup is skipped when the build from the first is still there):
#
#   bash benchmarks/gpu/run.sh OUT setup kernels ops denoise       # <= 265 s
#   bash benchmarks/gpu/run.sh OUT setup rollout step rewards      # <= 210 s with the build kept
#
# --smoke runs every phase on the CPU at tiny sizes (Triton interpreted), through the same commands,
# with the limits scaled by SMOKE_SCALE (default 4): a rehearsal of the script itself. Wheels the GPU
# machine lacks (diffusers, open-clip-torch and their dependency closure) travel in .gpu-wheels/
# (benchmarks/gpu/fetch_wheels.sh; the device tool's carry).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT_DIR [--smoke] [PHASE ...]}
shift
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then
  SMOKE=1
  shift
fi
ALL=(setup kernels ops denoise rollout step rewards)
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=("${ALL[@]}")
declare -A LIMIT=([setup]=100 [kernels]=75 [ops]=60 [denoise]=30 [rollout]=50 [step]=120 [rewards]=30)
for phase in "${PHASES[@]}"; do
  [ -n "${LIMIT[$phase]:-}" ] || { echo "run.sh: unknown phase '$phase', expected some of: ${ALL[*]}" >&2; exit 2; }
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STATUS="$OUT/status.txt"

run_limited() {  # run_limited NAME SECONDS CMD...: time-limited, logged; a failure does not stop the run
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start)) limit=$limit" | tee -a "$STATUS"
  tail -n 15 "$OUT/$name.log"
}

SCALE=1
if [ $SMOKE = 1 ]; then
  SCALE=${SMOKE_SCALE:-4}  # a CPU runs the kernel tests far slower than the GPU the limits are for
  DEV=cpu
  export TRITON_INTERPRET=1 MARGRPO_TEST_THREADS=1
  OPS=(--shapes nova --min-time 0.02 --no-compile)
  DENOISE=(--cases nova-d3w1280 --tokens 8 --steps 2 --repeats 1 --methods fused,eager)
  ROLLOUT=(--models tiny,nova --batch 1 --tokens 16 --mask-steps 3 --diffusion-steps 2 --repeats 1)
  TINY=(--tiny)
  REWARDS=(--device cpu --size tiny --batch 2 --image-size 64 --repeats 1 --rewards jpeg_compressibility)
else
  DEV=cuda
  OPS=(--shapes nova,steps-x16 --min-time 0.05)
  DENOISE=(--repeats 3)
  ROLLOUT=(--mask-steps 16 --repeats 1)
  TINY=()
  REWARDS=(--device cuda --size full --dtype bfloat16 --rewards hps,pickscore,aesthetic,jpeg_compressibility)
fi

setup() {
  if python -c "import torch, margrpo.kernels, margrpo._C" 2>/dev/null; then
    echo "margrpo and its extension import: nothing to build"
  elif [ $SMOKE = 1 ]; then
    echo "smoke: margrpo must already be installed here (scripts/setup.sh)" >&2
    return 1
  else
    if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
      python -m pip install --no-index --find-links .gpu-wheels diffusers open_clip_torch ftfy || return 1
    fi
    # --no-deps keeps the machine's torch/triton; setup.py builds the CUDA kernels for the visible GPU
    MAX_JOBS=16 python -m pip install --no-deps --no-build-isolation -e . || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
  fi
  python - <<'PY'
import torch, margrpo.ops as ops
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
print("backends", ops.available_backends())
PY
}

kernels() {  # every backend that runs here against the float64 references
  python -m pytest -q -x -m "not slow" -p no:cacheprovider \
    tests/test_ops_gaussian_logprob.py tests/test_ops_trajectory_std.py tests/test_ops_topk.py \
    tests/test_ops_consistency.py tests/test_ops_grpo_surrogate.py tests/test_triton_kernels.py tests/test_extension.py \
    tests/test_heads.py tests/test_host_syncs.py
}

step_phase() {  # one GRPO step, NOVA then Harmon, each within half the phase's limit
  local half=$((LIMIT[step] / 2))  # run_limited applies SCALE
  run_limited step_nova "$half" python benchmarks/gpu/nova.py --out "$OUT" "${TINY[@]}"
  run_limited step_harmon "$half" python benchmarks/gpu/harmon.py --out "$OUT" "${TINY[@]}"
}

for phase in "${PHASES[@]}"; do
  case $phase in
    setup) export -f setup; export OUT SMOKE; run_limited setup "${LIMIT[setup]}" bash -c setup ;;
    kernels) export -f kernels; run_limited kernels "${LIMIT[kernels]}" bash -c kernels ;;
    ops) run_limited ops "${LIMIT[ops]}" python -m margrpo.bench.ops --device "$DEV" "${OPS[@]}" --json "$OUT/ops.json" ;;
    denoise) run_limited denoise "${LIMIT[denoise]}" python -m margrpo.bench.denoise --device "$DEV" "${DENOISE[@]}" \
      --json "$OUT/denoise.json" ;;
    rollout) run_limited rollout "${LIMIT[rollout]}" python -m margrpo.bench.rollout --device "$DEV" "${ROLLOUT[@]}" \
      --json "$OUT/rollout.json" ;;
    step) step_phase ;;
    rewards) run_limited rewards "${LIMIT[rewards]}" python -m margrpo.bench.rewards "${REWARDS[@]}" --json "$OUT/rewards.json" ;;
  esac
done
python benchmarks/gpu/summarize.py "$OUT" | tee "$OUT/summary.md"

"""NOVA-0.6B @512 on the GPU: rollout images/s and one GRPO step, fused vs reference-style (bf16,
random init at the real sizes; margrpo.bench.models.bench_nova). Writes OUT/nova.json after every row.

    python benchmarks/gpu/nova.py --out OUT            # CUDA, real sizes, 64 mask steps (about 2 minutes on an H200)
    python benchmarks/gpu/nova.py --out OUT --mask-steps 16 --record-mask-steps 3   # the GPU script's cut (~35 s)
    python benchmarks/gpu/nova.py --out OUT --tiny     # the tiny preset on CPU: checks this script
    python benchmarks/gpu/nova.py --out OUT --cpu --mask-steps 16 --record-mask-steps 3 --group-size 2 \
        --warmup-mask-steps 3 --step-only --repeats 3  # the real sizes on a CPU (minutes per step)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

TARGET_GRPO_SPEEDUP = 3.0  # the target for the fused GRPO step


def run(out_dir: str | Path, tiny: bool = False, cpu: bool = False, **overrides) -> dict:
    """Benchmark NOVA, write out_dir/nova.json (rewritten after every row) and return its content (plus
    `meets_target`). cpu: the real sizes on the CPU even where CUDA is there. overrides:
    NovaBenchSettings fields (mask_steps, record_mask_steps, repeats, ...)."""
    from margrpo.bench.machine import JsonReport
    from margrpo.bench.models import NovaBenchSettings, bench_nova

    device = torch.device("cuda" if torch.cuda.is_available() and not (tiny or cpu) else "cpu")
    if device.type == "cpu" and not (tiny or cpu):
        raise RuntimeError(
            "benchmarks/gpu/nova.py: no CUDA device; run with --tiny for the CPU check or --cpu for the real sizes on the CPU"
        )
    settings = NovaBenchSettings.tiny() if tiny else NovaBenchSettings()
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = JsonReport(str(out / "nova.json"), device, settings=dataclasses.asdict(settings))
    result = bench_nova(device, settings, on_row=report.add)
    result["meets_target"] = result["speedup"]["grpo_step"] >= TARGET_GRPO_SPEEDUP
    (out / "nova.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def format_table(result: dict) -> str:
    lines = [f"{'what':<10} {'path':<10} {'ms':>10} {'img/s':>8} {'peak GiB':>9}"]
    lines += [f"{r['what']:<10} {r['path']:<10} {r['ms']:>10.1f} {r['images_per_s']:>8.3f} {r['peak_gib']:>9.2f}" for r in result["rows"]]
    for what, ratio in result["speedup_rounds"].items():
        lines.append(
            f"speedup vs reference, {what}: {ratio['p50']:.2f}x [p20 {ratio['p20']:.2f}, p80 {ratio['p80']:.2f}] over "
            f"{len(ratio['per_round'])} interleaved rounds"
        )
    lines.append(f"GRPO step target >= {TARGET_GRPO_SPEEDUP:g}x: {'met' if result['meets_target'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (nova.json)")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset on CPU")
    parser.add_argument("--cpu", action="store_true", help="the real sizes on the CPU (all its cores)")
    parser.add_argument("--group-size", type=int, help="images per prompt (default: 4)")
    parser.add_argument("--step-only", action="store_true", help="time the GRPO step only, not the rollout alone")
    parser.add_argument("--mask-steps", type=int, help="mask steps S of the timed rollout and step (default: 64)")
    parser.add_argument("--record-mask-steps", type=int, help="recorded (trained) mask steps (default: 12)")
    parser.add_argument("--warmup-mask-steps", type=int, help="mask steps of the warm-up calls (default: 8)")
    parser.add_argument("--repeats", type=int, help="interleaved timed rounds per path (default: 1)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="model dtype (default: bfloat16, float32 with --tiny; --tiny --dtype bfloat16 rehearses the GPU's)",
    )
    parser.add_argument("--autocast", action="store_true", help="the GRPO step under bf16 autocast on CPU too (as on CUDA)")
    parser.add_argument(
        "--compile-head",
        choices=("auto", "true", "false"),
        help="the fused rollout's rollout.compile_head (default auto: the head compiled on CUDA, not on a CPU)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        torch.set_num_threads(1)
    print(
        format_table(
            run(
                args.out,
                tiny=args.tiny,
                cpu=args.cpu,
                group_size=args.group_size,
                time_rollout=False if args.step_only else None,
                mask_steps=args.mask_steps,
                record_mask_steps=args.record_mask_steps,
                warmup_mask_steps=args.warmup_mask_steps,
                repeats=args.repeats,
                dtype=args.dtype,
                bf16=True if args.autocast else None,
                compile_head={"true": True, "false": False}.get(args.compile_head, args.compile_head),
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

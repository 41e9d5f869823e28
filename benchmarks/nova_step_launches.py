"""How many kernel launches, host syncs and host-to-device copies one NOVA GRPO step issues, fused vs
reference-style (the two paths of margrpo.bench.models.bench_nova), split into the rollout and the
rest of the step (reward, likelihoods, KL reference, backward, optimizer).

On a GPU each ATen op is about one kernel launch and costs the host a few microseconds whatever its
size, so a path that issues many small ops runs at a low MFU there even when its FLOPs are few. The
counts need no GPU (margrpo.bench.op_counts on CPU tensors; a margrpo op counts as one launch, its
Triton or CUDA kernel being one) and hardly depend on the image size, so the default is the
architecture at toy sizes (nova-tiny) with the GPU script's recipe (16 mask steps, 3 recorded, 25
diffusion steps, K = 3, guidance 5, 4 images). The backbone's share grows with its depth: count at
the real size with --preset nova-0.6b-random (minutes on a CPU).

    python benchmarks/nova_step_launches.py [--preset nova-tiny] [--mask-steps 16] [--json FILE]

CPU caveats: AdamW's per-parameter step counter is read on the host on a CPU (one sync per parameter
and optimizer step; a CUDA run keeps it on the host without a sync), so "syncs" includes those.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch


def count_step(
    preset: str = "nova-tiny", mask_steps: int = 16, record_mask_steps: int = 3, group_size: int = 4, diffusion_steps: int = 25
) -> dict:
    """{path: {"step": counts, "rollout": counts, "update": counts, "top_update_ops": [...]}} of the
    second step of each path (the first warms caches up: argument plans, sampler tables)."""
    from margrpo.bench import models
    from margrpo.bench.op_counts import count_ops
    from margrpo.models import nova
    from margrpo.rollout import choose_plan, mask_schedule
    from margrpo.train import step as train_step

    settings = models.NovaBenchSettings(
        preset=preset,
        dtype="float32",
        mask_steps=mask_steps,
        record_mask_steps=record_mask_steps,
        group_size=group_size,
        diffusion_steps=diffusion_steps,
        bf16=False,
    )
    device = torch.device("cpu")
    backbone = nova.build(settings.preset, device=device, dtype=settings.dtype, seed=0)
    sampler = backbone.make_sampler(settings.diffusion_steps)
    prompts = settings.batch_prompts
    config = settings.rollout_config()
    counts = mask_schedule(backbone.num_tokens, config.num_mask_steps, "nova")
    plan = choose_plan(counts, sampler, config.record_mask_steps, config.record_diffusion_steps, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    rollouts = {}

    def counted(module, name: str, path: str):  # the rollout's own counts, inside the step's
        original = getattr(module, name)

        def call(*args, **kwargs):
            with count_ops() as inner:
                out = original(*args, **kwargs)
            rollouts[path] = inner
            return out

        return original, call

    originals = [(train_step, "generate", *counted(train_step, "generate", "fused"))]
    originals.append((models, "nova_reference_rollout", *counted(models, "nova_reference_rollout", "reference")))
    for module, name, _, call in originals:
        setattr(module, name, call)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            trainer = models._nova_trainer(backbone, settings, device, Path(workdir))
            optimizer = torch.optim.AdamW(trainer.policy.trainable_parameters(), lr=1e-6)
            steps = {
                "fused": trainer.train_step,
                "reference": lambda: models.trainer_reference_step(trainer, optimizer, prompts, config, sampler, plan, generator),
            }
            totals = {}
            for _ in range(2):
                for path, step in steps.items():
                    with count_ops() as total:
                        step()
                    totals[path] = total
    finally:
        for module, name, original, _ in originals:
            setattr(module, name, original)
    from margrpo.bench.machine import machine_description

    report: dict = {
        "machine": machine_description(device),
        "settings": {
            "preset": preset,
            "mask_steps": mask_steps,
            "record_mask_steps": record_mask_steps,
            "group_size": group_size,
            "diffusion_steps": diffusion_steps,
        },
    }
    for path, total in totals.items():
        rollout = rollouts[path]
        update_ops = Counter(total.ops)
        update_ops.subtract(rollout.ops)
        kinds = ("launches", "syncs", "host_to_device")
        report[path] = {
            "step": {k: getattr(total, k) for k in kinds},
            "rollout": {k: getattr(rollout, k) for k in kinds},
            "update": {k: getattr(total, k) - getattr(rollout, k) for k in kinds},
            "top_update_ops": update_ops.most_common(12),
        }
    return report


def format_table(report: dict) -> str:
    lines = ["| path | part | launches | syncs | host-to-device |", "|---|---|---:|---:|---:|"]
    for path in ("fused", "reference"):
        for part in ("rollout", "update", "step"):
            c = report[path][part]
            lines.append(f"| {path} | {part} | {c['launches']} | {c['syncs']} | {c['host_to_device']} |")
    for part in ("rollout", "update", "step"):
        ratio = report["reference"][part]["launches"] / max(1, report["fused"][part]["launches"])
        lines.append(f"reference / fused launches, {part}: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="nova-tiny")
    parser.add_argument("--mask-steps", type=int, default=16)
    parser.add_argument("--record-mask-steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--diffusion-steps", type=int, default=25)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = count_step(args.preset, args.mask_steps, args.record_mask_steps, args.group_size, args.diffusion_steps)
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

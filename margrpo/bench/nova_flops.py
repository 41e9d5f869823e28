"""FLOPs of one NOVA-0.6B GRPO step per phase, fused vs reference-style, counted on the meta device (no
compute: torch.utils.flop_counter.FlopCounterMode over each unit of work at the real sizes, then the
step composed from the units; issue 26, item 4).

Units (nova-0.6b-random @512: 1024 tokens x 16 channels, head mlp_d3w1280): encode_prompts; one
forward_z of one image with [cond; uncond] rows (rollout) and with one row (unguided likelihood), its
backward; the head per row and diffusion step: the official forward (modulation recomputed per call),
the fused path's modulation (once per token, step and CFG half) and denoise (per row), and the head's
forward + backward to z; the VAE decoder per image. The step then counts, for the recipe of
margrpo.bench.models.NovaBenchSettings (B images, S mask steps, T diffusion steps, K seed chains, CFG,
M recorded mask steps x R recorded diffusion steps, likelihood over the positions unknown before a
recorded step, the reference code's algorithm), how often each unit runs on each path:

  reference  the head denoises all N tokens of every image at every mask step, K + 1 chains x 2 CFG
             halves x T steps, the official forward each; the likelihood, the KL reference and the
             backward evaluate all N tokens x (K + 1) x R per recorded step
  fused      the head denoises only the tokens a step needs (its revealed ones; every unknown one at a
             recorded step, and, main chain only past its revealed ones, at the step before it:
             consistency; the seed chains past a recorded step's revealed ones only for the MTE tokens
             where the trainer defers them, which the benchmark's algorithm, drawing a random MTE
             position in the update, does not: bench_defers_seed_chains), the modulation
             once per token, step and half; the likelihood and the KL reference evaluate the unknown
             positions only, the likelihood the K seeds at the MTE tokens only, the KL reference
             trajectory 0 alone (all each term reads)

The backbone (rollout forwards, likelihood forward and backward, the KL reference's forward), the VAE
and the optimizer are the same work on both paths. Elementwise work (sampler arithmetic, AdamW) counts 0.

    python -m margrpo.bench.nova_flops [--mask-steps 64 --record-mask-steps 12 --group-size 4 ...] [--json F]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode


def _flops(fn) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def units(preset: str = "nova-0.6b-random", dtype: str = "bfloat16") -> dict[str, float]:
    """FLOPs of each unit at the preset's real sizes, on the meta device."""
    from margrpo.models import nova

    backbone = nova.build(preset, device="meta", dtype=dtype)
    N, C, head = backbone.num_tokens, backbone.token_channels, backbone.head
    wdtype = next(head.parameters()).dtype
    prompts1 = backbone.encode_prompts(["a photo of a cat on a sofa"])
    prompts2 = backbone.encode_prompts(["a photo of a cat on a sofa", ""])

    def forward(rows: int, known_count: int = N // 2):
        canvas = torch.zeros(rows, N, C, device="meta", dtype=wdtype)
        known = torch.zeros(rows, N, dtype=torch.bool, device="meta")
        return backbone.forward_z(prompts2 if rows == 2 else prompts1, canvas, known, known_count)

    out: dict[str, float] = {"tokens": float(N), "trainable_params": float(sum(p.numel() for p in backbone.trainable_parameters()))}
    out["encode_prompt"] = _flops(lambda: backbone.encode_prompts(["a photo of a cat on a sofa"]))
    with torch.no_grad():
        out["forward_z_cfg_image"] = _flops(lambda: forward(2))
    for p in backbone.trainable_parameters():
        p.requires_grad_(True)
    z_holder: list[torch.Tensor] = []
    out["forward_z_row_grad"] = _flops(lambda: z_holder.append(forward(1)))
    out["backward_z_row"] = _flops(lambda: z_holder[0].float().sum().backward())

    rows = 64
    x = torch.zeros(rows, head.in_channels, device="meta", dtype=wdtype)
    zc = torch.zeros(rows, head.z_channels, device="meta", dtype=wdtype)
    t = torch.zeros(rows, device="meta")
    for p in head.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        out["head_official_row_step"] = _flops(lambda: head(x, t, zc)) / rows
        cond = head.embed_condition(zc)
        out["head_embed_token"] = _flops(lambda: head.embed_condition(zc)) / rows
        out["head_modulation_token_step"] = _flops(lambda: head.modulation(cond, t[:1].reshape(1, 1))) / rows
        modulation = head.modulation(cond, t[:1].reshape(1, 1))
        out["head_denoise_row_step"] = _flops(lambda: head.denoise(x, modulation)) / rows
    zg = zc.clone().requires_grad_(True)
    held: list[torch.Tensor] = []
    out["head_official_row_step_grad"] = _flops(lambda: held.append(head(x, t, zg))) / rows
    out["head_backward_row_step"] = _flops(lambda: held[0].float().sum().backward()) / rows
    with torch.no_grad():
        latents = torch.zeros(1, N, C, device="meta", dtype=wdtype)
        out["decode_image"] = _flops(lambda: backbone.decode(latents))
    return out


@dataclasses.dataclass
class Recipe:
    images: int = 4
    mask_steps: int = 64
    diffusion_steps: int = 25
    num_seeds: int = 3
    record_mask_steps: int = 12
    record_diffusion_steps: int = 10
    mte_ratio: float = 0.3  # the seed trajectories are scored at this share of the likelihood's positions
    seed: int = 0


def fused_rollout_head_work(
    counts: list[int], recorded: set[int], trajectories: int, seed_share: float | None = None
) -> tuple[float, float]:
    """(tokens, token chains) the fused rollout's head processes for one image, summed over the
    effective mask steps of the schedule `counts` with mask steps `recorded` (likelihood over every
    unknown position, consistency predictions on): tokens are conditioned once per step (time
    embedding and modulation), chains are denoised (`trajectories` = K + 1 per token, but at the step
    before a recorded one only the main chain where no token is committed). seed_share: None, every
    chain of a recorded step in one call; a share (the trainer under MTE: the MTE ratio, on
    average), the seed chains past the committed tokens deferred, run for that share of them in a
    call of their own (conditioned again)."""
    N, steps = sum(counts), [s for s, n in enumerate(counts) if n > 0]
    before_recorded = {steps[i - 1] for i in range(1, len(steps)) if steps[i] in recorded}
    tokens = chains = start = 0
    for s in steps:
        unknown, n = N - start, counts[s]
        if s in recorded and seed_share is not None:
            later = seed_share * (unknown - n)  # the deferred call's tokens
            tokens, chains = tokens + unknown + later, chains + trajectories * n + (unknown - n) + (trajectories - 1) * later
        elif s in recorded:
            tokens, chains = tokens + unknown, chains + trajectories * unknown
        elif s in before_recorded:
            tokens, chains = tokens + unknown, chains + trajectories * n + unknown - n
        else:
            tokens, chains = tokens + n, chains + trajectories * n
        start += n
    return tokens, chains


def bench_defers_seed_chains(r: Recipe) -> bool:
    """Whether the benchmark's fused step (margrpo.bench.models.bench_nova: the trainer with the
    reference code's algorithm) defers the seed chains past a recorded step's committed tokens: the
    trainer's own rule (train.step.deferred_seed_selection) on the benchmark's config."""
    from pathlib import Path

    from margrpo.bench.models import NovaBenchSettings, nova_bench_config
    from margrpo.train.step import deferred_seed_selection

    settings = NovaBenchSettings(
        prompts=1,
        group_size=r.images,
        mask_steps=r.mask_steps,
        diffusion_steps=r.diffusion_steps,
        num_seeds=r.num_seeds,
        record_mask_steps=r.record_mask_steps,
        record_diffusion_steps=r.record_diffusion_steps,
    )
    return deferred_seed_selection(nova_bench_config(settings, torch.device("cpu"), Path("."))) is not None


def step_flops(u: dict[str, float], r: Recipe) -> dict[str, dict[str, float]]:
    """Per phase FLOPs of one step on each path (the reference's structure, module docstring)."""
    from margrpo.diffusion import DDPMSampler
    from margrpo.rollout import choose_plan, effective_steps, mask_schedule

    N, B, T, K1, R, M = int(u["tokens"]), r.images, r.diffusion_steps, r.num_seeds + 1, r.record_diffusion_steps, r.record_mask_steps
    counts = mask_schedule(N, r.mask_steps, "nova")
    steps = effective_steps(counts)
    sampler = DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing")
    M = min(M, len(steps))
    plan = choose_plan(counts, sampler, M, R, torch.Generator().manual_seed(r.seed))
    recorded = set(plan.mask_steps)
    seed_share = r.mte_ratio if bench_defers_seed_chains(r) else None
    fused_rows, fused_chains = fused_rollout_head_work(counts, recorded, K1, seed_share)
    starts = {s: sum(counts[:s]) for s in steps}
    unknown = sum(N - starts[s] for s in recorded)  # likelihood positions over the recorded steps (per image)
    den, mod, off = u["head_denoise_row_step"], u["head_modulation_token_step"], u["head_official_row_step"]
    head_bwd_ratio = u["head_backward_row_step"] / u["head_official_row_step_grad"]
    common = {
        # the rollout's B prompts and the negative one, then per recorded step the policy's and the reference's B
        "prompts": (B + 1 + 2 * M * B) * u["encode_prompt"],
        "rollout backbone": len(steps) * B * u["forward_z_cfg_image"],
        "decode": B * u["decode_image"],
        "likelihood backbone (grad)": M * B * u["forward_z_row_grad"],
        "backward (backbone)": M * B * u["backward_z_row"],
        "KL reference backbone": M * B * u["forward_z_row_grad"],
    }
    reference = dict(common)
    reference["rollout head"] = len(steps) * B * N * K1 * 2 * T * off
    reference["likelihood head (grad)"] = M * B * N * K1 * R * off
    reference["backward (head, to z)"] = M * B * N * K1 * R * off * head_bwd_ratio
    reference["KL reference head"] = M * B * N * K1 * R * off
    fused = dict(common)
    fused["rollout head"] = B * (fused_chains * 2 * T * den + fused_rows * (2 * T * mod + 2 * u["head_embed_token"]))
    # trajectory 0 at every likelihood position; the K seeds (a second head call, its own modulation)
    # at the MTE tokens only: a share mte_ratio of them on average (the top-k by uncertainty over the
    # image, the generation order independent of it)
    seed_positions = r.mte_ratio * unknown
    fused["likelihood head (grad)"] = B * R * (unknown * (den + mod) + seed_positions * ((K1 - 1) * den + mod))
    fused["backward (head, to z)"] = B * R * (unknown + seed_positions * (K1 - 1)) * den * head_bwd_ratio
    fused["KL reference head"] = B * unknown * (R * den + R * mod)  # trajectory 0: all the KL reads
    return {
        "reference": reference,
        "fused": fused,
        "counts": {
            "effective_mask_steps": len(steps),
            "fused_rollout_tokens_per_image": fused_rows,
            "fused_rollout_chains_per_image": fused_chains,
            "likelihood_positions_per_image": unknown,
            "seed_chains_deferred": seed_share is not None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m margrpo.bench.nova_flops", description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Recipe):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    recipe = Recipe(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Recipe)})
    u = units()
    result = step_flops(u, recipe)
    print(json.dumps(u, indent=1))
    print(f"recipe {dataclasses.asdict(recipe)}; {result['counts']}")
    print("| phase | reference TFLOP | fused TFLOP |\n|---|---:|---:|")
    for name in result["reference"]:
        print(f"| {name} | {result['reference'][name] / 1e12:.2f} | {result['fused'][name] / 1e12:.2f} |")
    tr, tf = sum(result["reference"].values()), sum(result["fused"].values())
    print(f"| **total** | {tr / 1e12:.2f} | {tf / 1e12:.2f} |  (reference / fused FLOPs: {tr / tf:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"units": u, "recipe": dataclasses.asdict(recipe), **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU benchmark piece for Harmon: the fused margrpo path against the reference code's way, end to end.

Both paths run the same random-init Harmon (harmon-1.5b-random, bf16) with the same schedule (64 mask
steps, "harmon"), CFG 3 on the eps channels, K = 5 seed trajectories, T diffusion steps and 12 x 10
recorded transitions; they differ in how the work is organised:

  fused      margrpo.rollout.generate (at each step only the revealed tokens, all 1 + K trajectories in
             one batched head pass sharing the modulation; only the planned transitions recorded), then
             one GRPO update, margrpo.grpo.update as the trainer runs it: the likelihood of the policy
             (with grad) and of the frozen reference (no grad) over the 12 recorded steps, the clipped
             loss + Gaussian KL, one backward, gradient clipping, one AdamW step
  reference  as AMAP-ML/mar-grpo does it: at each kept mask step the head denoises ALL tokens (one chain,
             the official per-call head forward), the K seed chains run after the rollout over all tokens
             under their commit-time z, one Python loop per seed; then, per kept mask step, a policy and a
             reference forward, per-seed log-prob loops over all tokens, a backward and an AdamW step

Reported: milliseconds per rollout and per GRPO step (rollout + update, rewards excluded), the speedup
of fused over reference, peak CUDA memory, and the S backbone passes of a rollout alone: they are
the same in both rollouts, so "head" (rollout minus backbone) isolates the work the paths organise
differently. Timing: median of `repeats` rounds after a warm-up (both GRPO steps on a short schedule),
the paths interleaved in each round (margrpo.bench.timing: CUDA events on a GPU); peak memory over
the timed calls of each path. The JSON is rewritten after the rollouts and after the steps.

    python benchmarks/gpu/harmon.py --tiny             # CPU, tiny dims, seconds
    python benchmarks/gpu/harmon.py --out results/     # the real-size run (H200: about a minute)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from margrpo.bench.machine import machine_description
from margrpo.grpo import GRPOConfig, update
from margrpo.heads import MultiSeedSamples
from margrpo.heads.upstream import eager_denoise_logprob, eager_multi_seed_denoise
from margrpo.models import harmon
from margrpo.rollout import RolloutConfig, choose_plan, effective_steps, generate, mask_schedule
from margrpo.rollout.guidance import guidance_for, head_condition, prompt_rows

PROMPTS = (
    "a photo of a cat sitting on a red sofa",
    "a blue car parked next to a tall tree",
    "two dogs playing in the snow",
    "a bowl of fruit on a wooden table",
)


@dataclasses.dataclass
class Setting:
    """One benchmark size."""

    preset: str
    dtype: torch.dtype
    batch: int  # images (one GRPO group)
    mask_steps: int
    diffusion_steps: int
    num_seeds: int
    record_mask_steps: int
    record_diffusion_steps: int
    repeats: int
    warmup_mask_steps: int  # the warm-up GRPO steps' schedule (every kernel runs; shorter than the timed one)


FULL = Setting(
    "harmon-1.5b-random",
    torch.bfloat16,
    batch=4,
    mask_steps=64,
    diffusion_steps=25,
    num_seeds=5,
    record_mask_steps=12,
    record_diffusion_steps=10,
    repeats=1,
    warmup_mask_steps=8,
)
TINY = Setting(
    "harmon-tiny",
    torch.float32,
    batch=2,
    mask_steps=4,
    diffusion_steps=4,
    num_seeds=2,
    record_mask_steps=2,
    record_diffusion_steps=2,
    repeats=1,
    warmup_mask_steps=3,
)


# ---------------------------------------------------------------------- the reference code's way
@torch.no_grad()
def reference_rollout(model, prompts: list[str], config: RolloutConfig, sampler, plan, generator: torch.Generator):
    """The reference rollout. -> (images, kept: {recorded j: (canvas, known, MultiSeedSamples of all N
    tokens, trajectory 0)}, seeds: MultiSeedSamples [all T steps, K, B*N] under commit-time z)."""
    B, N, C, K = len(prompts), model.num_tokens, model.token_channels, config.num_seeds
    device = model.mar.fake_latent.device
    rows = prompt_rows(model, prompts, config)
    counts = mask_schedule(N, config.num_mask_steps, config.schedule)
    recorded = {step: j for j, step in enumerate(plan.mask_steps)}
    order = torch.stack([torch.randperm(N, generator=generator, device=device) for _ in range(B)])
    canvas = torch.zeros(B, N, C, device=device)
    known = torch.zeros(B, N, dtype=torch.bool, device=device)
    every = torch.arange(N, device=device).expand(B, N)
    commit_z = None
    kept = {}
    start = 0
    for step in effective_steps(counts):
        n, j = counts[step], recorded.get(step)
        revealed = order[:, start : start + n]
        z = model.forward_z(rows.batch, canvas.repeat(rows.rows_per_image, 1, 1), known.repeat(rows.rows_per_image, 1))
        if commit_z is None:
            commit_z = torch.zeros_like(z)
        index = revealed.repeat(rows.rows_per_image, 1)[..., None].expand(-1, -1, z.shape[-1])
        commit_z.scatter_(1, index, z.gather(1, index))
        positions = every if j is not None else revealed
        noise = torch.randn(sampler.num_steps + 1, 1, positions.numel(), C, generator=generator, device=device)
        cfg = guidance_for(config, config.cfg_scale_at(start + n, N))
        out = eager_multi_seed_denoise(
            model.head,
            head_condition(z, rows, positions),
            sampler,
            0,
            noise,
            cfg=cfg,
            record_steps=plan.diffusion_steps[j] if j is not None else (),
        )
        values = out.x0[0].reshape(B, -1, C).to(canvas.dtype)
        if j is not None:
            kept[j] = (canvas.clone(), known.clone(), out)
            values = values.gather(1, revealed[..., None].expand(-1, -1, C))
        canvas.scatter_(1, revealed[..., None].expand(-1, -1, C), values)
        known.scatter_(1, revealed, True)
        start += n
    # the K seed chains after the rollout: all tokens under their commit-time z, one loop per seed
    cfg = guidance_for(config, config.cfg_scale)
    all_rows = head_condition(commit_z, rows, every)
    chains = []
    for _ in range(K):
        noise = torch.randn(sampler.num_steps + 1, 1, B * N, C, generator=generator, device=device)
        chains.append(eager_multi_seed_denoise(model.head, all_rows, sampler, 0, noise, cfg=cfg, record_steps=range(sampler.num_steps)))
    seeds = MultiSeedSamples(
        torch.cat([c.x0 for c in chains]),
        chains[0].steps,
        *(torch.cat([getattr(c, f) for c in chains], 0) for f in ("x_t", "x_prev", "mean", "std", "logp")),
    )
    return model.decode(canvas), kept, seeds


def _subset(record: MultiSeedSamples, steps: tuple[int, ...]) -> MultiSeedSamples:
    rows = [record.steps.index(i) for i in steps]
    picked = {f: getattr(record, f)[:, rows] for f in ("x_t", "x_prev", "mean", "std", "logp")}
    return MultiSeedSamples(record.x0, tuple(steps), **picked)


def reference_update(
    model,
    reference,
    optimizer,
    prompts: list[str],
    config: RolloutConfig,
    sampler,
    plan,
    kept,
    seeds,
    advantages: torch.Tensor,
    kl_beta: float = 0.01,
) -> None:
    """The reference update: per kept mask step, the unguided policy and reference z of all tokens,
    per-seed log-prob loops, REINFORCE + k3 KL on log-probs, backward and an optimizer step.

    Each trajectory's head graph is freed right after its backward into a detached z (then z's
    gradient goes through the backbone once): the same gradient as the reference's single backward
    with less memory, so the measured reference is, if anything, faster than the original."""
    rows = prompt_rows(model, prompts, config, guided=False)
    ref_rows = prompt_rows(reference, prompts, config, guided=False)
    B, N = len(prompts), model.num_tokens
    adv = advantages.repeat_interleave(N)
    for j in sorted(kept):
        canvas, known, main = kept[j]
        optimizer.zero_grad(set_to_none=True)
        z = model.forward_z(rows.batch, canvas, known).reshape(B * N, -1)
        z_leaf = z.detach().requires_grad_(True)
        with torch.no_grad():
            z_ref = reference.forward_z(ref_rows.batch, canvas, known).reshape(B * N, -1)
        records = [
            main,
            *(
                _subset(dataclasses.replace(seeds, x_t=seeds.x_t[k : k + 1], x_prev=seeds.x_prev[k : k + 1]), plan.diffusion_steps[j])
                for k in range(seeds.x_t.shape[0])
            ),
        ]
        for record in records:  # one Python loop per trajectory, as the reference scores its seeds
            logp = eager_denoise_logprob(model.head, z_leaf, sampler, record)[0]  # [R, B*N]
            with torch.no_grad():
                ref_logp = eager_denoise_logprob(reference.head, z_ref, sampler, record)[0]
            delta = ref_logp - logp
            kl = torch.exp(delta) - delta - 1
            loss = (-(torch.exp(logp - logp.detach()) * adv) + kl_beta * kl).mean() / len(records)
            loss.backward()
        z.backward(z_leaf.grad)
        optimizer.step()


# ---------------------------------------------------------------------- the fused path
def fused_update(model, reference, optimizer, rollout, advantages: torch.Tensor, kl_beta: float = 0.01) -> None:
    """One GRPO update by margrpo.grpo.update, the trainer's (guided likelihood, clipped ratio,
    Gaussian KL, gradient clip 1), with the default algorithm switches."""
    result = update(model, reference, rollout, advantages, GRPOConfig(kl_beta=kl_beta), optimizer)
    if result.skipped:
        raise RuntimeError(f"fused update: non-finite {result.skipped}")


# ---------------------------------------------------------------------- driver
@torch.no_grad()
def backbone_only(model, prompts: list[str], config: RolloutConfig) -> None:
    """The S forward_z calls of a guided rollout alone (the same in both paths), on a random canvas."""
    B, N, C = len(prompts), model.num_tokens, model.token_channels
    device = model.mar.fake_latent.device
    rows = prompt_rows(model, prompts, config)
    canvas = torch.randn(rows.rows_per_image * B, N, C, device=device)
    known = torch.zeros(rows.rows_per_image * B, N, dtype=torch.bool, device=device)
    start = 0
    for n in mask_schedule(N, config.num_mask_steps, config.schedule):
        model.forward_z(rows.batch, canvas, known)
        known[:, start : start + n] = True
        start += n


def run(out_dir: str | Path, tiny: bool = False, device: str | torch.device | None = None, **overrides) -> dict:
    """Time both paths; write `out_dir`/harmon.json (harmon-tiny.json for tiny) after each measured pair
    of paths and at the end, and return the final dict. overrides: Setting fields (mask_steps,
    record_mask_steps, warmup_mask_steps, repeats; None keeps the setting's value)."""
    from margrpo.bench.machine import JsonReport
    from margrpo.bench.models import with_peak
    from margrpo.bench.compiles import warn_if_compiled
    from margrpo.bench.timing import interleave, synchronize

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    setting = dataclasses.replace(TINY if tiny else FULL, **{k: v for k, v in overrides.items() if v is not None})
    began = time.perf_counter()
    model = harmon.build(setting.preset, device=device, dtype=setting.dtype)
    reference = copy.deepcopy(model).requires_grad_(False)
    model.requires_grad_(False)
    trainable = model.trainable_parameters()
    for p in trainable:
        p.requires_grad_(True)
    print(f"[harmon] built {setting.preset} ({setting.dtype}) in {time.perf_counter() - began:.1f} s", flush=True)
    # lr 0: the optimizer does all its work but the weights stay put, so the interleaved timed rounds of
    # both paths run on the same model (compounding updates of two paths made the tiny model diverge)
    optimizer = torch.optim.AdamW(trainable, lr=0.0)
    sampler = model.make_sampler(setting.diffusion_steps)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(setting.batch)]
    seeds = list(range(setting.batch))
    advantages = torch.linspace(-1, 1, setting.batch, device=device)
    generator = torch.Generator(device=device).manual_seed(0)

    def schedule(mask_steps: int):
        """(rollout config, plan) of a schedule of `mask_steps` mask steps."""
        counts = mask_schedule(model.num_tokens, mask_steps, "harmon")
        record = min(setting.record_mask_steps, len(effective_steps(counts)) - 1)
        config = RolloutConfig(
            num_mask_steps=mask_steps,
            schedule="harmon",
            cfg_scale=3.0,
            cfg_channels="eps",
            num_seeds=setting.num_seeds,
            record_mask_steps=record,
            record_diffusion_steps=setting.record_diffusion_steps,
        )
        plan = choose_plan(counts, sampler, record, setting.record_diffusion_steps, torch.Generator().manual_seed(0))
        return config, plan

    def fused_rollout(config, plan):
        model.eval()
        return generate(model, prompts, config, seeds, sampler=sampler, plan=plan)

    def fused_step(config, plan):
        rollout = fused_rollout(config, plan)
        model.train()
        fused_update(model, reference, optimizer, rollout, advantages)

    def ref_rollout(config, plan):
        model.eval()
        return reference_rollout(model, prompts, config, sampler, plan, generator)

    def ref_step(config, plan):
        _, kept, chains = ref_rollout(config, plan)
        model.train()
        reference_update(model, reference, optimizer, prompts, config, sampler, plan, kept, chains, advantages)

    full, short = schedule(setting.mask_steps), schedule(min(setting.warmup_mask_steps, setting.mask_steps))
    # warm-up: both GRPO steps on the short schedule (they run every rollout, backbone and update kernel)
    start = time.perf_counter()
    fused_step(*short)
    ref_step(*short)
    synchronize(device)
    model.eval()
    print(f"[harmon] warm-up {time.perf_counter() - start:.1f} s", flush=True)

    name = "harmon-tiny.json" if tiny else "harmon.json"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    setting_json = {k: str(v) if isinstance(v, torch.dtype) else v for k, v in dataclasses.asdict(setting).items()}
    setting_json["head_compiled"] = full[0].compiles_head(device)  # rollout.compile_head (auto: on CUDA)
    report = JsonReport(str(out / name), device, benchmark="harmon", setting=setting_json)
    ms: dict[str, float] = {}
    peaks: dict[str, float] = {}
    compiles: dict[str, dict] = {}
    # interleaved timed rounds, the rollouts (with the S backbone passes alone) then the GRPO steps
    for what, paths in (
        (
            "rollout",
            {
                "backbone": lambda: backbone_only(model, prompts, full[0]),
                "fused_rollout": lambda: fused_rollout(*full),
                "ref_rollout": lambda: ref_rollout(*full),
            },
        ),
        ("step", {"fused_step": lambda: fused_step(*full), "ref_step": lambda: ref_step(*full)}),
    ):
        timings = interleave(
            {k: with_peak(fn, device, peaks, k) for k, fn in paths.items()},
            device,
            min_time_s=0.0,
            warmup=0,
            min_rounds=setting.repeats,
            max_rounds=setting.repeats,
        )
        model.eval()
        timed = {k: timings.stats(k).p50 for k in paths}
        ms.update(timed)
        compiles.update(timings.compiles)
        for line in warn_if_compiled(timings.compiles, f"[harmon] {what}"):
            print(line, flush=True)
        for key, value in timed.items():
            path = key.split("_")[0]
            row = {
                "what": what,
                "path": {"ref": "reference"}.get(path, path),
                "images": setting.batch,
                "ms": value,
                "images_per_s": setting.batch / (value / 1e3),
                "peak_mb": peaks[key] * 1024 if device.type == "cuda" else None,
                "compiles_while_timed": timings.compiles[key],
            }
            print(f"[harmon] {what:<8} {row['path']:<10} {value:10.1f} ms", flush=True)
            report.add(row)
    mb = {k: (peaks[k] * 1024 if device.type == "cuda" else None) for k in peaks}
    result = {
        "benchmark": "harmon",
        "setting": setting_json,
        "machine": machine_description(device),
        "backbone_ms": ms["backbone"],
        "fused_rollout_ms": ms["fused_rollout"],
        "reference_rollout_ms": ms["ref_rollout"],
        "fused_step_ms": ms["fused_step"],
        "reference_step_ms": ms["ref_step"],
        "rollout_speedup": ms["ref_rollout"] / ms["fused_rollout"],
        # the head's share of a rollout: what the two rollouts do differently
        "head_speedup": (ms["ref_rollout"] - ms["backbone"]) / max(ms["fused_rollout"] - ms["backbone"], 1e-9),
        "step_speedup": ms["ref_step"] / ms["fused_step"],
        "fused_rollout_peak_mb": mb["fused_rollout"],
        "reference_rollout_peak_mb": mb["ref_rollout"],
        "fused_step_peak_mb": mb["fused_step"],
        "reference_step_peak_mb": mb["ref_step"],
        "compiles_while_timed": compiles,
        "wall_s": time.perf_counter() - began,
        "rows": report.rows,
    }
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    return result


def format_table(result: dict) -> str:
    """A short text table of a run() result."""
    lines = [
        f"Harmon ({result['setting']['preset']}, {result['machine']['device']})",
        f"{'':<10} {'fused ms':>10} {'ref ms':>10} {'speedup':>8}",
    ]
    for part in ("rollout", "step"):
        lines.append(
            f"{part:<10} {result[f'fused_{part}_ms']:>10.1f} {result[f'reference_{part}_ms']:>10.1f} {result[f'{part}_speedup']:>7.2f}x"
        )
    lines.append(
        f"{'head':<10} {result['fused_rollout_ms'] - result['backbone_ms']:>10.1f} "
        f"{result['reference_rollout_ms'] - result['backbone_ms']:>10.1f} {result['head_speedup']:>7.2f}x"
        f"   (rollout minus the {result['backbone_ms']:.1f} ms of its S backbone passes)"
    )
    if result["fused_step_peak_mb"] is not None:
        lines.append(f"step peak MB {result['fused_step_peak_mb']:>8.0f} {result['reference_step_peak_mb']:>10.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny dims on the CPU (a smoke run)")
    parser.add_argument("--out", default="benchmarks/results", help="directory for harmon.json / harmon-tiny.json")
    parser.add_argument("--device", default=None)
    parser.add_argument("--mask-steps", type=int, help="mask steps S of the timed rollouts and steps (default: 64)")
    parser.add_argument("--record-mask-steps", type=int, help="recorded (trained) mask steps (default: 12)")
    parser.add_argument("--warmup-mask-steps", type=int, help="mask steps of the warm-up steps (default: 8)")
    parser.add_argument("--repeats", type=int, help="interleaved timed rounds per path (default: 1)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="model dtype (default: bfloat16, float32 with --tiny; --tiny --dtype bfloat16 rehearses the GPU's)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        torch.set_num_threads(1)  # tiny ops: more threads only spin on a shared CPU
    print(
        format_table(
            run(
                args.out,
                tiny=args.tiny,
                device=args.device,
                mask_steps=args.mask_steps,
                record_mask_steps=args.record_mask_steps,
                warmup_mask_steps=args.warmup_mask_steps,
                repeats=args.repeats,
                dtype=getattr(torch, args.dtype) if args.dtype else None,
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

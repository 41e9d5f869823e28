"""Model benchmarks: a whole rollout and one GRPO step of a real backbone (random init at the real
sizes), the library's fused path against a reference-style eager path, in one run.

    bench_nova(...)    NOVA-0.6B @512 (margrpo.models.nova preset nova-0.6b-random)
    (bench_harmon lives beside it, kept separate)

NOVA paths (same backbone, sampler, schedule, CFG, K seed trajectories, recorded steps and algorithm
switches; they differ in how the work is organised):
  fused      rollout: margrpo.rollout.generate (only the tokens a step needs, all K + 1 trajectories
             of a token in one head pass with the modulation shared); GRPO step: the shared trainer's
             Trainer.train_step, with the reference code's algorithm (REINFORCE, unguided likelihood,
             one update per recorded mask step, KL on the mean) so both paths do the same updates
  reference  the reference code's way: at every mask step the head denoises ALL N tokens of every
             image, one chain per trajectory through the official head forward (modulation recomputed
             in each call); the likelihood re-evaluates all N tokens per recorded step and trajectory
Both paths are warmed up on a short schedule, then timed in `repeats` interleaved rounds (median;
margrpo.bench.timing, CUDA events on GPU); peak memory is torch.cuda.max_memory_allocated during the
timed calls. A row is handed to `on_row` as soon as it is measured (the GPU script writes its JSON
then). The GRPO step runs the trainer's bf16 autocast on CUDA (settings.bf16 overrides: a CPU test
runs it too).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from margrpo.bench.compiles import warn_if_compiled
from margrpo.bench.machine import machine_description
from margrpo.bench.timing import interleave, synchronize
from margrpo.grpo.advantages import group_advantages
from margrpo.heads.upstream import eager_denoise_logprob, eager_multi_seed_denoise
from margrpo.rollout import RolloutConfig, choose_plan, effective_steps, generate, mask_schedule
from margrpo.rollout.guidance import guidance_for, head_condition, prompt_rows

NOVA_PROMPTS = (
    "a photo of a cat on a sofa",
    "a red sports car on a mountain road",
    "an oil painting of a lighthouse at dusk",
    "a bowl of ramen, studio lighting",
)


@dataclasses.dataclass
class NovaBenchSettings:
    """Sizes of one NOVA benchmark run (defaults: the paper's sampling setup on the real model)."""

    preset: str = "nova-0.6b-random"
    dtype: str = "bfloat16"
    prompts: int = 1  # prompts per GRPO step
    group_size: int = 4  # images per prompt
    mask_steps: int = 64
    diffusion_steps: int = 25
    num_seeds: int = 3  # K (NOVA's MTE)
    cfg_scale: float = 5.0
    record_mask_steps: int = 12
    record_diffusion_steps: int = 10
    warmup_mask_steps: int = 8
    repeats: int = 1  # interleaved timed rounds per path (median; the step's paired ratio per round)
    time_rollout: bool = True  # also time the rollout alone (False: the GRPO step only)
    bf16: bool | None = None  # the trainer's optim.bf16 (autocast); None: on CUDA only
    compile_head: bool | str = "auto"  # the fused rollout's rollout.compile_head (auto: compiled on CUDA)

    def __post_init__(self) -> None:
        # rollout_config records min(record_mask_steps, steps - 2) mask steps, and a step needs one
        for name in ("mask_steps", "warmup_mask_steps"):
            if getattr(self, name) < 3:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected >= 3 (a schedule with a recorded mask step)")

    @classmethod
    def tiny(cls) -> "NovaBenchSettings":
        """CPU-sized: the tiny preset, a few steps (checks the benchmark itself)."""
        return cls(
            preset="nova-tiny",
            dtype="float32",
            mask_steps=4,
            diffusion_steps=4,
            num_seeds=2,
            record_mask_steps=2,
            record_diffusion_steps=2,
            warmup_mask_steps=3,
        )

    @property
    def batch(self) -> int:
        return self.prompts * self.group_size

    @property
    def batch_prompts(self) -> list[str]:
        """The step's prompts: `prompts` of NOVA_PROMPTS, each repeated group_size times."""
        return [NOVA_PROMPTS[i % len(NOVA_PROMPTS)] for i in range(self.prompts) for _ in range(self.group_size)]

    def rollout_config(self, mask_steps: int | None = None) -> RolloutConfig:
        steps = mask_steps or self.mask_steps
        return RolloutConfig(
            num_mask_steps=steps,
            schedule="nova",
            cfg_scale=self.cfg_scale,
            negative_prompt="",
            num_seeds=self.num_seeds,
            record_mask_steps=min(self.record_mask_steps, steps - 2),
            record_diffusion_steps=self.record_diffusion_steps,
            likelihood_positions="unknown",
            compile_head=self.compile_head,
        )


def with_peak(fn, device: torch.device, peaks: dict[str, float], name: str):
    """fn, recording into peaks[name] the most GiB allocated during any of its calls (0 on CPU). The
    allocator's peak is known on the host when fn returns: no synchronisation is added."""

    def call():
        if device.type != "cuda":
            peaks.setdefault(name, 0.0)
            return fn()
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        peaks[name] = max(peaks.get(name, 0.0), torch.cuda.max_memory_allocated(device) / 2**30)
        return out

    return call


@torch.no_grad()
def nova_reference_rollout(backbone, prompts: list[str], config: RolloutConfig, sampler, plan, generator: torch.Generator):
    """The reference code's sampling loop (any MARBackbone) -> (images, records): at every mask step
    the head denoises all N tokens of each image (official forward, one chain per trajectory) and the
    step keeps its revealed tokens. records: per recorded mask step (canvas, known, MultiSeedSamples over all N)."""
    B, N, C, K = len(prompts), backbone.num_tokens, backbone.token_channels, config.num_seeds
    device = next(backbone.parameters()).device
    counts = mask_schedule(N, config.num_mask_steps, config.schedule)
    recorded = {step: j for j, step in enumerate(plan.mask_steps)}
    rows = prompt_rows(backbone, prompts, config)
    order = torch.stack([torch.randperm(N, generator=generator, device=device) for _ in range(B)])
    canvas = torch.zeros(B, N, C, device=device)
    known = torch.zeros(B, N, dtype=torch.bool, device=device)
    every = torch.arange(N, device=device).expand(B, N)
    records, start = [], 0
    for step in effective_steps(counts):
        n, j = counts[step], recorded.get(step)
        revealed = order[:, start : start + n]
        z = backbone.forward_z(rows.batch, canvas.repeat(rows.rows_per_image, 1, 1), known.repeat(rows.rows_per_image, 1))
        noise = torch.randn(sampler.num_steps + 1, K + 1, B * N, C, generator=generator, device=device)
        out = eager_multi_seed_denoise(
            backbone.head,
            head_condition(z, rows, every),
            sampler,
            K,
            noise,
            cfg=guidance_for(config, config.cfg_scale_at(start + n, N)),
            record_steps=plan.diffusion_steps[j] if j is not None else (),
            temperature=config.temperature,
        )
        if j is not None:
            records.append((canvas.clone(), known.clone(), out))
        index = revealed[..., None].expand(-1, -1, C)
        canvas.scatter_(1, index, out.x0[0].reshape(B, N, C).float().gather(1, index))
        known.scatter_(1, revealed, True)
        start += n
    return backbone.decode(canvas), records


def nova_reference_update(
    policy,
    reference,
    optimizer,
    prompts: list[str],
    records,
    sampler,
    rewards: torch.Tensor,
    group_size: int,
    kl_beta: float,
    grad_clip: float = 1.0,
) -> None:
    """The training phase of a reference-style GRPO step (any MARBackbone): group advantages of
    `rewards` [B], then per recorded mask step of `records` (from nova_reference_rollout) an unguided
    likelihood of every token's recorded transitions (all N tokens, one head call per trajectory and
    diffusion step) under the policy and the reference, REINFORCE + k3 KL over the positions unknown
    before the step, backward, gradient clipping and an optimizer update. `reference` may be None
    when kl_beta is 0 (no KL term)."""
    advantages = group_advantages(rewards, group_size)
    B, N = len(prompts), policy.num_tokens
    for canvas, known, record in records:
        optimizer.zero_grad(set_to_none=True)
        z = policy.forward_z(policy.encode_prompts(prompts), canvas, known).reshape(B * N, -1)
        logp = eager_denoise_logprob(policy.head, z, sampler, record)  # [K+1, R, B*N]
        weight = (~known).reshape(1, 1, B * N).float()
        per_image = (logp * weight).reshape(*logp.shape[:2], B, N).sum((0, 1, 3)) / weight.sum().clamp(min=1)
        loss = -(advantages * per_image).mean()
        if kl_beta:
            with torch.no_grad():
                z_ref = reference.forward_z(reference.encode_prompts(prompts), canvas, known).reshape(B * N, -1)
                ref_logp = eager_denoise_logprob(reference.head, z_ref, sampler, record)
            diff = ref_logp - logp
            kl = ((diff.exp() - diff - 1) * weight).sum() / (weight.sum() * logp.shape[0] * logp.shape[1]).clamp(min=1)
            loss = loss + kl_beta * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.grad is not None], grad_clip)
        optimizer.step()


def nova_reference_grpo_step(
    policy,
    reference,
    optimizer,
    prompts: list[str],
    config: RolloutConfig,
    sampler,
    plan,
    reward,
    group_size: int,
    kl_beta: float,
    generator: torch.Generator,
) -> None:
    """One GRPO step the reference code's way: the eager rollout (nova_reference_rollout), rewards,
    then the per-recorded-mask-step updates (nova_reference_update)."""
    images, records = nova_reference_rollout(policy, prompts, config, sampler, plan, generator)
    rewards = reward(images, prompts).total.float().to(images.device)
    nova_reference_update(policy, reference, optimizer, prompts, records, sampler, rewards, group_size, kl_beta)


def trainer_reference_step(trainer, optimizer, prompts: list[str], config: RolloutConfig, sampler, plan, generator, reward=None) -> None:
    """nova_reference_grpo_step on the trainer's policy and KL reference, with its reward (or
    `reward`), group size and KL weight: the reference-style step beside the trainer's fused one."""
    g = trainer.config.grpo
    nova_reference_grpo_step(
        trainer.policy,
        trainer.ref_policy,
        optimizer,
        prompts,
        config,
        sampler,
        plan,
        trainer.reward if reward is None else reward,
        g.group_size,
        g.kl_beta,
        generator,
    )


def _nova_trainer(backbone, settings: NovaBenchSettings, device: torch.device, workdir: Path):
    """The shared trainer driving `backbone` (the in-memory random-init model stands in for a
    checkpoint directory), configured with the reference code's algorithm (the parity preset)."""
    from margrpo.train.trainer import Trainer

    prompt_file = workdir / "prompts.txt"
    prompt_file.write_text("\n".join(NOVA_PROMPTS) + "\n")
    return Trainer(nova_bench_config(settings, device, workdir), create_run_dir=False, policy=backbone)


def train_step_on(trainer, schedule: RolloutConfig) -> None:
    """One trainer step with the rollout's mask schedule (mask steps, recorded steps) of `schedule`
    instead of its own: the benchmarks' warm-up, which builds every kernel and graph the real
    schedule's step uses at a fraction of its time."""
    full = trainer.config
    rollout = dataclasses.replace(full.rollout, num_mask_steps=schedule.num_mask_steps, record_mask_steps=schedule.record_mask_steps)
    trainer.config = dataclasses.replace(full, rollout=rollout)
    try:
        trainer.train_step()
    finally:
        trainer.config = full


def nova_bench_config(settings: NovaBenchSettings, device: torch.device, workdir: Path):
    """The fused path's TrainerConfig: the settings' rollout with the reference code's algorithm (the
    parity preset's), run in `workdir` (its prompts.txt: the train prompts)."""
    from margrpo.train.config import load_config

    bf16 = device.type == "cuda" if settings.bf16 is None else settings.bf16
    r = settings.rollout_config()
    overrides = [
        "backbone.name=nova",
        f"backbone.diffusion_steps={settings.diffusion_steps}",
        f"run.device={device}",
        f"run.out_dir={workdir / 'run'}",
        f"run.train_prompts={workdir / 'prompts.txt'}",
        "run.tensorboard=false",
        f"rollout.num_mask_steps={r.num_mask_steps}",
        "rollout.schedule=nova",
        f"rollout.cfg_scale={r.cfg_scale}",
        f"rollout.num_seeds={r.num_seeds}",
        f"rollout.record_mask_steps={r.record_mask_steps}",
        f"rollout.record_diffusion_steps={r.record_diffusion_steps}",
        "rollout.likelihood_positions=unknown",
        f"rollout.compile_head={str(r.compile_head).lower()}",
        f"grpo.group_size={settings.group_size}",
        f"grpo.prompts_per_step={settings.prompts}",
        "grpo.objective=reinforce",
        "grpo.kl_type=parity_mean_k3",
        "grpo.likelihood_cfg=none",
        "grpo.minibatch_over=mask_steps",
        f"grpo.minibatches={r.record_mask_steps}",
        "grpo.mte=true",
        "grpo.pixels_per_token=4",
        "grpo.consistency=true",
        "grpo.kl_beta=0.01",
        "grpo.channel_reduction=mean",
        "grpo.normalization=update",
        "grpo.mte_include_rollout=false",
        "grpo.mte_k=reference",
        "grpo.mte_random_positions=1",
        "grpo.advantage_std=unbiased",
        "rewards={jpeg_incompressibility: 1.0}",
        f"optim.bf16={str(bf16).lower()}",
        "optim.lr=1e-6",
    ]
    return load_config(None, overrides)


def bench_nova(device: torch.device | str, settings: NovaBenchSettings | None = None, seed: int = 0, on_row=None) -> dict:
    """Rollout images/s and GRPO step time, fused vs reference-style, with peak memory -> {machine,
    settings, rows, speedup}; on_row(row) is called as each row is measured."""
    from margrpo.models import nova

    settings = settings or NovaBenchSettings()
    device = torch.device(device)
    began = time.perf_counter()
    backbone = nova.build(settings.preset, device=device, dtype=settings.dtype, seed=seed)
    print(f"[bench_nova] built {settings.preset} ({settings.dtype}) in {time.perf_counter() - began:.1f} s", flush=True)
    sampler = backbone.make_sampler(settings.diffusion_steps)
    prompts = settings.batch_prompts
    seeds = list(range(settings.batch))
    counts = mask_schedule(backbone.num_tokens, settings.mask_steps, "nova")
    config, short = settings.rollout_config(), settings.rollout_config(settings.warmup_mask_steps)
    rows: list[dict] = []
    ratios: dict[str, dict] = {}  # reference / fused per round: p20, p50, p80 and the rounds' values

    def plan_for(cfg: RolloutConfig):
        steps = mask_schedule(backbone.num_tokens, cfg.num_mask_steps, "nova")
        return choose_plan(steps, sampler, cfg.record_mask_steps, cfg.record_diffusion_steps, torch.Generator().manual_seed(seed))

    def compare(what: str, paths: dict, warmups: dict) -> None:
        """Warm every path up (short schedule), then time them in interleaved rounds."""
        start = time.perf_counter()
        for warm in warmups.values():
            warm()
        synchronize(device)
        print(f"[bench_nova] {what}: warm-up {time.perf_counter() - start:.1f} s", flush=True)
        peaks: dict[str, float] = {}

        def announced(path: str, fn):  # a line per timed call: a CPU round at the real sizes takes minutes
            def call():
                began = time.perf_counter()
                out = fn()
                print(f"[bench_nova] {what} {path}: {time.perf_counter() - began:.1f} s", flush=True)
                return out

            return call

        timed = interleave(
            {p: announced(p, with_peak(fn, device, peaks, p)) for p, fn in paths.items()},
            device,
            min_time_s=0.0,
            warmup=0,
            min_rounds=settings.repeats,
            max_rounds=settings.repeats,
        )
        ratio = timed.ratio("reference", "fused")
        ratios[what] = {
            "p20": ratio.p20,
            "p50": ratio.p50,
            "p80": ratio.p80,
            "per_round": timed.ratio_samples("reference", "fused"),
            "order": timed.order,
            "compiles_while_timed": timed.compiles,
        }
        for line in warn_if_compiled(timed.compiles, f"[bench_nova] {what}"):
            print(line, flush=True)
        for path in paths:
            ms = timed.stats(path).p50
            rows.append(
                {
                    "what": what,
                    "path": path,
                    "images": settings.batch,
                    "ms": ms,
                    "rounds_ms": timed.times[path],
                    "compiles_while_timed": timed.compiles[path],
                    "images_per_s": settings.batch / (ms / 1e3),
                    "peak_gib": peaks[path],
                }
            )
            print(f"[bench_nova] {what:<9} {path:<9} {ms:10.1f} ms  peak {peaks[path]:.2f} GiB", flush=True)
            if on_row:
                on_row(rows[-1])

    generator = torch.Generator(device=device).manual_seed(seed)
    plan, short_plan = plan_for(config), plan_for(short)
    if settings.time_rollout:
        compare(
            "rollout",
            {
                "fused": lambda: generate(backbone, prompts, config, seeds, sampler=sampler, plan=plan),
                "reference": lambda: nova_reference_rollout(backbone, prompts, config, sampler, plan, generator),
            },
            {
                "fused": lambda: generate(backbone, prompts, short, seeds, sampler=sampler, plan=short_plan),
                "reference": lambda: nova_reference_rollout(backbone, prompts, short, sampler, short_plan, generator),
            },
        )

    with tempfile.TemporaryDirectory() as workdir:
        trainer = _nova_trainer(backbone, settings, device, Path(workdir))
        optimizer = torch.optim.AdamW(trainer.policy.trainable_parameters(), lr=1e-6)

        def reference_step(cfg: RolloutConfig, step_plan) -> None:
            trainer_reference_step(trainer, optimizer, prompts, cfg, sampler, step_plan, generator)

        compare(
            "grpo_step",
            {"fused": trainer.train_step, "reference": lambda: reference_step(config, plan)},
            {"fused": lambda: train_step_on(trainer, short), "reference": lambda: reference_step(short, short_plan)},
        )

    return {
        "machine": machine_description(device),
        "settings": {
            **dataclasses.asdict(settings),
            "tokens": backbone.num_tokens,
            "effective_mask_steps": len(effective_steps(counts)),
            "head_compiled": config.compiles_head(device),  # what compile_head resolved to here
            "arch": list(backbone.config.arch),
        },
        "rows": rows,
        # reference / fused: the median of the per-round paired ratios
        "speedup": {what: ratio["p50"] for what, ratio in ratios.items()},
        "speedup_rounds": ratios,
    }

"""`margrpo pretrain`: MAR pretraining of the tiny ShapesWorld model on freshly rendered scenes.

    margrpo pretrain --config configs/shapes-tiny.yaml [key=value ...]

Each step renders one random scene per sampled train prompt (categories in equal proportion), masks
a random fraction of each image's tokens (ratio from a cosine or MAR's truncated normal), runs the
transformer on the prompt and the visible tokens, and trains the diffusion head on the masked
tokens only: `diffusion_batch_mul` random timesteps per token, the sampler's forward process and
training target (eps), mean squared error. Prompts are replaced by the negative prompt with
probability `prompt_dropout` so classifier-free guidance works. AdamW with linear warmup and cosine
decay, gradient clipping, optional EMA of the weights (evaluated and saved when on).
Every `eval_every` steps (and at the end) the model samples images for a fixed, category-balanced
set of held-out prompts with the real MAR sampling loop (margrpo.rollout.generate with the settings
of `pretrain.sampling`) and the ShapesWorld verifier scores them. The checkpoint (model.safetensors +
config.json) and pretrain_metrics.json go to `pretrain.out` (default: backbone.checkpoint, unless that
is a checkpoint shipped with the package, which is never overwritten), written atomically; a non-empty
output directory is refused unless --force. The architecture is `pretrain.arch` (TinyMARConfig).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from margrpo.checkpoints import is_builtin
from margrpo.config import ConfigError, from_dict, load_config_file
from margrpo.models import BackboneConfig, TinyMAR, TinyMARConfig, check_no_model_section
from margrpo.models.directories import check_output_dir, write_directory
from margrpo.sample import SampleConfig, generate_images
from margrpo.testbed import CATEGORIES, balanced_prompts, evaluate, load_prompts, parse_prompt, render_batch


@dataclass
class PretrainConfig:
    """The `pretrain:` section."""

    out: Optional[str] = None  # checkpoint directory to write; None = backbone.checkpoint
    arch: TinyMARConfig = field(default_factory=TinyMARConfig)  # the model built from scratch
    steps: int = 2500
    batch_size: int = 32
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    warmup_steps: int = 200
    weight_decay: float = 0.02
    adam_beta2: float = 0.95
    grad_clip: float = 1.0
    diffusion_batch_mul: int = 2  # timesteps sampled per masked token per step (MAR's name)
    mask_ratio: Literal["cosine", "truncnorm"] = "cosine"
    mask_ratio_min: float = 0.7  # lower bound of MAR's truncated normal (mean 1, std 0.25)
    prompt_dropout: float = 0.1
    ema_decay: float = 0.995  # 0 disables the EMA
    eval_every: int = 250  # 0 = only at the end
    eval_per_category: int = 8  # held-out prompts per category in periodic evals
    final_eval_per_category: int = 32  # ... in the final eval (reported in pretrain_metrics.json)
    sampling: SampleConfig = field(default_factory=SampleConfig)  # generation settings of the evals
    seed: int = 0
    threads: int = 1  # torch threads (0 = torch's default); 1 is bit-reproducible and shares a CPU well

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "diffusion_batch_mul", "eval_per_category", "final_eval_per_category"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected >= 1")
        if not 0 <= self.prompt_dropout < 1:
            raise ValueError(f"prompt_dropout: got {self.prompt_dropout}, expected in [0, 1)")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay: got {self.ema_decay}, expected in [0, 1)")
        if not 0 < self.mask_ratio_min <= 1:
            raise ValueError(f"mask_ratio_min: got {self.mask_ratio_min}, expected in (0, 1]")


def sample_mask_ratios(kind: str, size: int, minimum: float, generator: torch.Generator) -> torch.Tensor:
    """Fraction of tokens to mask per image: "cosine" = cos(pi/2 u) with u ~ U(0, 1) (MaskGIT, the
    ratios a cosine mask schedule visits); "truncnorm" = N(1, 0.25) truncated to [minimum, 1] (MAR)."""
    u = torch.rand(size, generator=generator, dtype=torch.float64)
    if kind == "cosine":
        return torch.cos(math.pi / 2 * u)
    # inverse-CDF sampling of the truncated normal
    normal = torch.distributions.Normal(1.0, 0.25)
    low = normal.cdf(torch.tensor(minimum, dtype=torch.float64))
    high = normal.cdf(torch.tensor(1.0, dtype=torch.float64))
    return normal.icdf(low + u * (high - low)).clamp(minimum, 1.0)


def random_masks(ratios: torch.Tensor, num_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """bool [B, N]: ceil(ratio * N) (at least 1) positions per image, chosen uniformly, are masked."""
    counts = (ratios * num_tokens).ceil().clamp(1, num_tokens).long()
    ranks = torch.rand(len(ratios), num_tokens, generator=generator).argsort(1).argsort(1)
    return ranks < counts[:, None]


def diffusion_loss(
    model: TinyMAR, sampler, z: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, mul: int, generator: torch.Generator
) -> torch.Tensor:
    """Mean squared error of the head's eps prediction on the masked tokens, `mul` timesteps each."""
    x0 = tokens[masked].repeat(mul, 1)
    cond = z[masked].repeat(mul, 1)
    t = torch.randint(0, sampler.num_train_timesteps, (len(x0),), generator=generator)
    noise = torch.randn(x0.shape, generator=generator)
    x_t = sampler.add_noise(x0, noise, t)
    prediction = model.head(x_t, sampler.train_model_time(t), cond)
    return F.mse_loss(prediction, sampler.training_target(x0, noise, t))


class TrainPrompts:
    """Train prompts drawn with every category equally likely, then uniformly within it."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.by_category = {c: [] for c in CATEGORIES}
        for prompt in load_prompts("train"):
            self.by_category[parse_prompt(prompt).category].append(prompt)

    def draw(self, n: int) -> list[str]:
        """n prompts, drawn with replacement."""
        categories = self.rng.integers(0, len(CATEGORIES), n)
        return [self._pick(CATEGORIES[c]) for c in categories]

    def _pick(self, category: str) -> str:
        pool = self.by_category[category]
        return pool[self.rng.integers(0, len(pool))]


def learning_rate(step: int, config: PretrainConfig) -> float:
    """Linear warm-up to config.lr, then cosine decay to config.lr * min_lr_ratio at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def heldout_eval(model: TinyMAR, per_category: int, sampling: SampleConfig) -> dict[str, float]:
    """Verifier summary (per category, "exact") of one sample per balanced held-out prompt; fixed
    seeds, so evals of different steps see the same noise."""
    prompts = balanced_prompts("heldout", per_category)
    model.eval()
    images = generate_images(model, prompts, sampling.rollout_config(), seeds=list(range(len(prompts))))
    return evaluate(images, prompts)


def output_dir(backbone: BackboneConfig, config: PretrainConfig, force: bool = False) -> Path:
    """Where pretraining writes: pretrain.out, else backbone.checkpoint. Never a shipped checkpoint (by
    name or by path), and a non-empty directory only with force (its contents are replaced)."""
    if backbone.name != "tiny":
        raise ValueError(f"backbone.name: got {backbone.name!r}, expected 'tiny' (pretraining builds the tiny MAR)")
    if config.out is None and is_builtin(backbone.checkpoint):
        raise ValueError(
            f"pretrain.out: not set, and backbone.checkpoint is the shipped {backbone.checkpoint!r}, "
            "which pretraining does not overwrite; set pretrain.out=DIR"
        )
    key, out = ("pretrain.out", config.out) if config.out is not None else ("backbone.checkpoint", backbone.checkpoint)
    try:
        return check_output_dir(out, force)
    except FileExistsError as err:
        raise ConfigError(f"{key}: {err}") from err


def pretrain(backbone: BackboneConfig, config: PretrainConfig, force: bool = False) -> dict:
    """Train a TinyMAR from scratch, save it, and return the metrics (also saved as JSON)."""
    out = output_dir(backbone, config, force)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    model = TinyMAR(config.arch)
    ema = copy.deepcopy(model).requires_grad_(False) if config.ema_decay else model
    sampler = model.make_sampler()
    generator = torch.Generator().manual_seed(config.seed)
    prompts = TrainPrompts(np.random.default_rng(config.seed))
    render_rng = np.random.default_rng(config.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, config.adam_beta2), weight_decay=config.weight_decay)

    metrics: dict = {"config": {"backbone": asdict(backbone), "pretrain": asdict(config)}, "evals": []}
    started = time.time()
    progress = tqdm(range(config.steps), desc="pretrain", dynamic_ncols=True)
    for step in progress:
        model.train()
        batch_prompts = prompts.draw(config.batch_size)
        tokens = model.encode_images(render_batch(batch_prompts, render_rng))
        ratios = sample_mask_ratios(config.mask_ratio, config.batch_size, config.mask_ratio_min, generator)
        masked = random_masks(ratios, model.num_tokens, generator)
        dropped = torch.rand(config.batch_size, generator=generator) < config.prompt_dropout
        conditioning = [model.negative_prompt() if d else p for p, d in zip(batch_prompts, dropped.tolist())]

        z = model.forward_z(model.encode_prompts(conditioning), tokens, ~masked)
        loss = diffusion_loss(model, sampler, z, tokens, masked, config.diffusion_batch_mul, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if config.ema_decay:
            # warm-up: early on the average would be dominated by the (zero-init head) initial weights
            decay = min(config.ema_decay, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1 - decay)
        progress.set_postfix(loss=f"{loss.item():.4f}", grad=f"{grad_norm.item():.2f}")

        last = step + 1 == config.steps
        if (config.eval_every and (step + 1) % config.eval_every == 0) or last:
            per_category = config.final_eval_per_category if last else config.eval_per_category
            summary = heldout_eval(ema, per_category, config.sampling)
            summary.update(
                step=step + 1,
                minutes=round((time.time() - started) / 60, 2),
                prompts=per_category * len(CATEGORIES),
                loss=round(loss.item(), 5),
            )
            metrics["evals"].append(summary)
            metrics["minutes"] = summary["minutes"]
            progress.write("eval " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()))
            save(ema, metrics, out)  # after every eval, so a stopped run leaves its latest model

    print(f"saved {out} after {metrics['minutes']} minutes")
    return metrics


def save(model: TinyMAR, metrics: dict, out: Path) -> None:
    """Write the checkpoint (model.safetensors, config.json) and pretrain_metrics.json to `out`, replacing
    the previous save atomically (output_dir checked `out` before training)."""

    def write(tmp: Path) -> None:
        model.save(tmp)
        (tmp / "pretrain_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    write_directory(out, write, force=True)


def main(argv: list[str] | None = None) -> int:
    """`margrpo pretrain --config FILE [key=value ...]`."""
    parser = argparse.ArgumentParser(prog="margrpo pretrain", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config with backbone: and pretrain: sections")
    parser.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. pretrain.steps=100")
    args = parser.parse_args(argv)
    data = load_config_file(args.config, args.overrides)
    check_no_model_section(data)
    pretrain(
        from_dict(BackboneConfig, data.get("backbone", {}), "backbone"),
        from_dict(PretrainConfig, data.get("pretrain", {}), "pretrain"),
        force=args.force,
    )
    return 0

"""`margrpo sample`: generate images for a prompt file and save captioned PNG grids.

    margrpo sample --config configs/shapes-tiny.yaml --prompts FILE --out DIR [key=value ...]
    margrpo sample --checkpoint runs/shapes-tiny --prompts FILE --out DIR

The model: --checkpoint when given, which names a run checkpoint (<run>/checkpoints/step-*: the
policy as it trained, rebuilt from the run's saved config), a run directory (its newest checkpoint),
or a model directory of any family (official, exported or init-model; its family is detected);
else the config's `backbone:` section. Settings come from --config, else the config saved with the
checkpoint (margrpo.train.restore.command_settings). Generation settings (mask steps,
schedule, guidance, temperature) come from the config's `rollout:` section when it has one (the GRPO
run's settings; nothing is recorded here), else from `pretrain.sampling` (SampleConfig, the settings
of the pretraining evals). Writes DIR/NNN.png per prompt (a row of samples under the prompt as
caption) and DIR/grid.png with every row. When every prompt is a ShapesWorld prompt, also prints
the verifier's per-category scores of the samples.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from PIL import Image, ImageDraw

from margrpo.config import ConfigError, from_dict
from margrpo.models import BackboneConfig, MARBackbone, check_no_model_section, load_backbone
from margrpo.rollout import RolloutConfig, generate

CAPTION_HEIGHT = 14  # pixels of caption strip above each row (PIL's default bitmap font is ~11 px)
UPSCALE = 4  # nearest-neighbour upscaling of each sample in the saved grids


@dataclass
class SampleConfig:
    """Generation settings for the tiny model (`pretrain.sampling`), defaults tuned for it."""

    num_mask_steps: int = 16
    schedule: Literal["nova", "harmon"] = "harmon"
    cfg_scale: float = 3.0
    cfg_schedule: Literal["constant", "linear"] = "constant"
    temperature: float = 1.0

    def rollout_config(self) -> RolloutConfig:
        """These settings as a RolloutConfig that records nothing for a likelihood."""
        return RolloutConfig(**dataclasses.asdict(self)).generation_only()


@torch.no_grad()
def generate_images(
    model: MARBackbone,
    prompts: list[str],
    config: RolloutConfig,
    seeds: list[int],
    batch_size: int = 32,
    sampler=None,
) -> torch.Tensor:
    """float [B, 3, H, W] in [0, 1]: one image per (prompt, seed) with margrpo.rollout.generate,
    `batch_size` images per call; `sampler` defaults to the model's own (model.make_sampler())."""
    if len(prompts) != len(seeds):
        raise ValueError(f"seeds: got {len(seeds)} seeds for {len(prompts)} prompts, expected one per prompt")
    sampler = model.make_sampler() if sampler is None else sampler
    config = config.generation_only()
    chunks = []
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        chunks.append(generate(model, prompts[start:stop], config, seeds[start:stop], sampler=sampler).images)
    return torch.cat(chunks)


def caption_row(images: torch.Tensor, caption: str) -> Image.Image:
    """A row of images [n, 3, H, W] in [0, 1], upscaled, with the caption above it."""
    row = torch.cat(list(images), dim=2)  # [3, H, n W]
    pixels = (row.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    picture = Image.fromarray(pixels).resize((pixels.shape[1] * UPSCALE, pixels.shape[0] * UPSCALE), Image.NEAREST)
    canvas = Image.new("RGB", (picture.width, picture.height + CAPTION_HEIGHT), "white")
    canvas.paste(picture, (0, CAPTION_HEIGHT))
    ImageDraw.Draw(canvas).text((2, 1), caption, fill="black")
    return canvas


def stack_rows(rows: list[Image.Image]) -> Image.Image:
    """The rows one under the other on a white background."""
    grid = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)), "white")
    top = 0
    for row in rows:
        grid.paste(row, (0, top))
        top += row.height
    return grid


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a prompt file (plain text, one per line, or .jsonl: margrpo.prompt_files); a
    missing or empty file is an error naming it."""
    from margrpo.prompt_files import PromptFileError, read_prompt_records

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts: {path} does not exist")
    try:
        prompts = [record.prompt for record in read_prompt_records(path)]
    except PromptFileError as err:  # a bad .jsonl line: the message names the file, line and key
        raise ConfigError(f"--prompts: {err}") from err
    if not prompts:
        raise ValueError(f"--prompts: {path} holds no prompts (expected one prompt per line)")
    return prompts


def _shapes_summary(images: torch.Tensor, prompts: list[str]) -> str | None:
    """The verifier's summary line when every prompt is ShapesWorld grammar, else None."""
    from margrpo.testbed import evaluate, parse_prompt

    try:
        for prompt in set(prompts):
            parse_prompt(prompt)
    except ValueError:
        return None
    summary = evaluate(images, prompts)
    return "verifier: " + "  ".join(f"{key} {value:.3f}" for key, value in summary.items())


def main(argv: list[str] | None = None) -> int:
    """`margrpo sample --config FILE --prompts FILE --out DIR [...]` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="margrpo sample", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", help="YAML config (backbone:, and rollout: or pretrain.sampling); default: the config saved with --checkpoint"
    )
    parser.add_argument("--prompts", required=True, help="text file, one prompt per line, or .jsonl with metadata")
    parser.add_argument("--out", required=True, help="output directory for the PNG grids")
    parser.add_argument(
        "--checkpoint",
        help="a run checkpoint (<run>/checkpoints/step-*), a run directory (its newest), "
        "or a model directory of any family (default: the config's backbone.checkpoint)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (default auto: cuda when available)")
    parser.add_argument("--per-prompt", type=int, default=4, help="images per prompt (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first image; image i uses seed + i")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.cfg_scale=2")
    args = parser.parse_args(argv)
    if args.per_prompt < 1:
        parser.error(f"--per-prompt: got {args.per_prompt}, expected >= 1")

    from margrpo.train.restore import command_settings, restore_policy, trainer_config

    data, run_checkpoint = command_settings(args.config, args.checkpoint, args.overrides)
    check_no_model_section(data)
    prompts = read_prompts(args.prompts)
    backbone = from_dict(BackboneConfig, data.get("backbone", {}), "backbone")
    if "rollout" in data:
        config, source = from_dict(RolloutConfig, data["rollout"], "rollout"), "rollout"
    else:
        sampling = data.get("pretrain", {}).get("sampling", {})
        config, source = from_dict(SampleConfig, sampling, "pretrain.sampling").rollout_config(), "pretrain.sampling"
    if run_checkpoint is not None:  # the policy exactly as it trained (adapters not merged)
        trained, _ = trainer_config(run_checkpoint, args.config, args.overrides)
        model, name = restore_policy(run_checkpoint, trained, args.device, merge=False), run_checkpoint
    else:
        try:
            model, name = load_backbone(backbone, args.device), backbone.checkpoint
        except FileNotFoundError as err:  # names the missing file and what was expected
            raise ConfigError(str(err)) from err
    print(f"sampling {backbone.name} {name} with the {source} settings")

    per = args.per_prompt
    repeated = [prompt for prompt in prompts for _ in range(per)]
    seeds = [args.seed + i for i in range(len(repeated))]
    images = generate_images(model, repeated, config, seeds, sampler=model.make_sampler(backbone.diffusion_steps)).cpu()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [caption_row(images[i * per : (i + 1) * per], prompt) for i, prompt in enumerate(prompts)]
    for i, row in enumerate(rows):
        row.save(out / f"{i:03d}.png")
    stack_rows(rows).save(out / "grid.png")
    print(f"wrote {len(rows)} rows of {per} samples to {out}/ (grid.png and NNN.png)")
    summary = _shapes_summary(images, repeated)
    if summary:
        print(summary)
    return 0

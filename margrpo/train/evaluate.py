"""Held-out evaluation with fixed seeds (so points along a run are comparable), and `margrpo eval`."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from margrpo.config import ConfigError
from margrpo.rollout import RolloutConfig, generate, sample_seed


@torch.no_grad()
def generate_images(backbone, sampler, config: RolloutConfig, prompts: list[str], samples_per_prompt: int,
                    seed: int, batch_size: int = 32) -> tuple[list[str], torch.Tensor]:
    """Images [P * samples, 3, H, W] for every prompt, seeded by (seed, prompt index, sample index)."""
    expanded = [p for p in prompts for _ in range(samples_per_prompt)]
    seeds = [sample_seed(seed, 0, i // samples_per_prompt, i % samples_per_prompt) for i in range(len(expanded))]
    quiet = config.generation_only()
    images = []
    for start in range(0, len(expanded), batch_size):
        chunk = slice(start, start + batch_size)
        images.append(generate(backbone, expanded[chunk], quiet, seeds[chunk], sampler=sampler).images.cpu())
    return expanded, torch.cat(images)


def verifier_summary(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """ShapesWorld verifier per category (each averaged over the prompts it applies to)."""
    from margrpo.testbed import verifier

    return verifier.evaluate(images, prompts)


def main(argv: list[str] | None = None) -> int:
    """margrpo eval --config FILE [--checkpoint DIR] [--suite NAME ...] [key=value ...]: held-out scores
    (the verifier's, or the mean reward), or a benchmark suite's per category (margrpo.eval_suites)."""
    from margrpo.eval_suites import run as suites

    from .trainer import Trainer

    parser = argparse.ArgumentParser(prog="margrpo eval", description=main.__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--checkpoint", default=None, help="a run's checkpoint dir (default: the config's backbone)")
    parser.add_argument("overrides", nargs="*")
    suites.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    if args.checkpoint:
        _check_checkpoint_dir(Path(args.checkpoint))
    trainer = Trainer.from_files(args.config, args.overrides + ["run.resume=never"], create_run_dir=False)
    if args.checkpoint:
        trainer.load_checkpoint(args.checkpoint, weights_only=True)
    if args.suite:
        suites.run_suite(trainer, args)
        return 0
    summary = trainer.evaluate(step=trainer.step, log=False)
    print("  ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


def _check_checkpoint_dir(path: Path) -> None:
    """--checkpoint names a training checkpoint (<run>/checkpoints/step-*), not a model directory."""
    if not path.is_dir():
        raise ConfigError(f"--checkpoint {path}: no such directory")
    if not (path / "manifest.json").is_file():
        raise ConfigError(f"--checkpoint {path}: not a training checkpoint (no manifest.json; a run writes them "
                          "as <run>/checkpoints/step-*); evaluate a model directory with backbone.checkpoint=PATH")

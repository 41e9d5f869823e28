"""Held-out evaluation with fixed seeds (so points along a run are comparable), and `margrpo eval`."""
from __future__ import annotations

import argparse

import torch

from margrpo.config import ConfigError, apply_overrides, from_dict
from margrpo.models import resolve_device
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
    """margrpo eval [--config FILE] [--checkpoint PATH] [key=value ...]: held-out verifier scores (or the
    configured reward) of a model. --checkpoint: a run checkpoint (<run>/checkpoints/step-*), a run
    directory (its newest), or a model directory of any family (official, exported, init-model). The
    settings come from --config, else the config saved with the checkpoint. --suite NAME: a benchmark
    suite's scores per category instead (margrpo.eval_suites)."""
    from margrpo.eval_suites import run as suites

    from .config import TrainerConfig
    from .restore import command_settings, restore_policy, trainer_config
    from .trainer import Trainer

    parser = argparse.ArgumentParser(prog="margrpo eval", description=main.__doc__)
    parser.add_argument("--config", default=None, help="YAML config (default: the one saved with --checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="a run checkpoint, a run directory, or a model directory "
                        "(default: the config's backbone.checkpoint)")
    parser.add_argument("overrides", nargs="*")
    suites.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    data, run_checkpoint = command_settings(args.config, args.checkpoint, args.overrides)
    config = from_dict(TrainerConfig, apply_overrides(data, ["run.resume=never"]))
    policy = None
    if run_checkpoint is not None:  # adapters merged: the trainer adds its own when the config asks for LoRA
        trained, _ = trainer_config(run_checkpoint, args.config, args.overrides)
        policy = restore_policy(run_checkpoint, trained, resolve_device(config.run.device))
    try:
        trainer = Trainer(config, create_run_dir=False, policy=policy)
    except FileNotFoundError as err:  # a model directory that is missing a file: the message names it
        raise ConfigError(str(err)) from err
    if args.suite:
        suites.run_suite(trainer, args)
        return 0
    summary = trainer.evaluate(step=trainer.step, log=False)
    print("  ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0

"""Held-out evaluation with fixed seeds (so points along a run are comparable), and `margrpo eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from margrpo.config import ConfigError, apply_overrides, from_dict
from margrpo.models import load_backbone, resolve_device
from margrpo.rollout import RolloutConfig, generate, sample_seed


@torch.no_grad()
def generate_images(
    backbone, sampler, config: RolloutConfig, prompts: list[str], samples_per_prompt: int, seed: int, batch_size: int = 32
) -> tuple[list[str], torch.Tensor]:
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


def check_prompts_known(backbone, prompts: list[str], option: str, batch_size: int = 32) -> None:
    """Every prompt encodes with `backbone` (the tiny model knows only ShapesWorld words): said as a
    one-line error naming `option` before any image is generated or any scorer loaded."""
    unique = list(dict.fromkeys(prompts))
    with torch.no_grad():
        for start in range(0, len(unique), batch_size):
            try:
                backbone.encode_prompts(unique[start : start + batch_size])
            except ValueError as err:  # the protocol's error for unknown words or empty prompts
                raise ConfigError(f"{option}: {err}") from err


def main(argv: list[str] | None = None) -> int:
    """margrpo eval [--config FILE] [--checkpoint PATH] [key=value ...]: held-out verifier scores (or the
    configured reward) of a model. --checkpoint: a run checkpoint (<run>/checkpoints/step-*), a run
    directory (its newest), or a model directory of any family (official, exported, init-model). The
    settings come from --config, else the config saved with the checkpoint. --prompts FILE: the prompts
    to score (run.eval_prompts; a .jsonl file carries the metadata some rewards need). --suite NAME: a
    benchmark suite's scores per category instead (margrpo.eval_suites), which needs no configured
    reward."""
    from margrpo.eval_suites import run as suites

    from .config import TrainerConfig
    from .restore import command_settings, restore_policy, trainer_config
    from .trainer import Trainer

    parser = argparse.ArgumentParser(prog="margrpo eval", description=main.__doc__)
    parser.add_argument("--config", default=None, help="YAML config (default: the one saved with --checkpoint)")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a run checkpoint, a run directory, or a model directory (default: the config's backbone.checkpoint)",
    )
    parser.add_argument("overrides", nargs="*")
    suites.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    if args.prompts and not args.suite:  # the held-out prompts, with their metadata (a suite reads its own)
        overrides.append(f"run.eval_prompts={Path(args.prompts).resolve()}")
    data, run_checkpoint = command_settings(args.config, args.checkpoint, overrides)
    config = from_dict(TrainerConfig, apply_overrides(data, ["run.resume=never"]))
    device = resolve_device(config.run.device)
    policy = None
    if run_checkpoint is not None:  # adapters merged: the trainer adds its own when the config asks for LoRA
        trained, _ = trainer_config(run_checkpoint, args.config, overrides)
        policy = restore_policy(run_checkpoint, trained, device)
    if args.suite:  # the suite scores: no configured reward, no training prompts
        if config.run.threads:
            torch.set_num_threads(config.run.threads)
        if policy is None:
            try:
                policy = load_backbone(config.backbone, device)
            except FileNotFoundError as err:  # a model directory that is missing a file: the message names it
                raise ConfigError(str(err)) from err
        suites.run_suite(SuiteModel(config, device, policy), args)
        return 0
    try:
        trainer = Trainer(config, create_run_dir=False, policy=policy, evaluation_only=True)
    except FileNotFoundError as err:  # a model directory that is missing a file: the message names it
        raise ConfigError(str(err)) from err
    check_prompts_known(trainer.policy, trainer.eval_prompts, "run.eval_prompts" if not args.prompts else "--prompts")
    summary = trainer.evaluate(step=trainer.step, log=False)
    print("  ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


class SuiteModel:
    """What `margrpo eval --suite` generates with (margrpo.eval_suites.run.run_suite): the policy in
    eval mode and its sampler, the config's rollout and run settings; no reward, no optimizer."""

    ema = None  # a restored or loaded policy's EMA would equal its weights
    step = 0

    def __init__(self, config, device: torch.device, policy) -> None:
        self.config, self.device, self.policy = config, device, policy
        self.sampler = policy.make_sampler(config.backbone.diffusion_steps)

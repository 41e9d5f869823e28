"""How far training moved a policy from its starting model, measured one way whatever trained it.

    python benchmarks/policy_drift.py --config configs/shapes-tiny.yaml [--steps 3] RUN_DIR ... [--overrides key=value ...]

Each estimator logs its own KL (`transition`: Gaussian KL of the recorded transitions; `matching`:
unit Gaussians around the head's predictions on the matching draws), so the two logged values are
not one quantity. This script measures the same one for every run: the `transition` estimator's
Gaussian KL (per token, as the trainer logs it) between the run's latest checkpoint and the model
it started from, on fresh rollouts of the trained policy: the trainer is built from the config
(with the overrides: give those the run used, e.g. rollout.cfg_scale=3.0), its policy gets the
checkpoint's tensors, and `--steps` GRPO steps run at learning rate 0, whose logged `kl` is read.
The KL reference is the config's starting model, as in training. Runs get the same prompts and
seeds (steps 0, 1, ... of a run), so the figures are paired. Prints one line per run and, with
--json, writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch


def drift(config_file: str, overrides: list[str], run_dir: Path | None, steps: int) -> list[float]:
    """The logged `kl` of `steps` learning-rate-0 steps of the transition estimator; the policy is the
    latest checkpoint of run_dir (the starting model itself when run_dir is None)."""
    from margrpo.train import checkpoint
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    fixed = ["grpo.estimator=transition", "grpo.kl_beta=0.01", "grpo.kl_type=gaussian", "optim.lr=0", "optim.warmup_steps=0"]
    trainer = Trainer(load_config(config_file, [*overrides, *fixed]), create_run_dir=False)
    if run_dir is not None:
        latest = checkpoint.latest(run_dir / "checkpoints")
        if latest is None:
            raise SystemExit(f"{run_dir}: no checkpoint under {run_dir / 'checkpoints'}")
        weights, _ = checkpoint.load(latest)
        own = dict(trainer.policy.named_parameters())
        unknown = sorted(set(weights) - set(own))
        if unknown:
            raise SystemExit(f"{latest}: tensors not in the config's model: {unknown[:5]}; give the run's overrides")
        with torch.no_grad():
            for name, value in weights.items():
                own[name].copy_(value)
    kls = []
    for step in range(steps):
        trainer.step = step  # the run loop advances it: each step its own prompts and seeds
        kls.append(float(trainer.train_step()["kl"]))
    return kls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=3, help="learning-rate-0 steps per run (64 images each in the preset)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (with checkpoints/)")
    parser.add_argument("--overrides", nargs="*", default=[], help="config overrides the runs were trained with")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    for run in [None, *args.runs]:
        kls = drift(args.config, args.overrides, run, args.steps)
        name = "starting model" if run is None else str(run)
        rows[name] = {"kl_per_step": kls, "kl_mean": statistics.fmean(kls)}
        print(f"{name}: transition KL to the starting model {rows[name]['kl_mean']:.4g} (steps: {', '.join(f'{k:.4g}' for k in kls)})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

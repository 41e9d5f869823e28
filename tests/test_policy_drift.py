"""benchmarks/policy_drift.py: one KL to the starting model for runs of either estimator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_script, make_small_trainer, make_tiny_checkpoint
from margrpo.train import checkpoint as ckpt

SMALL = ["rollout.num_mask_steps=4", "rollout.record_mask_steps=2", "rollout.record_diffusion_steps=2"]
SMALL += ["grpo.prompts_per_step=2", "grpo.group_size=2"]


def _module():
    return load_script("benchmarks/policy_drift.py", "policy_drift")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def _run_with_perturbed_weights(tmp_path, checkpoint, scale: float, name: str) -> Path:
    trainer = make_small_trainer(tmp_path / name, checkpoint, *SMALL)
    generator = torch.Generator().manual_seed(1)
    weights = {
        n: p.detach() + scale * torch.randn(p.shape, generator=generator, dtype=p.dtype)
        for n, p in trainer.policy.named_parameters()
        if p.requires_grad
    }
    ckpt.save(tmp_path / name / "checkpoints", 7, weights, {"step": 7}, keep_last=1)
    return tmp_path / name


def test_drift_is_zero_at_the_start_and_grows_with_the_change(tmp_path, tiny_checkpoint):
    drift = _module().drift
    overrides = [
        f"backbone.checkpoint={tiny_checkpoint}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        *SMALL,
        f"run.out_dir={tmp_path / 'unused'}",
    ]
    assert drift(None, overrides, None, 2) == [0.0, 0.0]
    small = drift(None, overrides, _run_with_perturbed_weights(tmp_path, tiny_checkpoint, 1e-3, "small"), 2)
    large = drift(None, overrides, _run_with_perturbed_weights(tmp_path, tiny_checkpoint, 3e-2, "large"), 2)
    assert all(0 < s < g for s, g in zip(small, large))
    assert small[0] != small[1]  # each step its own prompts and seeds
    with pytest.raises(SystemExit, match="no checkpoint"):
        drift(None, overrides, tmp_path / "empty", 1)

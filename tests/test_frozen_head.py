"""grpo.head: frozen is honoured by margrpo.grpo.update itself: a caller who left the head's
parameters trainable gets the same AR step as one who froze them (no head gradients, none in the clip)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo.grpo import GRPOConfig, update
from margrpo.models.tiny import TinyMAR
from margrpo.rollout import RolloutConfig, generate

PROMPTS = ["a red circle", "a red circle", "a blue square", "a blue square"]


def _model(head_trainable: bool) -> TinyMAR:
    model = tiny_float64_mar(5).requires_grad_(True)
    model.head.requires_grad_(head_trainable)
    return model


def _step(head_trainable: bool, head: str = "frozen"):
    model = _model(head_trainable)
    config = RolloutConfig(num_mask_steps=4, schedule="harmon", cfg_scale=2.0, num_seeds=0, record_mask_steps=2, record_diffusion_steps=2)
    rollout = generate(model, PROMPTS, config, [1, 2, 3, 4])
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    body = [p for name, p in model.named_parameters() if not name.startswith("head.")]
    optimizer = torch.optim.SGD(body, lr=0.1)
    # a tight clip: every gradient norm is above it, so what the norm counts sets the step's size
    result = update(
        model, None, rollout, advantages, config=GRPOConfig(group_size=2, kl_beta=0.0, head=head), optimizer=optimizer, grad_clip=1e-4
    )  # by keyword: the frozen head is read either way
    return model, result


def test_the_frozen_head_is_frozen_inside_update():
    trainable, result = _step(head_trainable=True)
    frozen, reference = _step(head_trainable=False)
    assert result.skipped is None and reference.skipped is None
    assert result.metrics["grad_norm"] == pytest.approx(reference.metrics["grad_norm"], rel=1e-12)
    for (name, a), b in zip(trainable.named_parameters(), frozen.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    # the caller's flags come back; no gradient was computed for the head
    assert all(p.requires_grad and p.grad is None for p in trainable.head.parameters())


def test_a_trained_head_still_gets_gradients():
    model, result = _step(head_trainable=True, head="train")
    assert result.skipped is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_a_nan_advantage_is_an_error_not_a_nan_loss():
    model = _model(head_trainable=False)
    config = RolloutConfig(num_mask_steps=4, schedule="harmon", cfg_scale=1.0, num_seeds=0, record_mask_steps=1, record_diffusion_steps=1)
    rollout = generate(model, PROMPTS, config, [1, 2, 3, 4])
    optimizer = torch.optim.SGD(model.trainable_parameters(), lr=0.1)
    advantages = torch.tensor([1.0, float("nan"), 0.5, -0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="advantages: got 1 non-finite values of 4"):
        update(model, None, rollout, advantages, GRPOConfig(group_size=2, kl_beta=0.0), optimizer)

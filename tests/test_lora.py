"""LoRA adapters as the only trainable parameters (grpo.lora), and the KL reference without a second
copy: the policy with its adapters disabled is exactly the untouched base model."""

from __future__ import annotations

import copy

import pytest
import torch

from margrpo.heads import reinit_zero_layers_
from margrpo.models.tiny import TinyMAR, TinyMARConfig
from margrpo.rollout import RolloutConfig, choose_plan, generate, mask_schedule, rollout_logprob
from margrpo.train import lora as lora_utils
from margrpo.train import trainer as trainer_module
from margrpo.train.config import load_config
from margrpo.train.trainer import Trainer

PROMPTS = ["a red circle", "two blue squares"]


def tiny_model() -> TinyMAR:
    torch.manual_seed(0)
    config = TinyMARConfig(patch_size=8, width=32, depth=2, num_heads=2, head_width=32, head_depth=1, diffusion_steps=6)
    model = TinyMAR(config)
    reinit_zero_layers_(model.head, std=0.02)  # adaLN-zero would make the head ignore z
    return model


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "ckpt"
    tiny_model().save(path)
    return path


def randomize_adapters_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """LoRA B starts at zero (adapted == base); give every adapter weight a value so the test can fail."""
    with torch.no_grad():
        for p in lora_utils.adapter_parameters(model):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)


def rollout_of(model: TinyMAR):
    config = RolloutConfig(num_mask_steps=4, record_mask_steps=2, record_diffusion_steps=2, cfg_scale=2.0)
    sampler = model.make_sampler()
    counts = mask_schedule(model.num_tokens, config.num_mask_steps, config.schedule)
    plan = choose_plan(counts, sampler, config.record_mask_steps, config.record_diffusion_steps, torch.Generator().manual_seed(3))
    with torch.no_grad():
        return generate(model, PROMPTS, config, [11, 12], sampler=sampler, plan=plan)


def test_disabled_adapters_give_the_base_models_logprobs_float64(gen):
    base = tiny_model().double().eval()
    adapted = copy.deepcopy(base)
    adapters = lora_utils.apply_lora(adapted, rank=4)
    randomize_adapters_(adapted, gen)
    rollout = rollout_of(base)
    with torch.no_grad():
        expected = rollout_logprob(base, rollout)
        with lora_utils.adapters_disabled(adapted) as model:
            assert model is adapted
            disabled = rollout_logprob(adapted, rollout)
        enabled = rollout_logprob(adapted, rollout)
    assert expected.logp.dtype == torch.float64
    torch.testing.assert_close(disabled.logp, expected.logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(disabled.mean, expected.mean, rtol=1e-12, atol=1e-12)
    assert (enabled.logp - expected.logp).abs().max() > 1e-3  # the adapters do change the policy
    assert all(p.requires_grad for p in adapters)  # peft's toggling of requires_grad was undone


def test_default_targets_are_the_trainable_linears_outside_the_head():
    model = tiny_model()
    names = lora_utils.target_modules(model, [])
    assert names == ["token_embed", *[f"blocks.{i}.{layer}" for i in range(2) for layer in ("qkv", "proj", "mlp.0", "mlp.2")]]
    assert lora_utils.target_modules(model, [r"blocks\.\d+\.qkv"]) == ["blocks.0.qkv", "blocks.1.qkv"]
    with pytest.raises(ValueError, match="grpo.lora.targets: 'head.input_proj' matches no nn.Linear outside the head"):
        lora_utils.target_modules(model, ["head.input_proj"])
    lora_utils.apply_lora(model, rank=2, targets=[r"blocks\.1\.proj"])
    adapted = [name for name, _ in model.named_parameters() if ".lora_" in name]
    assert adapted == ["blocks.1.proj.lora_A.default.weight", "blocks.1.proj.lora_B.default.weight"]
    with pytest.raises(ValueError, match="already carries peft adapters"):
        lora_utils.apply_lora(model, rank=2)


def lora_trainer(tmp_path, checkpoint, *extra) -> Trainer:
    return Trainer(
        load_config(
            None,
            [
                f"backbone.checkpoint={checkpoint}",
                f"run.out_dir={tmp_path / 'run'}",
                "run.tensorboard=false",
                "run.eval_every=0",
                "run.save_every=0",
                "run.threads=1",
                "run.resume=never",
                "rollout.num_mask_steps=4",
                "rollout.record_mask_steps=2",
                "rollout.record_diffusion_steps=2",
                "grpo.group_size=4",
                "grpo.prompts_per_step=2",
                "rewards={jpeg_incompressibility: 1.0}",
                "optim.lr=1e-2",
                "grpo.lora.rank=4",
                "grpo.kl_beta=0.1",
                *extra,
            ],
        ),
        create_run_dir=False,
    )


def test_no_second_copy_and_a_step_trains_only_the_adapters(tmp_path, tiny_checkpoint, monkeypatch):
    copied = []
    original_deepcopy = copy.deepcopy

    def watching_deepcopy(value, *args, **kwargs):
        if isinstance(value, torch.nn.Module):
            copied.append(type(value).__name__)
        return original_deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(trainer_module.copy, "deepcopy", watching_deepcopy)
    trainer = lora_trainer(tmp_path, tiny_checkpoint)
    monkeypatch.undo()
    assert copied == [] and trainer.ref_policy is None
    base = TinyMAR.load(tiny_checkpoint)
    adapters = {id(p) for p in lora_utils.adapter_parameters(trainer.policy)}
    # the trainer holds the base weights once (plus the adapters), and trains the adapters only
    assert sum(p.numel() for p in trainer.policy.parameters() if id(p) not in adapters) == sum(p.numel() for p in base.parameters())
    trainable = {id(p) for p in trainer.policy.parameters() if p.requires_grad}
    assert trainable == adapters
    assert {id(p) for group in trainer.optimizer.param_groups for p in group["params"]} == adapters

    before = {name: p.detach().clone() for name, p in trainer.policy.named_parameters()}
    first = trainer.train_step()
    trainer.step += 1
    assert first["kl"] == pytest.approx(0.0, abs=1e-12)  # B = 0: the adapted policy starts as the base
    changed = {name for name, p in trainer.policy.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(".lora_B." in name for name in changed)  # A gets no gradient while B = 0
    second = trainer.train_step()
    assert second["kl"] > 0
    changed = {name for name, p in trainer.policy.named_parameters() if not torch.equal(p, before[name])}
    assert any(".lora_A." in name for name in changed)
    assert all(".lora_" in name for name in changed)


def test_the_trainers_reference_is_the_untouched_base_model(tmp_path, tiny_checkpoint, gen):
    trainer = lora_trainer(tmp_path, tiny_checkpoint)
    randomize_adapters_(trainer.policy, gen)  # as after training
    base = TinyMAR.load(tiny_checkpoint).eval()
    rollout = rollout_of(base)
    trainer.policy.eval()
    with torch.no_grad():
        expected = rollout_logprob(base, rollout)
        with lora_utils.adapters_disabled(trainer.policy) as base_policy:  # what the step passes as ref policy
            got = rollout_logprob(base_policy, rollout)
        adapted = rollout_logprob(trainer.policy, rollout)
    # the same float32 operations on the same weights: bit-identical
    assert torch.equal(got.logp, expected.logp) and torch.equal(got.mean, expected.mean)
    assert (adapted.logp - expected.logp).abs().max() > 1e-3

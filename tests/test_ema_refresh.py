"""run.ema_decay (an EMA of the trainable weights: its recursion, skipped steps, resume, run.eval_ema)
and grpo.ref_refresh_every (the KL reference becomes the policy every N steps, and stays so on
resume), on a tiny random-init MAR (CPU, seconds)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_checkpoint

from margrpo.config import ConfigError
from margrpo.rewards import Reward, register
from margrpo.train import trainer as trainer_module
from margrpo.train.config import load_config
from margrpo.train.trainer import Trainer


@register("test_ema_nan_on_some_calls")
class NaNOnSomeCalls(Reward):
    """NaN rewards on the calls listed in `nan_calls` (0-based), the mean brightness otherwise."""

    nan_calls: set[int] = set()
    calls = 0

    def score(self, images, prompts, metadata):
        call, type(self).calls = type(self).calls, type(self).calls + 1
        value = images.mean((1, 2, 3))
        return torch.full_like(value, float("nan")) if call in self.nan_calls else value


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def make(tmp_path, checkpoint, *extra, nan_calls=()) -> Trainer:
    NaNOnSomeCalls.nan_calls, NaNOnSomeCalls.calls = set(nan_calls), 0
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
                "run.max_bad_steps=100",
                "run.eval_per_category=1",
                "run.eval_samples_per_prompt=1",
                "rollout.num_mask_steps=4",
                "rollout.record_mask_steps=2",
                "rollout.record_diffusion_steps=2",
                "grpo.group_size=4",
                "grpo.prompts_per_step=2",
                "rewards={test_ema_nan_on_some_calls: 1.0}",
                "optim.lr=1e-2",
                *extra,
            ],
        )
    )


def steps(trainer: Trainer, count: int) -> list[dict]:
    out = []
    for _ in range(count):
        out.append(trainer.train_step())
        trainer.step += 1
    return out


def trainable(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def named(module, names) -> dict[str, torch.Tensor]:
    """The parameters called `names` (the reference is frozen: its copies of the trainable ones)."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if n in names}


def test_ema_follows_its_recursion_and_ignores_a_skipped_step(tmp_path, tiny_checkpoint):
    decay = 0.6
    trainer = make(tmp_path, tiny_checkpoint, f"run.ema_decay={decay}", nan_calls={1})
    expected = trainable(trainer.policy)
    assert set(trainer.ema.state_dict()) == set(expected)  # the trainable parameters only
    for step in range(3):
        metrics = steps(trainer, 1)[0]
        assert ("skipped" in metrics) == (step == 1)
        if step != 1:
            weights = trainable(trainer.policy)
            expected = {n: decay * e + (1 - decay) * weights[n] for n, e in expected.items()}
        ema = trainer.ema.state_dict()
        for n, e in expected.items():
            torch.testing.assert_close(ema[n], e, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(ema[n], p) for n, p in trainable(trainer.policy).items())


def test_held_out_evaluation_uses_the_ema_and_restores_the_training_weights(tmp_path, tiny_checkpoint, monkeypatch):
    trainer = make(tmp_path, tiny_checkpoint, "run.ema_decay=0.5", "run.eval_ema=true")
    steps(trainer, 1)
    weights, ema = trainable(trainer.policy), trainer.ema.state_dict()
    seen = []
    real = trainer_module.generate_images

    def spy(backbone, *args, **kwargs):
        seen.append(trainable(backbone))
        return real(backbone, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "generate_images", spy)
    trainer.evaluate(1, log=False)
    assert len(seen) == 1 and all(torch.equal(seen[0][n], ema[n]) for n in ema)
    assert any(not torch.equal(ema[n], weights[n]) for n in ema)
    assert all(torch.equal(p, weights[n]) for n, p in trainable(trainer.policy).items())
    assert all(torch.equal(t, ema[n]) for n, t in trainer.ema.state_dict().items())


def test_the_reference_becomes_the_policy_every_n_steps(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "grpo.kl_beta=0.1", "grpo.ref_refresh_every=2")
    start = named(trainer.ref_policy, trainable(trainer.policy))
    kls = [m["kl"] for m in steps(trainer, 2)]
    policy = trainable(trainer.policy)
    reference = named(trainer.ref_policy, policy)
    assert policy and all(torch.equal(reference[n], policy[n]) for n in policy)  # refreshed after step 2
    assert any(not torch.equal(policy[n], start[n]) for n in policy)
    kls += [m["kl"] for m in steps(trainer, 1)]
    assert kls[0] == pytest.approx(0.0, abs=1e-12) and kls[1] > 1e-8
    assert kls[2] == pytest.approx(0.0, abs=1e-12)  # the first update after a refresh is on the reference


def test_ema_and_refreshed_reference_resume_exactly(tmp_path, tiny_checkpoint):
    extra = ("run.ema_decay=0.9", "grpo.kl_beta=0.1", "grpo.ref_refresh_every=2", "run.steps=3")
    first = make(tmp_path, tiny_checkpoint, *extra)
    start = named(first.ref_policy, trainable(first.policy))
    steps(first, 2)
    first.save_checkpoint()
    final = steps(first, 1)[0]
    resumed = make(tmp_path, tiny_checkpoint, *extra)
    assert resumed.step == 2
    refreshed = named(resumed.ref_policy, start)
    assert any(not torch.equal(refreshed[n], start[n]) for n in refreshed)  # not the starting policy
    again = steps(resumed, 1)[0]
    assert again["kl"] == final["kl"]
    for ours, theirs in ((resumed.policy, first.policy), (resumed.ref_policy, first.ref_policy)):
        other = dict(theirs.named_parameters())
        assert all(torch.equal(p, other[n]) for n, p in ours.named_parameters())
    ema, expected = resumed.ema.state_dict(), first.ema.state_dict()
    assert ema.keys() == expected.keys() and all(torch.equal(ema[n], expected[n]) for n in ema)


@pytest.mark.parametrize(
    "key, extra, words",
    [
        ("run.ema_decay", ["run.ema_decay=1"], "[0, 1)"),
        ("run.ema_decay", ["run.ema_decay=-0.1"], "[0, 1)"),
        ("run.eval_ema", ["run.eval_ema=true"], "run.ema_decay"),
        ("grpo.ref_refresh_every", ["grpo.ref_refresh_every=-1"], ">= 0"),
        ("grpo.ref_refresh_every", ["grpo.ref_refresh_every=2", "grpo.lora.rank=4"], "grpo.lora.rank"),
        ("grpo.ref_refresh_every", ["grpo.ref_refresh_every=2", "grpo.kl_beta=0"], "grpo.kl_beta"),
    ],
)
def test_bad_settings_fail_at_load_naming_the_key(key, extra, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, extra)
    assert str(err.value).startswith(f"{key}: ") and words in str(err.value), str(err.value)

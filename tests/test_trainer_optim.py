"""What the trainer does around margrpo.grpo.update, on a tiny random-init MAR (CPU, seconds): the LR
schedule (through skipped steps), gradient clipping and the head's learning rate as the optimizer
sees them, fresh noise every step, drop_zero_variance in every advantage mode, and an on-policy
first update under fp32, bf16 autocast and bf16 weights."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_small_trainer, make_tiny_checkpoint

from margrpo.grpo import update
from margrpo.rewards import Reward, register
from margrpo.train import step as step_module
from margrpo.train.step import record_plan, step_prompts
from margrpo.train.trainer import Trainer

LR = 1e-3


@register("test_optim_mean")
class MeanBrightness(Reward):
    def score(self, images, prompts, metadata):
        return images.mean((1, 2, 3))


@register("test_optim_nan_on_some_calls")
class NaNOnSomeCalls(Reward):
    """NaN rewards on the calls listed in `nan_calls` (0-based), the mean brightness otherwise."""

    nan_calls: set[int] = set()
    calls = 0

    def score(self, images, prompts, metadata):
        call, type(self).calls = type(self).calls, type(self).calls + 1
        value = images.mean((1, 2, 3))
        return torch.full_like(value, float("nan")) if call in self.nan_calls else value


@register("test_optim_first_group_flat")
class FirstGroupFlat(Reward):
    """The mean brightness, except that the first group of 4 all get 0.5: one zero-variance group."""

    def score(self, images, prompts, metadata):
        value = images.mean((1, 2, 3))
        value[:4] = 0.5
        return value


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def make(tmp_path, checkpoint, *extra) -> Trainer:
    return make_small_trainer(
        tmp_path,
        checkpoint,
        "run.max_bad_steps=100",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=4",
        "grpo.prompts_per_step=2",
        "rewards={test_optim_mean: 1.0}",
        f"optim.lr={LR}",
        *extra,
    )


def steps(trainer: Trainer, count: int) -> list[dict]:
    out = []
    for _ in range(count):
        out.append(trainer.train_step())
        trainer.step += 1
    return out


def capture_optimizer_steps(trainer: Trainer) -> list[dict]:
    """Record, at every optimizer step, the lr of each param group and the total gradient norm."""
    seen = []

    def record(optimizer, args, kwargs):
        grads = [p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None]
        seen.append(
            {
                "lrs": [g["lr"] for g in optimizer.param_groups],
                "grad_norm": float(torch.cat(grads).norm()),
                "grads": {n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None},
            }
        )

    trainer.optimizer.register_step_pre_hook(record)
    return seen


# ---------------------------------------------------------------- the LR schedule
@pytest.mark.parametrize("schedule,nan_calls", [("constant", set()), ("cosine", set()), ("cosine", {1, 2, 4})])
def test_lr_schedule_follows_the_step_count_through_skipped_steps(tmp_path, tiny_checkpoint, schedule, nan_calls):
    warmup, total = 3, 7
    NaNOnSomeCalls.nan_calls, NaNOnSomeCalls.calls = nan_calls, 0
    trainer = make(
        tmp_path,
        tiny_checkpoint,
        f"optim.warmup_steps={warmup}",
        f"optim.schedule={schedule}",
        f"run.steps={total}",
        "rewards={test_optim_nan_on_some_calls: 1.0}",
    )
    seen = capture_optimizer_steps(trainer)

    def factor(step):  # linear warmup over `warmup` steps, then constant or a half cosine to `total`
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

    used = []
    for step in range(total):
        (metrics,) = steps(trainer, 1)
        assert ("skipped" in metrics) == (step in nan_calls)
        if step not in nan_calls:
            used.append((step, seen[len(used)]["lrs"][0]))
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(LR * factor(step + 1), rel=1e-12)
    assert len(used) == total - len(nan_calls) == len(seen)
    for step, lr in used:  # the lr an optimizer step used is the schedule's at its step
        assert lr == pytest.approx(LR * factor(step), rel=1e-12)


# ---------------------------------------------------------------- what the optimizer sees
def test_optimizer_steps_see_gradients_clipped_to_optim_grad_clip(tmp_path, tiny_checkpoint):
    for clip in (1e-4, 1e9):
        trainer = make(tmp_path / str(clip), tiny_checkpoint, f"optim.grad_clip={clip}", "grpo.kl_beta=0.1")
        seen = capture_optimizer_steps(trainer)
        metrics = trainer.train_step()
        assert metrics["grad_norm"] > 1e-3  # the norm before clipping: well above the small clip
        assert seen[0]["grad_norm"] == pytest.approx(min(clip, metrics["grad_norm"]), rel=1e-5)


@pytest.mark.parametrize("head,scale", [("low_lr", 0.1), ("low_lr", 0.25), ("train", 1.0)])
def test_a_trained_head_gets_its_own_learning_rate(tmp_path, tiny_checkpoint, head, scale):
    trainer = make(tmp_path, tiny_checkpoint, f"grpo.head={head}", f"grpo.head_lr_scale={scale}", "grpo.kl_beta=0", "optim.lr=1e-2")
    head_ids = {id(p) for p in trainer.policy.head.parameters()}
    groups = trainer.optimizer.param_groups
    assert [{id(p) for p in g["params"]} == head_ids for g in groups] == [False, True]
    assert not head_ids & {id(p) for p in groups[0]["params"]}
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    trainer.train_step()
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in trainer.policy.named_parameters()}
    head_move = max(v for n, v in moved.items() if n.startswith("head."))
    body_move = max(v for n, v in moved.items() if not n.startswith("head."))
    # AdamW's first step moves a parameter by at most its lr (about lr where the gradient is not tiny)
    assert 0.5 * 1e-2 * scale < head_move <= 1e-2 * scale * (1 + 1e-3)
    assert 0.5 * 1e-2 < body_move <= 1e-2 * (1 + 1e-3)


def test_every_step_draws_new_noise_and_prompts(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint)
    draws = [step_prompts(trainer, step) for step in range(4)]
    seeds = [s for _, step_seeds, _ in draws for s in step_seeds]
    assert len(set(seeds)) == len(seeds) == 4 * 8  # no two samples of any step share a seed
    assert len({tuple(prompts) for prompts, _, _ in draws}) > 1
    assert draws[2] == step_prompts(trainer, 2)  # reproducible per step (resume)
    plans = {repr(record_plan(trainer, step)) for step in range(4)}
    assert len(plans) > 1


# ---------------------------------------------------------------- drop_zero_variance
class SummedGradients(torch.optim.SGD):
    def __init__(self, params):
        self.params = list(params)
        super().__init__(self.params, lr=0.0)
        self.total = [torch.zeros_like(p) for p in self.params]

    def step(self, closure=None):
        for total, p in zip(self.total, self.params):
            if p.grad is not None:
                total += p.grad
        return super().step(closure)


@pytest.mark.parametrize("mode", ["group", "batch_std", "no_std", "tracker"])
def test_drop_zero_variance_trains_as_if_the_flat_groups_were_not_there(tmp_path, tiny_checkpoint, monkeypatch, mode):
    trainer = make(
        tmp_path,
        tiny_checkpoint,
        f"grpo.advantage={mode}",
        "grpo.drop_zero_variance=true",
        "grpo.kl_beta=0",
        "optim.lr=0",
        "optim.grad_clip=1e9",
        "rewards={test_optim_first_group_flat: 1.0}",
    )
    calls = []

    def spy(policy, ref_policy, rollout, advantages, config, optimizer, **kwargs):
        calls.append((rollout, advantages))
        return update(policy, ref_policy, rollout, advantages, config, optimizer, **kwargs)

    monkeypatch.setattr(step_module, "update", spy)
    seen = capture_optimizer_steps(trainer)
    trainer.train_step()
    ((rollout, advantages),) = calls
    rows = torch.arange(4, 8)  # the second group; the first one's rewards are all equal
    names = [n for n, p in trainer.policy.named_parameters() if p.requires_grad]
    optimizer = SummedGradients([p for p in trainer.policy.parameters() if p.requires_grad])
    update(trainer.policy, None, rollout.select(rows), advantages[rows], trainer.config.grpo, optimizer, grad_clip=1e9)
    assert sum(float(g.abs().sum()) for g in optimizer.total) > 0
    for name, want in zip(names, optimizer.total):
        torch.testing.assert_close(seen[0]["grads"][name], want, rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------- on-policy first update
@pytest.mark.parametrize(
    "numerics",
    [
        [],
        ["optim.bf16=true"],
        ["backbone.dtype=bfloat16"],
        ["optim.bf16=true", "grpo.micro_batches=2", "grpo.micro_batch_over=mask_steps"],
        ["backbone.dtype=bfloat16", "grpo.pixels_per_token=4"],
    ],
    ids=["fp32", "bf16-autocast", "bf16-weights", "bf16-micro-batches", "bf16-weights-pixels"],
)
def test_first_update_is_on_policy_under_every_numerics(tmp_path, numerics):
    """The ratio of the first update is 1 to fp32 rounding: the old log-probs are the training
    likelihood's own when its numerics differ from the rollout's (before: ratio_max 2.5 to 9 under
    bf16). The shipped pretrained model: a random-init one happens to round alike in both paths
    with bf16 weights."""
    trainer = make(
        tmp_path,
        "builtin:shapes-tiny",
        "backbone.diffusion_steps=6",
        "rollout.num_seeds=2",
        "rollout.likelihood_positions=unknown",
        "grpo.mte=true",
        "grpo.consistency=true",
        "grpo.consistency_start_step=1",
        "grpo.kl_beta=0.1",
        *numerics,
    )
    metrics = trainer.train_step()
    assert "skipped" not in metrics
    assert metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] < 1e-7
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    # fp32: recomputation sums in another order; a low-noise step amplifies it by |x - mean| / std^2
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=2e-2)


# ---------------------------------------------------------------- the frozen head and the KL reference
def test_a_frozen_head_gets_no_gradient_and_stays_out_of_the_clip_norm(tmp_path, tiny_checkpoint):
    """grpo.head: frozen (the default): gradients flow through the head into z, but the head's own
    parameters get none, so the clipped (and reported) norm is the body's alone; nor are they part
    of the run's trainable state (what checkpoints, the EMA and reference refreshes hold)."""
    trainer = make(tmp_path, tiny_checkpoint, "grpo.kl_beta=0.1", "optim.grad_clip=1e9")
    state = trainer.trainable_state()
    assert state and not [n for n in state if n.startswith("head.")]  # update() freezes the head only while it runs
    seen = capture_optimizer_steps(trainer)
    head = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if n.startswith("head.")}
    metrics = trainer.train_step()
    grads = seen[0]["grads"]
    assert grads and not [n for n in grads if n.startswith("head.")]
    body_norm = float(torch.cat([g.flatten() for g in grads.values()]).norm())
    assert metrics["grad_norm"] == pytest.approx(body_norm, rel=1e-6)
    for n, p in trainer.policy.named_parameters():
        if n.startswith("head."):
            assert torch.equal(p.detach(), head[n]) and p.grad is None


def test_the_kl_ref_policy_stays_the_starting_policy(tmp_path, tiny_checkpoint):
    """The KL of the first step is 0 (the policy is the reference), that of the next one positive
    (the policy moved, the reference did not), and the reference keeps the checkpoint's weights."""
    trainer = make(tmp_path, tiny_checkpoint, "grpo.kl_beta=0.1", "optim.lr=1e-2")
    start = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    first, second = steps(trainer, 2)
    assert first["kl"] == pytest.approx(0.0, abs=1e-12)
    assert second["kl"] > 1e-8
    assert any(not torch.equal(p.detach(), start[n]) for n, p in trainer.policy.named_parameters())
    for n, p in trainer.ref_policy.named_parameters():
        assert torch.equal(p, start[n]), n

"""The matching estimator (margrpo.grpo.matching): its score re-derived in float64 from the head's
official per-call forward, the draws fixed per rollout (on-policy ratio 1 in every update layout),
gradients through z only with a frozen head, its KL, and the rollout it reads (no transitions, the
whole chain of scored tokens private under common random numbers)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo.grpo import GRPOConfig, update
from margrpo.grpo.matching import (
    committed_columns,
    draw_matching,
    matching_kl,
    matching_score,
    matching_values,
)
from margrpo.rollout import RecordPlan, RolloutConfig, generate

F64 = torch.float64
PROMPTS = ["a red circle", "a blue square", "a red circle", "a green triangle"]
SEEDS = [21, 22, 23, 24]
# 16 tokens, 5 Harmon mask steps reveal (1, 3, 3, 5, 4) tokens
PLAN = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((), (), ()))


@pytest.fixture(scope="module")
def tiny():
    model = tiny_float64_mar(5, train_backbone=True)
    return model, model.make_sampler()


def _rollout(model, sampler, cfg_scale=1.0, **overrides):
    values = dict(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=cfg_scale,
        num_seeds=0,
        record_mask_steps=3,
        record_diffusion_steps=1,
        likelihood_positions="revealed",
    )
    return generate(model, PROMPTS, RolloutConfig(**{**values, **overrides}), SEEDS, sampler=sampler, plan=PLAN)


def _expected_score(model, sampler, rollout, draws, guided: bool, scale: float) -> torch.Tensor:
    """[B, L_m]: -1/2 mean_d sum_c (f - eps)^2, token by token through the head's official forward
    (x, t, z) and the backbone's forward_z, from the definitions."""
    B, C = rollout.batch_size, rollout.tokens.shape[-1]
    abar = torch.from_numpy(sampler._train_abar)
    cond_batch = model.encode_prompts(rollout.prompts)
    if guided:
        uncond_batch = model.encode_prompts([model.negative_prompt()] * B)
    columns = []
    for j, step in enumerate(rollout.plan.mask_steps):
        start, n = sum(rollout.reveal_counts[:step]), rollout.reveal_counts[step]
        known = torch.zeros(B, rollout.num_tokens, dtype=torch.bool)
        for b in range(B):
            known[b, rollout.order[b, :start]] = True
        canvas = torch.where(known[..., None], rollout.tokens, torch.zeros((), dtype=F64))
        z = model.forward_z(cond_batch, canvas, known, start)
        z_u = model.forward_z(uncond_batch, canvas, known, start) if guided else None
        for p in range(n):
            per_image = []
            for b in range(B):
                pos = int(rollout.order[b, start + p])
                x0 = rollout.tokens[b, pos]
                total = torch.zeros((), dtype=F64)
                for d in range(draws.num_draws):
                    t, eps = int(draws.times[j][d, b, p]), draws.noise[j][d, b, p]
                    x_t = abar[t].sqrt() * x0 + (1 - abar[t]).sqrt() * eps
                    time = torch.tensor([float(t)], dtype=F64)
                    out = model.head(x_t[None], time, z[b, pos][None])[0, :C]
                    if guided:
                        out_u = model.head(x_t[None], time, z_u[b, pos][None])[0, :C]
                        out = out_u + scale * (out - out_u)
                    total = total + (out - eps).pow(2).sum()
                per_image.append(-0.5 * total / draws.num_draws)
            columns.append(torch.stack(per_image))
    return torch.stack(columns, 1)


@pytest.mark.parametrize("cfg_scale", [1.0, 2.5])
def test_score_matches_a_float64_rederivation(tiny, cfg_scale):
    model, sampler = tiny
    rollout = _rollout(model, sampler, cfg_scale=cfg_scale)
    draws = draw_matching(rollout, 3)
    got = matching_score(matching_values(model, rollout, draws))
    expected = _expected_score(model, sampler, rollout, draws, guided=cfg_scale != 1.0, scale=cfg_scale)
    assert got.shape == (4, 1 + 3 + 5)  # the committed tokens of mask steps 0, 2, 3
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_draws_are_per_sample_and_reproducible(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    a, b = draw_matching(rollout, 2), draw_matching(rollout, 2)
    for j in range(3):
        assert torch.equal(a.times[j], b.times[j]) and torch.equal(a.noise[j], b.noise[j])
    # image 2 alone draws what it drew in the batch
    alone = draw_matching(rollout.select([2]), 2)
    for j in range(3):
        assert torch.equal(alone.noise[j][:, 0], a.noise[j][:, 2])
    # other images draw other noise
    assert not torch.equal(a.noise[0][:, 0], a.noise[0][:, 1])
    assert all(int(t.min()) >= 0 and int(t.max()) < sampler.num_train_timesteps for t in a.times)


def test_committed_columns_cover_the_steps_in_order(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    assert committed_columns(rollout, [2]).tolist() == [4, 5, 6, 7, 8]
    assert committed_columns(rollout, [1, 0]).tolist() == [1, 2, 3, 0]
    values = matching_values(model, rollout, draw_matching(rollout, 2), steps=[2, 0])
    full = matching_values(model, rollout, draw_matching(rollout, 2))
    torch.testing.assert_close(values.prediction, full.prediction[:, :, committed_columns(rollout, [2, 0])])


def test_rollout_for_matching_records_no_transitions(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    assert rollout.num_transitions == 0 and rollout.x_t.shape[2] == 0


def test_common_noise_keeps_the_scored_tokens_chains_private(tiny):
    """With shared seeds, two samples of a group are identical except the tokens committed at the
    recorded mask steps (and what follows from them)."""
    model, sampler = tiny
    config = RolloutConfig(num_mask_steps=5, schedule="harmon", cfg_scale=1.0, num_seeds=0, record_mask_steps=1, record_diffusion_steps=1)
    plan = RecordPlan(mask_steps=(4,), diffusion_steps=((),))  # the last step: nothing follows it
    out = generate(model, ["a red circle"] * 2, config, [1, 2], sampler=sampler, plan=plan, shared_seeds=[9, 9])
    start = sum(out.reveal_counts[:4])
    assert torch.equal(out.order[0], out.order[1])
    before, last = out.order[0, :start], out.order[0, start:]
    torch.testing.assert_close(out.tokens[0, before], out.tokens[1, before])  # shared noise before the scored step
    # private noise on every scored token (channels may agree where both clip to +-1)
    assert ((out.tokens[0, last] - out.tokens[1, last]).abs().amax(-1) > 1e-6).all()


def _config(**overrides) -> GRPOConfig:
    values = dict(estimator="matching", matching_draws=3, kl_beta=0.0, clip_eps=0.2)
    return GRPOConfig(**{**values, **overrides})


@pytest.mark.parametrize(
    "layout", [dict(), dict(minibatches=2), dict(inner_epochs=2, minibatches=2), dict(micro_batches=2, micro_batch_over="mask_steps")]
)
def test_ratio_is_one_while_the_policy_does_not_move(tiny, layout):
    """lr 0: every evaluation scores the same draws as the old scores, so every ratio is 1 and
    nothing clips, whichever minibatch layout needs the old scores precomputed."""
    model, sampler = tiny
    policy = copy.deepcopy(model)
    rollout = _rollout(policy, sampler)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64)
    result = update(policy, None, rollout, advantages, _config(**layout), optimizer)
    assert result.skipped is None
    assert abs(result.metrics["ratio_max"] - 1.0) < 1e-12
    assert result.metrics["clip_fraction"] == 0.0
    assert result.metrics["updates"] == layout.get("minibatches", 1) * layout.get("inner_epochs", 1)


def test_gradient_reaches_z_only_with_the_head_frozen(tiny):
    """The policy term's gradient is -sum_t w A ds/dtheta (on-policy), with gradient in the AR
    model's weights and none in the frozen head's."""
    model, sampler = tiny
    policy = copy.deepcopy(model)
    rollout = _rollout(policy, sampler)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    captured = []

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured.extend(p.grad.clone() for p in trainable)
            return super().step(closure)

    update(policy, None, rollout, advantages, _config(), Capture(trainable, lr=0.0), grad_clip=float("inf"))
    assert all(p.grad is None for p in policy.head.parameters())
    # the same gradient from the definition: token_mean weights over the batch's committed tokens
    policy.zero_grad()
    policy.train()
    score = matching_score(matching_values(policy, rollout, draw_matching(rollout, 3)))
    (-(advantages[:, None] * score).sum() / score.numel()).backward()
    expected = [p.grad for p in trainable]
    assert any(g.abs().sum() > 0 for g in expected)
    for got, want in zip(captured, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_kl_is_zero_against_itself_and_grows_with_the_gap(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    values = matching_values(model, rollout, draw_matching(rollout, 2))
    active = values.active
    assert torch.equal(matching_kl(values.prediction, values.prediction, active), torch.zeros(4, 9, dtype=F64))
    shifted = values.prediction + 0.1
    C = values.prediction.shape[-1]
    torch.testing.assert_close(matching_kl(values.prediction, shifted, active), torch.full((4, 9), 0.5 * 0.01 * C, dtype=F64))


def test_update_with_kl_runs_and_reports_it(tiny):
    model, sampler = tiny
    policy, reference = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    rollout = _rollout(policy, sampler)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.0)
    result = update(policy, reference, rollout, torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64), _config(kl_beta=0.1), optimizer)
    assert result.metrics["kl"] > 0
    same = update(
        reference,
        copy.deepcopy(reference),
        _rollout(reference, sampler),
        torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64),
        _config(kl_beta=0.1),
        torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.0),
    )
    assert same.metrics["kl"] == pytest.approx(0.0, abs=1e-20)


def test_post_step_known_mask_is_refused(tiny):
    model, sampler = tiny
    plan = RecordPlan(mask_steps=(0, 2), diffusion_steps=((1,), (1,)))
    rollout = generate(
        model,
        PROMPTS,
        RolloutConfig(
            num_mask_steps=5,
            schedule="harmon",
            cfg_scale=1.0,
            record_mask_steps=2,
            record_diffusion_steps=1,
            known_mask="post_step",
            likelihood_positions="unknown",
        ),
        SEEDS,
        sampler=sampler,
        plan=plan,
    )
    with pytest.raises(ValueError, match="known_mask: pre_step"):
        matching_values(model, rollout, draw_matching(rollout, 1))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grpo.estimator=matching", "rollout.known_mask=post_step", "rollout.likelihood_positions=unknown"], "known_mask: pre_step"),
        (["grpo.estimator=matching", "grpo.pixels_per_token=4"], "pixels_per_token: 1"),
        (["grpo.estimator=matching", "grpo.kl_type=k3_logp"], "kl_type: gaussian"),
        (["grpo.matching_draws=0"], "grpo.matching_draws"),
    ],
)
def test_config_refuses_what_matching_cannot_do(overrides, message):
    from margrpo.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


# ---------------------------------------------------------------- rollout.seed_chains: commit (parity MTE)
def _seeded(model, sampler, **overrides):
    values = dict(num_mask_steps=5, schedule="harmon", cfg_scale=2.0, num_seeds=2, record_mask_steps=3, record_diffusion_steps=2)
    plan = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))
    return generate(model, PROMPTS, RolloutConfig(**{**values, **overrides}), SEEDS, sampler=sampler, plan=plan)


def test_commit_chains_equal_step_chains_for_revealed_tokens(tiny):
    """A token committed at the recorded step has z_c = z_j: the same chains in both modes."""
    model, sampler = tiny
    step, commit = _seeded(model, sampler), _seeded(model, sampler, seed_chains="commit")
    for name in ("x_t", "x_prev", "mean", "std", "logp"):
        torch.testing.assert_close(getattr(commit, name), getattr(step, name), rtol=1e-10, atol=1e-12)


def test_commit_chains_of_later_tokens_come_from_their_commit_step(tiny):
    """In "unknown" mode a position committed after recorded step j gets, as seed chains at j, the
    chains its commit step draws (z_c, same noise), scored under z_j: trajectory 0 and the committed
    positions are unchanged; the later positions' seed transitions differ from the step-drawn ones
    and their recorded log-probs are those of rollout_logprob under the rollout's own policy."""
    from margrpo.rollout import rollout_logprob

    model, sampler = tiny
    step = _seeded(model, sampler, likelihood_positions="unknown")
    commit = _seeded(model, sampler, likelihood_positions="unknown", seed_chains="commit")
    assert torch.equal(commit.x_prev[0], step.x_prev[0])
    committed = step.l_committed()
    torch.testing.assert_close(commit.x_prev[1:, :, committed], step.x_prev[1:, :, committed])
    later = ~committed
    assert later.any()
    assert (commit.x_prev[1:, :, later] - step.x_prev[1:, :, later]).abs().amax() > 1e-3
    with torch.no_grad():
        rescored = rollout_logprob(model, commit)
    torch.testing.assert_close(rescored.logp, commit.logp, rtol=1e-9, atol=1e-9)  # on-policy: ratio 1
    # the chain a later position gets at step 0 is the one its commit step records: compare x_t at a
    # diffusion step both steps record (step 0 records diffusion steps (0, 3), step 3 records (0, 2))
    n3 = commit.slots[2].revealed
    for b in range(commit.batch_size):
        pos3 = commit.positions(2)[b, :n3].tolist()  # committed at recorded step index 2 (mask step 3)
        pos0 = commit.positions(0)[b].tolist()
        for p in pos3:
            at0, at3 = pos0.index(p), pos3.index(p)
            x0 = commit.x_t[1:, b, commit.l_slice(0).start + at0]  # diffusion step 0 is r = 0 at both
            x3 = commit.x_t[1:, b, commit.l_slice(2).start + at3]
            torch.testing.assert_close(x0, x3)


def test_commit_chains_refuse_the_post_step_mask():
    with pytest.raises(ValueError, match="seed_chains"):
        RolloutConfig(
            num_mask_steps=5,
            schedule="harmon",
            num_seeds=2,
            record_mask_steps=2,
            likelihood_positions="unknown",
            known_mask="post_step",
            seed_chains="commit",
        )


# ---------------------------------------------------------------- matching + MTE: more draws on uncertain tokens
def test_active_draws_score_like_a_uniform_subset(tiny):
    """A token's score over its active draws equals the uniform score of exactly those draws."""
    from margrpo.grpo.matching import MatchingDraws

    model, sampler = tiny
    rollout = _rollout(model, sampler)
    draws = draw_matching(rollout, 5)
    gen = torch.Generator().manual_seed(0)
    active = [torch.rand(t.shape, generator=gen) < 0.6 for t in draws.times]
    for a in active:
        a[0] = True  # every token keeps at least one draw
    got = matching_score(matching_values(model, rollout, draws.with_active(active)))
    full = matching_values(model, rollout, draws)
    error = -0.5 * (full.prediction - full.target).pow(2).sum(-1)  # [D, B, L]
    mask = torch.cat(active, 2).double()
    expected = (error * mask).sum(0) / mask.sum(0)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert isinstance(draws, MatchingDraws)


def test_draw_counts_keep_the_uniform_budget():
    from margrpo.grpo.matching import draw_counts

    for draws in (1, 2, 4, 8, 16):
        for ratio in (0.1, 0.3, 0.5, 1.0):
            base, extra = draw_counts(draws, ratio)
            assert base >= 1 and extra >= 0
            assert base + ratio * extra <= draws + 1e-9  # never more than the uniform budget
            assert draws - (base + ratio * extra) < max(ratio, 1.0 - 1e-9) + 1e-9  # and at most one draw short


def test_mte_gives_uncertain_tokens_more_draws_in_the_update(tiny):
    model, sampler = tiny
    policy = copy.deepcopy(model)
    rollout = _seeded(policy, sampler, cfg_scale=1.0)  # 2 seed chains: the uncertainty
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.0)
    result = update(
        policy,
        None,
        rollout,
        torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64),
        _config(mte=True, mte_ratio=0.3, matching_draws=4),
        optimizer,
    )
    assert 0.0 < result.metrics["mte_fraction"] < 1.0
    assert abs(result.metrics["ratio_max"] - 1.0) < 1e-12


def test_diagnose_checks_the_matching_ratio(tmp_path_factory, tmp_path):
    """margrpo diagnose's on-policy check under matching: the old and new scores of the first update
    agree (no dropout in the tiny model), and the recorded-transition check has nothing to check."""
    from conftest import make_small_trainer, make_tiny_checkpoint

    from margrpo.train.diagnostics import first_update_log_ratio, recorded_logp_error

    trainer = make_small_trainer(
        tmp_path,
        make_tiny_checkpoint(tmp_path_factory, 1),
        "grpo.estimator=matching",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.prompts_per_step=2",
        "grpo.group_size=2",
    )
    _, rollout = trainer.rollout(0)
    assert rollout.num_transitions == 0 and recorded_logp_error(rollout) == 0.0
    assert first_update_log_ratio(trainer, rollout) < 1e-5


def test_time_range_limits_the_draws(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    draws = draw_matching(rollout, 8, (0.25, 0.5))
    times = torch.cat(draws.times, 2)
    assert int(times.min()) >= 250 and int(times.max()) < 500
    full = torch.cat(draw_matching(rollout, 8).times, 2)
    assert int(full.max()) >= 500  # the default covers the whole process


@pytest.mark.parametrize("bad", ["[0.5, 0.5]", "[-0.1, 1.0]", "[0.0, 1.5]", "[0.2]"])
def test_config_refuses_a_bad_time_range(bad):
    from margrpo.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="grpo.matching_times"):
        load_config(None, [f"grpo.matching_times={bad}"])

"""RolloutConfig.known_mask = "post_step" (the reference Harmon code's training forward, parity preset):
the step's own tokens are known in its training forward and only the positions still unknown after
the step enter its likelihood. TinyMAR at tiny sizes in float64 on CPU; the file runs in seconds.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from margrpo.diffusion import DDPMSampler
from margrpo.heads import Guidance, SimpleMLPAdaLN, reinit_zero_layers_
from margrpo.models.tiny import TinyMAR, TinyMARConfig
from margrpo.rollout import RecordPlan, RolloutConfig, choose_plan, effective_steps, generate, rollout_logprob
from margrpo.rollout.schedule import mask_schedule

PROMPTS = ["a red circle", "a blue square left of a green circle", "a red circle"]
SEEDS = [11, 12, 13]
# TinyMAR below: 16 tokens; 5 Harmon mask steps reveal (1, 3, 3, 5, 4) tokens, all effective
PLAN = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))


def _tiny(learned_variance: bool):
    """(float64 TinyMAR in eval mode, its sampler); learned_variance swaps in a 2C-output head and a
    learned-range sampler (Harmon-like: the std depends on z)."""
    torch.manual_seed(3)
    model = TinyMAR(
        TinyMARConfig(image_size=16, patch_size=4, width=32, depth=1, num_heads=2, head_width=32, head_depth=1, diffusion_steps=6)
    )
    if learned_variance:
        C = model.token_channels
        model.head = SimpleMLPAdaLN(C, 32, 2 * C, model.config.width, 1)
        sampler = DDPMSampler(
            6, beta_schedule="cosine", spacing="iddpm", prediction_type="epsilon", variance_type="learned_range", clip_sample=1.0
        )
    else:
        sampler = model.make_sampler()
    with torch.no_grad():
        reinit_zero_layers_(model.head, std=0.2)  # adaLN-zero would make the head ignore z
    return model.double().eval(), sampler


@pytest.fixture(scope="module")
def tiny():
    return _tiny(learned_variance=False)


@pytest.fixture(scope="module")
def tiny_learned():
    return _tiny(learned_variance=True)


def _config(**overrides) -> RolloutConfig:
    values = dict(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=2.5,
        cfg_channels="eps",
        num_seeds=2,
        record_mask_steps=3,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
        known_mask="post_step",
    )
    return RolloutConfig(**{**values, **overrides})


class RecordingBackbone:
    """A backbone that records the (canvas, known) of every forward_z call and delegates the rest."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward_z(self, prompts, canvas, known, known_count=None):
        self.calls.append((canvas.clone(), known.clone()))
        return self.model.forward_z(prompts, canvas, known, known_count)


def _known_after(rollout, j: int) -> int:
    """Tokens known after recorded step j, from the schedule (independent of Rollout's helpers)."""
    return sum(rollout.reveal_counts[: rollout.plan.mask_steps[j] + 1])


# ---------------------------------------------------------------- configuration
def test_post_step_needs_unknown_positions_when_recording():
    with pytest.raises(ValueError, match="known_mask: got 'post_step' with likelihood_positions 'revealed'"):
        RolloutConfig(known_mask="post_step", likelihood_positions="revealed")
    with pytest.raises(ValueError, match="known_mask: got 'after'"):
        RolloutConfig(known_mask="after")
    # a copy that records nothing (evaluation, sampling) may keep post_step
    quiet = dataclasses.replace(_config(), record_mask_steps=0, likelihood_positions="revealed")
    assert quiet.known_mask == "post_step"


def test_an_explicit_plan_under_a_non_recording_post_step_config_raises(tiny):
    model, sampler = tiny
    quiet = _config(record_mask_steps=0, likelihood_positions="revealed")
    with pytest.raises(ValueError, match="known_mask.*likelihood_positions"):
        generate(model, PROMPTS, quiet, SEEDS, sampler=sampler, plan=PLAN)


def test_choose_plan_never_picks_the_final_step_under_post_step(tiny):
    _, sampler = tiny
    counts = mask_schedule(16, 5, "harmon")
    effective = effective_steps(counts)
    for seed in range(20):
        plan = choose_plan(counts, sampler, len(effective) - 1, 2, torch.Generator().manual_seed(seed), known_mask="post_step")
        assert plan.mask_steps == tuple(effective[:-1])
    with pytest.raises(ValueError, match="record_mask_steps: got 5, expected 0..4.*leave some unknown"):
        choose_plan(counts, sampler, len(effective), 2, torch.Generator(), known_mask="post_step")
    with pytest.raises(ValueError, match="known_mask: got 'post'"):
        choose_plan(counts, sampler, 1, 2, torch.Generator(), known_mask="post")


# ---------------------------------------------------------------- recording and recomputation
@pytest.mark.parametrize("variance", ["fixed", "learned"])
@pytest.mark.parametrize("guidance", [dict(cfg_scale=2.5), dict(cfg_scale=1.0), dict(cfg_schedule="linear")])
def test_recomputed_logprobs_equal_the_recorded_ones(request, variance, guidance, poison_uninitialized):
    model, sampler = request.getfixturevalue("tiny" if variance == "fixed" else "tiny_learned")
    rollout = generate(model, PROMPTS, _config(**guidance), SEEDS, sampler=sampler, plan=PLAN)
    assert torch.isfinite(rollout.logp).all() and rollout.logp.shape[2] > 0
    likelihood = rollout_logprob(model, rollout)
    torch.testing.assert_close(likelihood.logp, rollout.logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(likelihood.mean, rollout.mean, rtol=1e-12, atol=1e-12)
    assert not likelihood.mask.any()  # no transition belongs to a token committed at its step
    one = rollout_logprob(model, rollout, steps=[1])
    torch.testing.assert_close(one.logp, rollout.logp[:, :, rollout.l_slice(1)], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variance", ["fixed", "learned"])
def test_recorded_gaussian_is_the_policy_under_the_post_step_canvas(request, variance):
    """mean, std and logp against a by-hand evaluation: the backbone on the canvas after the step,
    the head's plain forward on both guidance halves, the sampler's Gaussian."""
    model, sampler = request.getfixturevalue("tiny" if variance == "fixed" else "tiny_learned")
    config = _config()
    rollout = generate(model, PROMPTS, config, SEEDS, sampler=sampler, plan=PLAN)
    B, C = len(PROMPTS), model.token_channels
    prompts = model.encode_prompts(PROMPTS).cat(model.encode_prompts([model.negative_prompt()]).repeat_interleave(B))
    for j in range(PLAN.num_mask_steps):
        done = _known_after(rollout, j)
        known = torch.zeros(B, model.num_tokens, dtype=torch.bool)
        known.scatter_(1, rollout.order[:, :done], True)
        canvas = torch.where(known[..., None], rollout.tokens, torch.zeros(()).double())
        z = model.forward_z(prompts, canvas.repeat(2, 1, 1), known.repeat(2, 1))
        later = rollout.order[:, done:]
        P = later.shape[1]
        z_later = [half.gather(1, later[..., None].expand(-1, -1, z.shape[-1])) for half in z.chunk(2)]  # [B, P, Dz]
        part = rollout.l_slice(j)
        guide = Guidance(config.cfg_scale, channels="eps")
        for r, i in enumerate(PLAN.diffusion_steps[j]):
            cols = slice(part.start + r * P, part.start + (r + 1) * P)
            x_t, x_prev = rollout.x_t[:, :, cols], rollout.x_prev[:, :, cols]  # [T, B, P, C]
            t = torch.tensor(float(sampler.model_time(i))).double()
            cond, uncond = (model.head(x_t, t, half.reshape(B, P, -1)) for half in z_later)
            out = guide.combine(cond, uncond, C)
            mean, std = sampler.mean_std(out, x_t, i)
            torch.testing.assert_close(rollout.mean[:, :, cols], mean, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(rollout.std[:, :, cols], std.expand_as(x_t), rtol=1e-10, atol=1e-10)
            logp = sampler.logprob(x_prev, out, x_t, i)
            torch.testing.assert_close(rollout.logp[:, :, cols], logp, rtol=1e-10, atol=1e-10)


def test_post_step_keeps_the_image_and_the_drawn_transitions(tiny):
    """Same seeds, same plan: the image, the seed tokens, the consistency records and the drawn
    chains are those of the pre-step rollout; only the positions and the scoring change."""
    model, sampler = tiny
    post = generate(model, PROMPTS, _config(), SEEDS, sampler=sampler, plan=PLAN)
    pre = generate(model, PROMPTS, _config(known_mask="pre_step"), SEEDS, sampler=sampler, plan=PLAN)
    for name in ("order", "tokens", "seed_tokens", "images", "pred_clean", "pred_clean_prev"):
        torch.testing.assert_close(getattr(post, name), getattr(pre, name), rtol=0, atol=0)
    for j in range(PLAN.num_mask_steps):
        n, P_pre, P_post = pre.slots[j].revealed, pre.slots[j].count, post.slots[j].count
        assert P_post == P_pre - n
        for name in ("x_t", "x_prev"):
            per_pre = getattr(pre, name)[:, :, pre.l_slice(j)].unflatten(2, (-1, P_pre))
            per_post = getattr(post, name)[:, :, post.l_slice(j)].unflatten(2, (-1, P_post))
            torch.testing.assert_close(per_post, per_pre[:, :, :, n:], rtol=0, atol=0)
        # scored under another canvas: the recorded Gaussian differs from the one the chain was drawn from
        per_pre = pre.logp[:, :, pre.l_slice(j)].unflatten(2, (-1, P_pre))[:, :, :, n:]
        assert not torch.allclose(post.logp[:, :, post.l_slice(j)].unflatten(2, (-1, P_post)), per_pre)


def test_likelihood_positions_are_exactly_the_post_step_unknowns(tiny):
    model, sampler = tiny
    rollout = generate(model, PROMPTS, _config(), SEEDS, sampler=sampler, plan=PLAN)
    B, N, R, M = len(PROMPTS), model.num_tokens, PLAN.num_diffusion_steps, PLAN.num_mask_steps
    for j, step in enumerate(PLAN.mask_steps):
        before = sum(rollout.reveal_counts[:step])
        expected_count = (N - before) - rollout.reveal_counts[step]
        positions = rollout.positions(j)
        assert positions.shape == (B, expected_count) == (B, rollout.slots[j].count)
        for b in range(B):
            known_after = set(rollout.order[b, : _known_after(rollout, j)].tolist())
            assert set(positions[b].tolist()) == set(range(N)) - known_after
    assert rollout.logp.shape[2] == R * sum(rollout.slots[j].count for j in range(M))
    assert not rollout.l_committed().any()
    # MTE / consistency masks land on the transitions' own positions
    gen = torch.Generator().manual_seed(5)
    l_positions = rollout.l_positions()
    per_token = torch.randn(B, N, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(rollout.expand_to_l(per_token), per_token.gather(1, l_positions), rtol=0, atol=0)
    per_step = torch.randn(B, M, N, generator=gen, dtype=torch.float64)
    expected = per_step.gather(2, l_positions[:, None].expand(-1, M, -1)).gather(1, rollout.l_step().expand(B, 1, -1))
    torch.testing.assert_close(rollout.expand_to_l(per_step), expected[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("known_mask", ["pre_step", "post_step"])
def test_training_forward_canvas_holds_the_steps_tokens_only_under_post_step(tiny, known_mask):
    model, sampler = tiny
    recording = RecordingBackbone(model)
    rollout = generate(recording, PROMPTS, _config(known_mask=known_mask), SEEDS, sampler=sampler, plan=PLAN)
    assert len(recording.calls) == len(effective_steps(list(rollout.reveal_counts)))  # no extra forward
    B = len(PROMPTS)
    for j, step in enumerate(PLAN.mask_steps):
        recording.calls.clear()
        rollout_logprob(recording, rollout, steps=[j])
        ((canvas, known),) = recording.calls
        canvas, known = canvas[:B], known[:B]  # the cond rows (the uncond rows repeat them)
        before = sum(rollout.reveal_counts[:step])
        own = rollout.order[:, before : before + rollout.reveal_counts[step]]  # committed at this step
        earlier = rollout.order[:, :before]
        assert known.gather(1, earlier).all()
        index = own[..., None].expand(-1, -1, model.token_channels)
        own_tokens, own_canvas = rollout.tokens.gather(1, index), canvas.gather(1, index)
        if known_mask == "post_step":
            assert known.gather(1, own).all() and int(known.sum()) == B * (before + own.shape[1])
            torch.testing.assert_close(own_canvas, own_tokens, rtol=0, atol=0)
        else:
            assert not known.gather(1, own).any() and int(known.sum()) == B * before
            assert not own_canvas.any()


def test_a_recorded_final_step_records_nothing_and_backpropagates(tiny):
    """A plan drawn without known_mask (e.g. by a trainer) may hold the final step: it keeps no
    position, and its empty likelihood still carries a graph, so a backward over it is a no-op."""
    model, sampler = tiny
    final = effective_steps(list(mask_schedule(16, 5, "harmon")))[-1]
    plan = RecordPlan(mask_steps=(2, final), diffusion_steps=((0, 3), (1, 2)))
    rollout = generate(model, PROMPTS, _config(), SEEDS, sampler=sampler, plan=plan)
    assert rollout.slots[1].count == 0 and rollout.l_slice(1).start == rollout.l_slice(1).stop
    assert rollout.logp.shape[2] == plan.num_diffusion_steps * rollout.slots[0].count
    policy = copy.deepcopy(model).train()
    empty = rollout_logprob(policy, rollout, steps=[1])
    assert empty.logp.shape == (3, len(PROMPTS), 0) and empty.logp.requires_grad
    (empty.logp.sum() * 0.0).backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())


def test_one_trainer_step_with_post_step_is_on_policy(tmp_path, tiny):
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    model, _ = tiny
    checkpoint = tmp_path / "ckpt"
    copy.deepcopy(model).float().save(checkpoint)
    overrides = [
        f"backbone.checkpoint={checkpoint}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=1",
        "rollout.num_mask_steps=5",
        "rollout.schedule=harmon",
        "rollout.cfg_scale=2.5",
        "rollout.num_seeds=2",
        "rollout.record_mask_steps=3",
        "rollout.record_diffusion_steps=2",
        "rollout.likelihood_positions=unknown",
        "rollout.known_mask=post_step",
        "grpo.group_size=2",
        "grpo.prompts_per_step=2",
        "grpo.mte=true",
        "grpo.consistency=true",
        "grpo.consistency_start_step=1",
        "grpo.kl_beta=0.1",
        "rewards={jpeg_incompressibility: 1.0}",
    ]
    trainer = Trainer(load_config(None, overrides))
    metrics = trainer.train_step()
    assert "skipped" not in metrics and metrics["updates"] == 1
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["grad_norm"] > 0


@pytest.mark.parametrize("variance", ["fixed", "learned"])
def test_sampled_std_is_the_pre_step_draws_std(request, variance):
    """The std trajectory 0 was drawn with at the step (under the pre-step canvas): the pre-step
    rollout's std of the same transitions. The recorded std is the post-step re-evaluation, which a
    learned-range head changes; a fixed variance does not."""
    model, sampler = request.getfixturevalue("tiny" if variance == "fixed" else "tiny_learned")
    post = generate(model, PROMPTS, _config(), SEEDS, sampler=sampler, plan=PLAN)
    pre = generate(model, PROMPTS, _config(known_mask="pre_step"), SEEDS, sampler=sampler, plan=PLAN)
    assert pre.sampled_std is None
    B, L, C = len(PROMPTS), post.num_transitions, model.token_channels
    assert post.sampled_std.shape == (1, B, L, C) and post.sampled_std.dtype == post.std.dtype
    for j in range(PLAN.num_mask_steps):
        n, P_pre, P_post = pre.slots[j].revealed, pre.slots[j].count, post.slots[j].count
        drawn = pre.std[:1, :, pre.l_slice(j)].unflatten(2, (-1, P_pre))[:, :, :, n:]
        sampled = post.sampled_std[:, :, post.l_slice(j)].unflatten(2, (-1, P_post))
        torch.testing.assert_close(sampled, drawn, rtol=0, atol=0)
    assert (post.sampled_std > 0).all()
    if variance == "learned":
        assert not torch.allclose(post.sampled_std, post.std[:1], rtol=1e-3, atol=0)
    else:
        torch.testing.assert_close(post.sampled_std, post.std[:1], rtol=1e-12, atol=0)
    # selection, chunks and moves carry it like the other trajectory-first fields
    part = post.select([2, 0])
    assert torch.equal(part.sampled_std, post.sampled_std[:, [2, 0]])
    chunk = post.chunk([1, 2], [1])
    assert torch.equal(chunk.sampled_std, post.sampled_std[:, 1:3, post.l_slice(1)])
    assert post.to("meta").sampled_std.device.type == "meta"


def test_recorded_main_update_is_on_policy_with_the_sampling_time_std(tiny_learned):
    """post_step + likelihood_std recorded_main + the clipped ratio on a learned-range head: the old
    log-probs use the same sampling-time std, so the first update's ratio is 1, and k3 against a
    reference equal to the policy is 0 (its reference log-probs use that std too, not the
    reference head's post-step std)."""
    from margrpo.grpo import GRPOConfig, update

    model, sampler = tiny_learned
    rollout = generate(model, PROMPTS, _config(), SEEDS, sampler=sampler, plan=PLAN)
    policy, reference = copy.deepcopy(model), copy.deepcopy(model)
    config = GRPOConfig(group_size=3, prompts_per_step=1, objective="clip", likelihood_std="recorded_main", kl_type="k3_logp", kl_beta=0.1)
    advantages = torch.tensor([1.0, -0.5, -0.5], dtype=torch.float64)
    result = update(policy, reference, rollout, advantages, config, torch.optim.SGD(policy.parameters(), lr=0.0))
    assert result.skipped is None and result.metrics["grad_norm"] > 0
    assert result.metrics["ratio_max"] == pytest.approx(1.0, abs=1e-9)
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-9)
    assert result.metrics["kl"] == pytest.approx(0.0, abs=1e-12)

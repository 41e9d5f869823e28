"""Invariants of the GRPO bookkeeping, each checked over several configurations rather than at one
point (issue 30): the prompt tracker after a checkpoint round trip, the KL of tokens split into
pixels, the number of optimizer steps per pass, and which recorded steps consistency selection
applies to on schedules with steps that reveal nothing."""

from __future__ import annotations

import io
import itertools
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo.grpo import GRPOConfig
from margrpo.grpo.advantages import PromptTracker
from margrpo.grpo.objective import chunk_loss, position_logp
from margrpo.grpo.policy_update import minibatches, token_selection
from margrpo.rollout import RecordPlan, RolloutConfig, effective_steps, generate
from margrpo.rollout.record import Rollout
from margrpo.rollout.schedule import mask_schedule

F64 = torch.float64


# ---------------------------------------------------------------- the prompt tracker after a restore
def _batches(gen: torch.Generator, count: int) -> list[tuple[list[str], torch.Tensor]]:
    """Batches of 1-6 rewards for prompts drawn from three, repeats within a batch included."""
    out = []
    for _ in range(count):
        size = int(torch.randint(1, 7, (), generator=gen))
        prompts = [("a", "b", "c")[int(i)] for i in torch.randint(0, 3, (size,), generator=gen)]
        out.append((prompts, torch.randn(size, generator=gen, dtype=F64)))
    return out


def _round_trip(state: dict) -> dict:
    """The state as a checkpoint stores it (torch.save / torch.load)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("buffer_size,min_count,split", [(1, 1, 0), (2, 1, 3), (3, 2, 5), (4, 4, 7), (8, 3, 10)])
def test_a_restored_tracker_equals_a_fresh_one_fed_the_same_rewards(buffer_size, min_count, split):
    """Restored from its state after `split` batches, a tracker gives the advantages an uninterrupted
    one gives and keeps the same history, forgetting the same rewards (at most buffer_size per
    prompt), whatever the tracker it was loaded into had been built with."""
    gen = torch.Generator().manual_seed(1000 * buffer_size + split)
    batches = _batches(gen, split + 12)  # enough after the restore to overflow every buffer
    fresh = PromptTracker(buffer_size=buffer_size, min_count=min_count)
    first = PromptTracker(buffer_size=buffer_size, min_count=min_count)
    for prompts, rewards in batches[:split]:
        torch.testing.assert_close(first(prompts, rewards), fresh(prompts, rewards), rtol=0, atol=0)
    restored = PromptTracker(buffer_size=buffer_size + 5, min_count=0, eps=1.0)  # overwritten by the state
    restored.load_state_dict(_round_trip(first.state_dict()))
    assert (restored.buffer_size, restored.min_count, restored.eps) == (buffer_size, min_count, fresh.eps)
    for prompts, rewards in batches[split:]:
        torch.testing.assert_close(restored(prompts, rewards), fresh(prompts, rewards), rtol=0, atol=0)
        assert {k: list(v) for k, v in restored.history.items()} == {k: list(v) for k, v in fresh.history.items()}
        # deque equality ignores maxlen: the bound itself must survive the restore
        assert all(v.maxlen == buffer_size and len(v) <= buffer_size for v in restored.history.values())
    seen = {p for prompts, _ in batches for p in prompts}
    assert all(len(restored.history[p]) == min(buffer_size, sum(q == p for b, _ in batches for q in b)) for p in seen)


# ---------------------------------------------------------------- the KL of tokens split into pixels
@pytest.mark.parametrize(
    "P,channel_reduction,shape",
    [
        (1, "sum", (1, 2, 3)),
        (2, "sum", (2, 3, 4)),
        (4, "sum", (1, 4, 5)),
        (2, "mean", (3, 2, 3)),
        (4, "mean", (1, 3, 2)),
        (8, "mean", (2, 1, 6)),
    ],
)
def test_k3_kl_scores_each_token_by_the_sum_of_its_pixels_logprobs(P, channel_reduction, shape):
    """k3_logp under grpo.pixels_per_token P: a token's log-prob is the sum of its P pixels' (each
    pixel holding C / P of its channels), so the KL term and its gradient equal those at P = 1 and
    the k3 of whole-token log-probs written out here (/ C under channel_reduction mean), token by
    token under uneven KL weights."""
    T, B, L = shape
    C = 8
    gen = torch.Generator().manual_seed(P * 100 + T * 10 + L)
    mean = torch.randn(T, B, L, C, generator=gen, dtype=F64)
    std = torch.rand(T, B, L, C, generator=gen, dtype=F64) + 0.3
    x_prev = mean + std * torch.randn(T, B, L, C, generator=gen, dtype=F64)
    ref_mean = mean + 0.4 * torch.randn(T, B, L, C, generator=gen, dtype=F64)
    ref_logp = torch.distributions.Normal(ref_mean, std).log_prob(x_prev).sum(-1)  # [T, B, L] per token
    kl_weights = torch.rand(B, L, generator=gen, dtype=F64) + 0.1
    kl_weights = kl_weights / kl_weights.sum()
    scale = 1.0 if channel_reduction == "sum" else 1.0 / C

    def kl_term(pixels: int) -> tuple[torch.Tensor, torch.Tensor]:
        m = mean.clone().requires_grad_(True)
        logp = position_logp(x_prev, m, std, pixels)
        weights = torch.full((B, L * pixels), 1.0 / (B * L * pixels), dtype=F64)
        out = chunk_loss(
            logp,
            logp.detach(),
            torch.zeros(B, dtype=F64),
            weights,
            mte_mask=None,
            clip_eps=0.2,
            clip_eps_high=None,
            kl_beta=1.0,
            kl_type="k3_logp",
            kl_weights=kl_weights,
            mean=m,
            std=std,
            ref_logp=ref_logp,
            channel_reduction=channel_reduction,
            pixels_per_token=pixels,
        )
        (grad,) = torch.autograd.grad(out.loss, m)  # zero advantages: the loss is the KL term
        return out.kl, grad

    token_logp = torch.distributions.Normal(mean, std).log_prob(x_prev).sum(-1)[0]  # trajectory 0, [B, L]
    d = (ref_logp[0] - token_logp) * scale
    expected = (kl_weights * (torch.expm1(d) - d)).sum()
    kl_p, grad_p = kl_term(P)
    kl_1, grad_1 = kl_term(1)
    torch.testing.assert_close(kl_p.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kl_p, kl_1, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(grad_p, grad_1, rtol=1e-5, atol=1e-8)
    assert grad_p[0].abs().sum() > 0 and not grad_p[1:].any()  # the KL is on trajectory 0 only


# ---------------------------------------------------------------- optimizer steps per pass
@pytest.mark.parametrize("over", ["images", "mask_steps"])
@pytest.mark.parametrize("micro", [1, 2, 5])
def test_optimizer_steps_per_pass_are_min_of_minibatches_and_units(over, micro):
    """grpo.minibatches m over U units (images, or recorded mask steps): min(m, U) optimizer steps,
    near-equal parts (sizes differ by at most one) that cover every unit once (images: contiguous
    runs in order; mask steps: every m-th, as the reference's per-step updates); each minibatch's
    micro-batches cover exactly that minibatch."""
    for units, m in itertools.product(range(1, 13), range(1, 15)):
        B, M = (units, 3) if over == "images" else (4, units)
        rollout = SimpleNamespace(batch_size=B, plan=SimpleNamespace(num_mask_steps=M))
        config = GRPOConfig(minibatches=m, minibatch_over=over, micro_batches=micro)
        batches = minibatches(rollout, config)
        assert len(batches) == min(m, units), (units, m)
        parts = []
        for minibatch in batches:
            images = sorted({i for micro_images, _ in minibatch for i in micro_images})
            steps = sorted({s for _, micro_steps in minibatch for s in (micro_steps or range(M))})
            parts.append(images if over == "images" else steps)
            if over == "images":
                assert sum(len(micro_images) for micro_images, _ in minibatch) == len(images)
            assert all(micro_steps is None or micro_steps == sorted(micro_steps) for _, micro_steps in minibatch)
        flat = [u for part in parts for u in part]
        assert (flat if over == "images" else sorted(flat)) == list(range(units))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


# ---------------------------------------------------------------- effective mask steps
@pytest.mark.parametrize("schedule", ["nova", "harmon"])
def test_effective_index_skips_the_steps_that_reveal_nothing(schedule):
    """Rollout.effective_index(j) is the position of recorded step j among the steps that reveal
    tokens, on every schedule, including NOVA's with empty steps (N >> S rounds the first away;
    N < S leaves several empty)."""
    empty_seen = False
    for tokens, steps in [(16, 8), (4, 9), (64, 16), (3, 3), (256, 64), (10, 30)]:
        counts = mask_schedule(tokens, steps, schedule)
        effective = effective_steps(counts)
        empty_seen |= len(effective) < steps
        for picked in (effective, effective[::2], effective[1:], effective[-1:]):
            stub = SimpleNamespace(reveal_counts=counts, plan=SimpleNamespace(mask_steps=tuple(picked)))
            assert [Rollout.effective_index(stub, j) for j in range(len(picked))] == [effective.index(s) for s in picked]
    assert empty_seen  # both have empty steps when N < S; NOVA's also when N >> S


@pytest.fixture(scope="module")
def nova_rollout():
    """A recorded rollout on NOVA's schedule for 16 tokens in 8 steps, which reveal (0, 1, 2, 2, 2, 3,
    3, 3) tokens: step 0 is empty, so effective index = step - 1."""
    model = tiny_float64_mar(5)
    config = RolloutConfig(
        num_mask_steps=8, schedule="nova", num_seeds=0, record_mask_steps=4, record_diffusion_steps=2, likelihood_positions="unknown"
    )
    plan = RecordPlan(mask_steps=(1, 2, 3, 6), diffusion_steps=((0, 3), (1, 4), (0, 2), (2, 4)))
    prompts = ["a red circle", "a blue square", "a green triangle"]
    return generate(model, prompts, config, [31, 32, 33], sampler=model.make_sampler(), plan=plan)


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 6, 7])
def test_consistency_applies_from_its_effective_start_step_on_a_schedule_with_empty_steps(nova_rollout, start):
    """grpo.consistency_start_step s counts effective steps: a recorded step whose effective index is
    below s keeps every position; from s on it keeps what selection from step 0 keeps. (The first
    effective step has no previous prediction and keeps nearly everything; the later ones drop
    positions, so a wrong count is seen.)"""
    rollout = nova_rollout
    assert rollout.reveal_counts[0] == 0 and all(n > 0 for n in rollout.reveal_counts[1:])
    # a threshold of 0.02 makes every step after the first drop positions (0.0 keeps all of step 6)
    always = GRPOConfig(consistency=True, consistency_start_step=0, consistency_threshold=0.02)
    from_start = GRPOConfig(consistency=True, consistency_start_step=start, consistency_threshold=0.02)
    keep_all, _ = token_selection(rollout, always)
    keep, _ = token_selection(rollout, from_start)
    for j, step in enumerate(rollout.plan.mask_steps):
        columns = rollout.l_slice(j)
        assert step == 1 or not keep_all[:, columns].all(), f"step {step} drops nothing: the test would not see it"
        if step - 1 < start:  # effective index = step - 1 (step 0 reveals nothing)
            assert keep[:, columns].all(), (start, step)
        else:
            assert torch.equal(keep[:, columns], keep_all[:, columns]), (start, step)

"""margrpo.grpo.selection (uncertainty, MTE top-k, consistency-aware selection, pixel split) and the
update's token_selection, against computations written here from the definitions in docs/METHOD.md
section 4: float64, plain Python loops or plain torch, on fresh random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo.grpo import GRPOConfig
from margrpo.grpo.policy_update import token_selection
from margrpo.grpo.selection import (
    consistency_keep,
    mte_mask,
    reference_mte_count,
    split_pixels,
    uncertainty,
)
from margrpo.rollout import RecordPlan, RolloutConfig, generate

F64 = torch.float64


def _pixel(values: torch.Tensor, n: int, p: int, P: int) -> torch.Tensor:
    """Channels of latent pixel p of token n (pixel-major: pixel p holds channels p*C/P .. (p+1)*C/P)."""
    width = values.shape[-1] // P
    return values[..., n, p * width : (p + 1) * width]


def _plain_uncertainty(seed_final: torch.Tensor, P: int) -> torch.Tensor:
    """[K, B, N, C] -> [B, N * P]: per position, sqrt(mean_k (x_k - mean_k x)^2), averaged over channels."""
    K, B, N, _ = seed_final.shape
    out = torch.empty(B, N * P, dtype=F64)
    for b in range(B):
        for n in range(N):
            for p in range(P):
                x = _pixel(seed_final[:, b], n, p, P)  # [K, C / P]
                centered = x - x.sum(0) / K
                out[b, n * P + p] = (centered.pow(2).sum(0) / K).sqrt().mean()
    return out


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    norm = float(a.norm() * b.norm())
    return 0.0 if norm == 0 else float((a * b).sum()) / norm


def _plain_consistency(prev, cur, final, committed, threshold: float, P: int) -> torch.Tensor:
    """bool [B, N, P]: the position's predicted clean latent moved toward the final one, or its token
    was committed at this step."""
    B, N, _ = cur.shape
    out = torch.empty(B, N, P, dtype=torch.bool)
    for b in range(B):
        for n in range(N):
            for p in range(P):
                gain = _cos(_pixel(cur[b], n, p, P), _pixel(final[b], n, p, P)) - _cos(_pixel(prev[b], n, p, P), _pixel(final[b], n, p, P))
                out[b, n, p] = gain > threshold or bool(committed[b, n])
    return out


def test_split_pixels_puts_each_pixel_s_channels_in_its_own_row(gen):
    values = torch.randn(2, 3, 5, 12, generator=gen, dtype=F64)
    for P in (1, 2, 3, 4):
        out = split_pixels(values, P)
        assert out.shape == (2, 3, 5 * P, 12 // P)
        for n in range(5):
            for p in range(P):
                assert torch.equal(out[..., n * P + p, :], _pixel(values, n, p, P))
    with pytest.raises(ValueError, match="pixels_per_token: got 5, expected a divisor of the 12 channels"):
        split_pixels(values, 5)


@pytest.mark.parametrize("P", [1, 2, 4])
def test_uncertainty_is_the_population_std_over_seeds_averaged_over_channels(gen, P):
    seed_final = torch.randn(3, 2, 6, 8, generator=gen, dtype=F64) * torch.rand(1, 2, 6, 1, generator=gen, dtype=F64)
    torch.testing.assert_close(uncertainty(seed_final, P), _plain_uncertainty(seed_final, P), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=r"seed_final: expected \[K, B, N, C\]"):
        uncertainty(seed_final[0])


@pytest.mark.parametrize("P,ratio", [(1, 0.3), (1, 0.75), (2, 0.3), (4, 0.5)])
def test_mte_mask_selects_the_most_uncertain_positions(gen, P, ratio):
    K, B, N, C = 3, 4, 10, 8
    # per-position spreads far apart: the ranking is unambiguous
    spread = torch.rand(1, B, N, C, generator=gen, dtype=F64) * 3 + 0.1
    seed_final = torch.randn(K, B, N, C, generator=gen, dtype=F64) * spread
    scores = _plain_uncertainty(seed_final, P)
    k = math.floor(ratio * N * P)
    selected = mte_mask(seed_final, ratio, P)
    assert selected.shape == (B, N, P) and selected.dtype == torch.bool
    for b in range(B):
        ranked = sorted(range(N * P), key=lambda i: -float(scores[b, i]))
        assert set(selected[b].flatten().nonzero().flatten().tolist()) == set(ranked[:k])
    # the selected positions are strictly more uncertain than every other one
    flat = selected.view(B, N * P)
    assert (scores.masked_fill(~flat, math.inf).min(1).values > scores.masked_fill(flat, -math.inf).max(1).values).all()


def test_mte_reference_count_and_random_positions(gen):
    assert reference_mte_count(0.0, 4096) == 1  # the reference's "random share 0" still takes one
    assert reference_mte_count(0.3, 10) == math.floor(0.3 * 10)
    assert reference_mte_count(1.0, 5) == 5
    assert reference_mte_count(2.0, 5) == 5
    seed_final = torch.randn(2, 3, 16, 4, generator=gen, dtype=F64)
    assert mte_mask(seed_final, 0.01, k_rule="floor").sum() == 0
    assert (mte_mask(seed_final, 0.01, k_rule="reference").view(3, 16).sum(1) == 1).all()
    top = mte_mask(seed_final, 0.25)
    for seed in range(5):
        drawn = mte_mask(seed_final, 0.25, random_positions=2, generator=torch.Generator().manual_seed(seed))
        assert (drawn | top).equal(drawn)  # a superset of the top-k ...
        extra = (drawn & ~top).view(3, 16).sum(1)
        assert (extra <= 2).all()  # ... plus at most the 2 drawn (a draw may land on a top-k position)
        again = mte_mask(seed_final, 0.25, random_positions=2, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(drawn, again)
    with pytest.raises(ValueError, match="k_rule: got 'ceil'"):
        mte_mask(seed_final, 0.25, k_rule="ceil")
    with pytest.raises(ValueError, match=r"random_positions: got 17, expected an int in \[0, 16\]"):
        mte_mask(seed_final, 0.25, random_positions=17)


@pytest.mark.parametrize("P,threshold", [(1, 0.0), (1, 0.05), (2, 0.0), (4, -0.02)])
def test_consistency_keep_is_the_cosine_gain_or_committed(gen, P, threshold):
    B, N, C = 3, 40, 8
    final = torch.randn(B, N, C, generator=gen, dtype=F64)
    prev = torch.randn(B, N, C, generator=gen, dtype=F64)
    cur = 0.5 * prev + 0.5 * torch.randn(B, N, C, generator=gen, dtype=F64) + 0.2 * final
    prev[0, :5] = 0.0  # the first effective step's "previous prediction" is zeros: cosine 0
    committed = torch.rand(B, N, generator=gen) < 0.3
    kept = consistency_keep(prev, cur, final, committed, threshold, P)
    expected = _plain_consistency(prev, cur, final, committed, threshold, P)
    assert kept.shape == (B, N, P)
    assert torch.equal(kept, expected)
    moved = _plain_consistency(prev, cur, final, torch.zeros_like(committed), threshold, P)
    # the inputs exercise every case: committed tokens that did not move (kept anyway), uncommitted
    # positions that moved (kept) and that did not (dropped)
    assert (committed[..., None] & ~moved).any() and (~committed[..., None] & moved).any()
    assert (~committed[..., None] & ~moved).any()
    with pytest.raises(ValueError, match=r"committed: expected shape \(3, 40\), got \(3, 39\)"):
        consistency_keep(prev, cur, final, committed[:, :39], threshold, P)


# ---------------------------------------------------------------- token_selection on a real rollout
@pytest.fixture(scope="module")
def rollout():
    model = tiny_float64_mar(5)
    config = RolloutConfig(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=2.5,
        num_seeds=3,
        record_mask_steps=3,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
    )
    # 16 tokens, 5 Harmon mask steps reveal (1, 3, 3, 5, 4) tokens
    plan = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))
    prompts = ["a red circle", "a blue square", "a red circle", "a green triangle"]
    return generate(model, prompts, config, [21, 22, 23, 24], sampler=model.make_sampler(), plan=plan)


def _plain_token_selection(rollout, config: GRPOConfig):
    """keep, mte [B, L, P] from the definitions: per recorded step, consistency from the third (or
    consistency_start_step-th) effective step on; MTE on the top floor(ratio * N * P) positions."""
    B, N, P = rollout.batch_size, rollout.num_tokens, config.pixels_per_token
    effective = [s for s, n in enumerate(rollout.reveal_counts) if n > 0]
    per_step = torch.ones(B, rollout.plan.num_mask_steps, N, P, dtype=torch.bool)
    for j, step in enumerate(rollout.plan.mask_steps):
        if config.consistency and effective.index(step) >= config.consistency_start_step:
            start = sum(rollout.reveal_counts[:step])
            committed = torch.zeros(B, N, dtype=torch.bool)
            for b in range(B):
                committed[b, rollout.order[b, start : start + rollout.reveal_counts[step]]] = True
            per_step[:, j] = _plain_consistency(
                rollout.pred_clean_prev[:, j], rollout.pred_clean[:, j], rollout.tokens, committed, config.consistency_threshold, P
            )
    scores = _plain_uncertainty(rollout.seed_tokens, P).view(B, N, P)
    k = math.floor(config.mte_ratio * N * P)
    top = torch.zeros(B, N * P, dtype=torch.bool)
    for b in range(B):
        top[b, sorted(range(N * P), key=lambda i: -float(scores.view(B, -1)[b, i]))[:k]] = True
    top = top.view(B, N, P)
    positions, steps = rollout.l_positions(), rollout.l_step()  # [B, L], [L]
    keep = torch.stack([per_step[b, steps, positions[b]] for b in range(B)])
    mte = torch.stack([top[b, positions[b]] for b in range(B)])
    return keep, mte


@pytest.mark.parametrize("start,P", [(0, 1), (2, 1), (3, 2), (1, 4)])
def test_token_selection_applies_consistency_from_its_start_step_and_mte_per_position(rollout, start, P):
    config = GRPOConfig(mte=True, mte_ratio=0.3, consistency=True, consistency_start_step=start, pixels_per_token=P)
    keep, mte = token_selection(rollout, config)
    expected_keep, expected_mte = _plain_token_selection(rollout, config)
    assert torch.equal(keep, expected_keep)
    assert torch.equal(mte, expected_mte)
    assert not keep.all(), "consistency dropped nothing: the test would not see it applied"
    off_keep, off_mte = token_selection(rollout, GRPOConfig(pixels_per_token=P))
    assert off_keep.all() and off_mte is None

"""Invariants of the rollout, each over several configurations (issue 30): the first update is
on-policy (ratio 1, KL 0 against an equal reference) at any temperature, known-mask mode and
variance, and classifier-free guidance pairs every image's canvas with its own cond and uncond rows
in the batch the backbone and the head see."""

from __future__ import annotations

import copy

import pytest
import torch

from margrpo.diffusion import DDPMSampler
from margrpo.grpo import GRPOConfig, update
from margrpo.heads import SimpleMLPAdaLN, reinit_zero_layers_
from margrpo.models.base import PromptBatch
from margrpo.models.tiny import TinyMAR, TinyMARConfig
from margrpo.rollout import RecordPlan, RolloutConfig, generate
from margrpo.rollout.guidance import forward_rows, head_condition, prompt_rows

F64 = torch.float64
PROMPTS = ["a red circle", "a blue square left of a green circle", "a red circle"]
# 16 tokens; 5 Harmon mask steps reveal (1, 3, 3, 5, 4)
PLAN = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))


def _tiny(learned_variance: bool):
    torch.manual_seed(3)
    model = TinyMAR(
        TinyMARConfig(image_size=16, patch_size=4, width=32, depth=1, num_heads=2, head_width=32, head_depth=1, diffusion_steps=6)
    )
    sampler = model.make_sampler()
    if learned_variance:  # Harmon-like: the std depends on z
        C = model.token_channels
        model.head = SimpleMLPAdaLN(C, 32, 2 * C, model.config.width, 1)
        sampler = DDPMSampler(
            6, beta_schedule="cosine", spacing="iddpm", prediction_type="epsilon", variance_type="learned_range", clip_sample=1.0
        )
    with torch.no_grad():
        reinit_zero_layers_(model.head, std=0.2)  # adaLN-zero would make the head ignore z
    return model.double().eval(), sampler


@pytest.fixture(scope="module")
def models():
    return {"fixed": _tiny(False), "learned": _tiny(True)}


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("known_mask,likelihood_std", [("pre_step", "policy"), ("post_step", "policy"), ("post_step", "recorded_main")])
@pytest.mark.parametrize("variance", ["fixed", "learned"])
def test_the_first_update_is_on_policy(models, temperature, known_mask, likelihood_std, variance):
    """Scored by the policy that drew it, a rollout's recorded log-probs are the update's: every
    ratio is 1 and the k3 KL to an equal reference is 0, whatever the sampling temperature (which
    scales every std the recording and the likelihood use)."""
    model, sampler = models[variance]
    config = RolloutConfig(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=2.5,
        cfg_channels="eps",
        num_seeds=2,
        record_mask_steps=3,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
        known_mask=known_mask,
        temperature=temperature,
    )
    rollout = generate(model, PROMPTS, config, [11, 12, 13], sampler=sampler, plan=PLAN)
    assert rollout.logp.shape[-1] > 0
    policy, reference = copy.deepcopy(model), copy.deepcopy(model)
    grpo = GRPOConfig(
        group_size=3, prompts_per_step=1, objective="clip", likelihood_std=likelihood_std, kl_type="k3_logp", kl_beta=0.1, clip_eps=1e-3
    )  # a tight clip: any ratio off 1 shows
    advantages = torch.tensor([1.0, -0.5, -0.5], dtype=F64)
    result = update(policy, reference, rollout, advantages, grpo, torch.optim.SGD(policy.parameters(), lr=0.0))
    assert result.skipped is None and result.metrics["grad_norm"] > 0
    # float64 rounding of the log-probs: with the post-step known mask a learned std can be ~1e-6 for
    # a transition drawn under the pre-step canvas, so |logp| reaches ~1e9 and one ulp of it ~1e-7
    rounding = max(1e-9, 64 * torch.finfo(F64).eps * float(rollout.logp.abs().max()))
    assert result.metrics["ratio_max"] == pytest.approx(1.0, abs=rounding)
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=rounding)
    assert result.metrics["clip_fraction"] == 0.0
    assert result.metrics["kl"] == pytest.approx(0.0, abs=max(1e-12, rounding**2))


# ---------------------------------------------------------------- guidance rows
class RowBackbone:
    """A backbone stub: prompt i of VOCAB encodes as the one-row embedding [[i]], and forward_z
    returns, per row, z[r, n] = (prompt id, canvas value, known flag, n): which prompt and which
    image's canvas each row paired."""

    VOCAB = ["neg", "p0", "p1", "p2", "p3", "p4"]

    def encode_prompts(self, prompts):
        ids = torch.tensor([[float(self.VOCAB.index(p))] for p in prompts], dtype=F64)
        return PromptBatch(ids[:, :, None], torch.ones(len(prompts), 1, dtype=torch.bool))

    def negative_prompt(self):
        return "neg"

    def forward_z(self, batch, canvas, known, known_count=None):
        rows, N = canvas.shape[:2]
        assert len(batch) == rows == known.shape[0]
        prompt = batch.embeds[:, 0, 0][:, None].expand(rows, N)
        position = torch.arange(N, dtype=F64).expand(rows, N)
        return torch.stack([prompt, canvas[..., 0], known.to(F64), position], -1)


@pytest.mark.parametrize("B,N,P", [(1, 3, 1), (2, 4, 2), (3, 5, 3), (5, 2, 2)])
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_guidance_pairs_each_canvas_with_its_own_cond_and_uncond_rows(B, N, P, cfg_scale):
    """With guidance the backbone's rows are [cond; uncond]: row b and row B + b are image b's prompt
    and the negative prompt on image b's canvas and known mask; the head's condition rows are
    [cond; uncond] over (image, position) in that order. Without guidance: B rows, cond only."""
    gen = torch.Generator().manual_seed(B * 10 + N)
    backbone = RowBackbone()
    prompts = [f"p{i % 5}" for i in range(B)]
    config = RolloutConfig(cfg_scale=cfg_scale, record_mask_steps=0)
    rows = prompt_rows(backbone, prompts, config)
    guided = cfg_scale != 1.0
    assert rows.rows_per_image == (2 if guided else 1)
    canvas = torch.randn(B, N, 2, generator=gen, dtype=F64)
    known = torch.rand(B, N, generator=gen) < 0.5
    z = forward_rows(backbone, rows, canvas, known, int(known.sum()))
    positions = torch.stack([torch.randperm(N, generator=gen)[:P] for _ in range(B)])
    cond = head_condition(z, rows, positions)
    assert z.shape[0] == rows.rows_per_image * B and cond.shape == (rows.rows_per_image * B * P, 4)
    for half in range(rows.rows_per_image):
        expected_prompt = [RowBackbone.VOCAB.index(p) for p in prompts] if half == 0 else [0] * B
        for b in range(B):
            r = half * B + b
            assert z[r, :, 0].eq(expected_prompt[b]).all(), (half, b)
            torch.testing.assert_close(z[r, :, 1], canvas[b, :, 0], rtol=0, atol=0)
            assert torch.equal(z[r, :, 2].bool(), known[b])
            for p in range(P):
                row = cond[half * B * P + b * P + p]
                assert row[0] == expected_prompt[b] and row[3] == positions[b, p]
                assert row[1] == canvas[b, positions[b, p], 0]

"""margrpo.rollout: schedules, seeding, recording plan, the generation loop and the training likelihood.

The generation tests drive a tiny test backbone (an MLP over prompt words + canvas, defined here) with
the real diffusion head and sampler; shapes are kept small so the file runs in seconds on 2 cores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from margrpo.models.base import MARBackbone, PromptBatch
from margrpo.rollout import schedule
from margrpo.rollout.config import RolloutConfig
from margrpo.rollout.plan import RecordPlan, choose_plan
from margrpo.rollout.seeding import group_seeds, make_generators, plan_seed, sample_seed


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: one intra-op thread avoids thread-sync overhead, which dominates on a
    shared 2-core machine (measured ~10x on this file)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- schedules
def _nova_by_hand(N: int, S: int) -> list[int]:
    masked = [int(np.round(N * math.cos(math.pi / 2 * k / S))) for k in range(S + 1)]
    return [masked[k] - masked[k + 1] for k in range(S)]


@pytest.mark.parametrize("N,S", [(1024, 64), (256, 16), (64, 16), (7, 5), (4, 8), (1, 3), (1000, 1)])
def test_nova_schedule_matches_formula_and_sums_to_n(N, S):
    counts = schedule.nova_schedule(N, S)
    assert counts == _nova_by_hand(N, S)
    assert len(counts) == S and sum(counts) == N and min(counts) >= 0


def test_nova_first_step_is_empty_at_real_sizes():
    counts = schedule.nova_schedule(1024, 64)
    assert counts[0] == 0 and len(schedule.effective_steps(counts)) == 63


@pytest.mark.parametrize("N,S", [(1024, 64), (256, 16), (64, 16), (16, 16), (7, 5), (4, 8), (1, 3)])
def test_harmon_schedule_matches_formula(N, S):
    counts = schedule.harmon_schedule(N, S)
    assert len(counts) == S and sum(counts) == N
    masked = N
    for step, count in enumerate(counts):
        if step < S - 1:
            target = max(1, min(masked - 1, math.floor(N * math.cos(math.pi / 2 * (step + 1) / S))))
        else:
            target = 0
        assert count == masked - target
        masked = target
    if N >= S:  # every step reveals at least one token
        assert min(counts) >= 1


def test_harmon_schedule_known_values():
    # N=16, S=4: floor(16 cos(pi/8)) = 14, floor(16 cos(pi/4)) = 11, floor(16 cos(3pi/8)) = 6
    assert schedule.harmon_schedule(16, 4) == [2, 3, 5, 6]
    assert schedule.nova_schedule(16, 4) == [1, 4, 5, 6]  # round(16 cos) = 16, 15, 11, 6, 0


def test_schedule_errors_name_the_argument():
    with pytest.raises(ValueError, match="schedule"):
        schedule.mask_schedule(16, 4, "cosine-ish")
    with pytest.raises(ValueError, match="num_tokens"):
        schedule.mask_schedule(0, 4)
    with pytest.raises(ValueError, match="num_mask_steps"):
        schedule.mask_schedule(16, 0, "harmon")


# ---------------------------------------------------------------- seeding
def test_sample_seeds_are_distinct_and_deterministic():
    seeds = {sample_seed(7, r, p, s) for r in range(3) for p in range(5) for s in range(4)}
    assert len(seeds) == 60
    assert sample_seed(7, 1, 2, 3) == sample_seed(7, 1, 2, 3)
    assert all(0 <= s < 2**63 for s in seeds)
    assert group_seeds(7, 1, [2, 5], 3) == [sample_seed(7, 1, p, s) for p in (2, 5) for s in range(3)]
    with pytest.raises(ValueError, match="rank"):
        sample_seed(7, -1, 0, 0)
    with pytest.raises(ValueError, match="group_size"):
        group_seeds(7, 0, [0], 0)


def test_generators_reproduce_their_stream():
    a, b = make_generators([11, 12], "cpu")
    (a2,) = make_generators([11], "cpu")
    x = torch.randn(5, generator=a)
    assert torch.equal(x, torch.randn(5, generator=a2))
    assert not torch.equal(x, torch.randn(5, generator=b))
    assert plan_seed([1, 2]) == plan_seed([1, 2]) != plan_seed([2, 1])


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field,value",
    [
        ("cfg_scale", -0.5),
        ("temperature", 0.0),
        ("num_seeds", -1),
        ("num_mask_steps", 0),
        ("schedule", "linear"),
        ("cfg_schedule", "cosine"),
        ("cfg_channels", "var"),
        ("record_mask_steps", -1),
        ("record_diffusion_steps", 0),
        ("likelihood_positions", "all"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RolloutConfig(**{field: value})


def test_cfg_schedules():
    constant = RolloutConfig(cfg_scale=5.0)
    linear = RolloutConfig(cfg_scale=5.0, cfg_schedule="linear")
    assert constant.cfg_scale_at(3, 16) == 5.0
    assert linear.cfg_scale_at(4, 16) == pytest.approx(2.0) and linear.cfg_scale_at(16, 16) == 5.0
    assert not RolloutConfig().uses_cfg and constant.uses_cfg and RolloutConfig(cfg_scale=0.0).uses_cfg


# ---------------------------------------------------------------- a tiny test backbone
WORDS = ("a", "red", "blue", "green", "square", "circle", "left", "of", "generate", "an", "image.")


class TinyTestBackbone(nn.Module):
    """A minimal MARBackbone: word embeddings, a per-token MLP over [token or mask embedding + position]
    with one global mixing term (so z depends on the other tokens and on the prompt), and the real
    SimpleMLPAdaLN head with its zero-init layers re-initialised so it is not an identity."""

    def __init__(self, num_tokens: int = 12, channels: int = 4, width: int = 24, z_channels: int = 16, learn_sigma: bool = True):
        super().__init__()
        from margrpo.heads import SimpleMLPAdaLN, reinit_zero_layers_

        self.num_tokens, self.token_channels = num_tokens, channels
        self.vocab = {w: i + 1 for i, w in enumerate(WORDS)}  # 0 pads
        self.word_embed = nn.Embedding(len(WORDS) + 1, width)
        self.token_in = nn.Linear(channels, width)
        self.mask_embed = nn.Parameter(torch.randn(width) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(num_tokens, width) * 0.5)
        self.mix = nn.Linear(width, width)
        self.out = nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, z_channels))
        # learned variance (Harmon-like): 2C outputs; otherwise C (flow matching, fixed variance)
        self.head = SimpleMLPAdaLN(channels, 32, 2 * channels if learn_sigma else channels, z_channels, 2)
        with torch.no_grad():
            reinit_zero_layers_(self.head, std=0.2)
        self.head.requires_grad_(False)

    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        unknown = sorted({w for p in prompts for w in p.split() if w not in self.vocab})
        if unknown:
            raise ValueError(f"prompts: unknown words {unknown}")
        length = max(1, max(len(p.split()) for p in prompts))
        ids = torch.zeros(len(prompts), length, dtype=torch.long, device=self.pos_embed.device)
        for row, p in enumerate(prompts):
            for col, w in enumerate(p.split()):
                ids[row, col] = self.vocab[w]
        return PromptBatch(self.word_embed(ids), ids > 0)

    def negative_prompt(self) -> str:
        return "generate an image."

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        mask = prompts.mask[..., None].to(prompts.embeds.dtype)
        text = (prompts.embeds * mask).sum(1) / mask.sum(1).clamp(min=1)
        h = torch.where(known[..., None], self.token_in(canvas), self.mask_embed) + self.pos_embed
        context = self.mix(h.mean(1, keepdim=True)) + text[:, None]
        return self.out(torch.cat([h, context.expand_as(h)], -1))

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        B, N, _ = tokens.shape
        return torch.sigmoid(tokens[..., :3]).transpose(1, 2).reshape(B, 3, 3, N // 3)

    def make_sampler(self, num_steps: int | None = None):
        from margrpo.diffusion import DDPMSampler

        # IDDPM cosine schedule, learned-range variance (2C head outputs, Harmon-like); x0 prediction
        # keeps the chains of a random-init head bounded. The last step (t = 0) is deterministic.
        return DDPMSampler(num_steps or 6, beta_schedule="cosine", spacing="iddpm", prediction_type="sample", variance_type="learned_range")

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("head.")]


PROMPTS = ["a red square", "a red square", "a blue circle left of a green square"]


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return TinyTestBackbone()


@pytest.fixture(scope="module")
def backbone64(backbone):
    import copy

    return copy.deepcopy(backbone).double()


@pytest.fixture(scope="module")
def sampler(backbone):
    return backbone.make_sampler()


def _config(**overrides) -> RolloutConfig:
    base = dict(num_mask_steps=6, schedule="nova", num_seeds=2, record_mask_steps=3, record_diffusion_steps=3)
    return RolloutConfig(**{**base, **overrides})


def _run(backbone, sampler, config, seeds=(5, 6, 7), prompts=PROMPTS, plan=None):
    from margrpo.rollout import generate

    return generate(backbone, list(prompts), config, list(seeds), sampler=sampler, plan=plan)


def test_backbone_satisfies_protocol(backbone):
    assert isinstance(backbone, MARBackbone)


def reference_rollout(backbone, prompts, config, seeds, sampler):
    """The rollout written the plain way, one image at a time: the official head forward at every
    diffusion step (modulation recomputed), guidance mixed by hand, every transition kept.

    Uses the documented randomness layout of generate(): per image, its generator draws the order
    (randperm N) and then the noise bank [N, T_diff + 1, K + 1, C]. Float64 (a float64 backbone)."""
    from margrpo.rollout import mask_schedule

    N, C, K, T_diff = backbone.num_tokens, backbone.token_channels, config.num_seeds, sampler.num_steps
    counts = mask_schedule(N, config.num_mask_steps, config.schedule)
    head = backbone.head
    results = []
    for prompt, seed in zip(prompts, seeds, strict=True):
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(N, generator=generator)
        bank = torch.randn(N, T_diff + 1, K + 1, C, generator=generator, dtype=torch.float64)
        cond = backbone.encode_prompts([prompt])
        uncond = backbone.encode_prompts([backbone.negative_prompt()])
        canvas, known = torch.zeros(1, N, C, dtype=torch.float64), torch.zeros(1, N, dtype=torch.bool)
        seed_tokens = torch.zeros(K, N, C, dtype=torch.float64)
        transitions = {}  # (mask step, diffusion step) -> (x_t, x_prev, mean, std, logp), each [K+1, n, ...]
        start = 0
        for step, n in enumerate(counts):
            if n == 0:
                continue
            pos = order[start : start + n]
            z_c = backbone.forward_z(cond, canvas, known)[0, pos]
            z_u = backbone.forward_z(uncond, canvas, known)[0, pos]
            scale = config.cfg_scale_at(start + n, N)
            x = bank[pos, 0].transpose(0, 1)  # the K + 1 trajectories [K+1, n, C], z broadcast over them
            for i in range(T_diff):
                t = sampler.model_time(i)
                out = head(x, t, z_c)
                if config.uses_cfg:
                    out_u = head(x, t, z_u)
                    guided = out_u + scale * (out - out_u)
                    if config.cfg_channels == "eps":
                        guided = torch.cat([guided[..., :C], out[..., C:]], -1)
                    out = guided
                s = sampler.step(out, x, i, bank[pos, i + 1].transpose(0, 1), config.temperature)
                transitions[(step, i)] = (x, s.x_prev, s.mean, s.std.expand_as(x), s.logp)
                x = s.x_prev
            canvas[0, pos], known[0, pos] = x[0], True
            seed_tokens[:, pos] = x[1:]
            start += n
        results.append(dict(order=order, tokens=canvas[0], seed_tokens=seed_tokens, transitions=transitions))
    return results


def _recorded(rollout, b, j):
    """The transitions of image b at recorded step j as five tensors [R, T, P, ...]."""
    R, P = rollout.plan.num_diffusion_steps, rollout.slots[j].count
    part = rollout.l_slice(j)
    fields = (rollout.x_t, rollout.x_prev, rollout.mean, rollout.std, rollout.logp)
    return [f[:, b, part].reshape(rollout.num_trajectories, R, P, *f.shape[3:]).transpose(0, 1) for f in fields]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(cfg_scale=3.0, cfg_channels="eps", cfg_schedule="linear", schedule="harmon", temperature=0.9),
        dict(cfg_scale=2.0, cfg_channels="all", num_seeds=0),
    ],
)
def test_rollout_matches_plain_reference_at_the_planned_steps(backbone64, sampler, overrides):
    backbone = backbone64
    config = _config(**overrides)
    rollout = _run(backbone, sampler, config)
    with torch.no_grad():
        reference = reference_rollout(backbone, PROMPTS, config, [5, 6, 7], sampler)
    B, N, C, K = 3, backbone.num_tokens, backbone.token_channels, config.num_seeds
    R, M = config.record_diffusion_steps, config.record_mask_steps
    assert rollout.tokens.shape == (B, N, C) and rollout.seed_tokens.shape == (K, B, N, C)
    assert rollout.images.shape == (B, 3, 3, N // 3)
    L = R * sum(rollout.slots[j].revealed for j in range(M))
    assert rollout.x_t.shape == (K + 1, B, L, C) and rollout.logp.shape == (K + 1, B, L)
    assert rollout.pred_clean is None and rollout.pred_clean_prev is None
    effective = [s for s, n in enumerate(rollout.reveal_counts) if n > 0]
    for j, step in enumerate(rollout.plan.mask_steps):
        assert step in effective
        assert all(not sampler.is_deterministic(i) for i in rollout.plan.diffusion_steps[j])
    assert not rollout.logp.requires_grad and not rollout.tokens.requires_grad
    assert torch.equal(rollout.order.sort(1).values, torch.arange(N).expand(B, N))  # permutations
    for b, ref in enumerate(reference):
        assert torch.equal(rollout.order[b], ref["order"])
        torch.testing.assert_close(rollout.tokens[b], ref["tokens"], atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(rollout.seed_tokens[:, b], ref["seed_tokens"], atol=1e-10, rtol=1e-10)
        for j, step in enumerate(rollout.plan.mask_steps):
            got = _recorded(rollout, b, j)
            for r, i in enumerate(rollout.plan.diffusion_steps[j]):
                for value, expected in zip(got, ref["transitions"][(step, i)], strict=True):
                    torch.testing.assert_close(value[r], expected, atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------- training likelihood
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(cfg_scale=3.0, cfg_channels="eps", cfg_schedule="linear", schedule="harmon"),
        dict(cfg_scale=2.5, likelihood_positions="unknown", temperature=0.8),
    ],
)
def test_on_policy_recomputation_equals_recorded_logprobs(backbone, backbone64, sampler, overrides, dtype):
    """The key property: recomputed under the rollout's own policy, every recorded transition has the
    recorded log-prob (ratio 1). Exact in float64; in float32 the head's batched GEMMs sum in a
    different order than in the rollout, and a low-noise step amplifies that by |x_prev - mean| / std^2."""
    from margrpo.rollout import rollout_logprob

    model = backbone64 if dtype == torch.float64 else backbone
    rollout = _run(model, sampler, _config(**overrides))
    assert rollout.logp.dtype == dtype
    likelihood = rollout_logprob(model, rollout)
    T, B, L = rollout.num_trajectories, rollout.batch_size, rollout.logp.shape[-1]
    assert likelihood.logp.shape == (T, B, L) and likelihood.mean.shape == (T, B, L, model.token_channels)
    assert torch.isfinite(rollout.logp).all() and rollout.logp.abs().sum() > 0
    tol = dict(atol=1e-9, rtol=1e-9) if dtype == torch.float64 else dict(atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(likelihood.logp, rollout.logp, **tol)
    tol = dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(likelihood.mean, rollout.mean, **tol)
    assert torch.equal(likelihood.mask, rollout.l_committed().expand(B, -1))


def test_likelihood_gradient_reaches_backbone_not_head(backbone, sampler):
    from margrpo.rollout import rollout_logprob

    rollout = _run(backbone, sampler, _config(cfg_scale=2.0))
    backbone.zero_grad(set_to_none=True)
    rollout_logprob(backbone, rollout).logp.sum().backward()
    grads = {name: p.grad for name, p in backbone.named_parameters()}
    assert all(g is None for name, g in grads.items() if name.startswith("head."))
    for name in ("word_embed.weight", "token_in.weight", "mask_embed", "pos_embed", "mix.weight", "out.2.weight"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name
    backbone.zero_grad(set_to_none=True)


def test_likelihood_steps_subset_and_cfg_option(backbone, sampler):
    from margrpo.rollout import rollout_logprob

    rollout = _run(backbone, sampler, _config(cfg_scale=3.0))
    with torch.no_grad():
        full = rollout_logprob(backbone, rollout)
        one = rollout_logprob(backbone, rollout, steps=[1])
        unguided = rollout_logprob(backbone, rollout, cfg="none")
        empty = rollout_logprob(backbone, rollout, steps=[])
    torch.testing.assert_close(one.logp, full.logp[:, :, rollout.l_slice(1)])
    assert unguided.logp.shape == full.logp.shape and torch.isfinite(unguided.logp).all()
    assert (unguided.logp - full.logp).abs().max() > 1e-3  # the conditional branch alone is another policy
    assert empty.logp.shape == (rollout.num_trajectories, 3, 0)


def test_select_and_to(backbone64, sampler):
    from margrpo.rollout import rollout_logprob

    rollout = _run(backbone64, sampler, _config(cfg_scale=2.0, likelihood_positions="unknown"))
    part = rollout.select([2, 0])
    assert part.prompts == [PROMPTS[2], PROMPTS[0]]
    for name in ("seeds", "order", "tokens", "images", "pred_clean", "pred_clean_prev"):
        assert torch.equal(getattr(part, name), getattr(rollout, name)[[2, 0]]), name
    for name in ("seed_tokens", "x_t", "x_prev", "mean", "std", "logp"):  # trajectory first: images on axis 1
        assert torch.equal(getattr(part, name), getattr(rollout, name)[:, [2, 0]]), name
    assert torch.equal(rollout.select(torch.tensor([False, True, True])).tokens, rollout.tokens[1:])
    assert torch.equal(rollout.select(slice(0, 2)).order, rollout.order[:2])
    with torch.no_grad():
        recomputed = rollout_logprob(backbone64, part).logp
    torch.testing.assert_close(recomputed, rollout.logp[:, [2, 0]], atol=1e-9, rtol=1e-9)
    moved = rollout.to("meta")
    assert all(getattr(moved, n).device.type == "meta" for n in moved._tensor_fields())
    assert rollout.tokens.device.type == "cpu"
    with pytest.raises(IndexError, match="index"):
        rollout.select([3])


# ---------------------------------------------------------------- layout helpers and memory
def test_l_layout_helpers(backbone, sampler):
    rollout = _run(backbone, sampler, _config(likelihood_positions="unknown", record_mask_steps=4))
    B, N, M = 3, backbone.num_tokens, 4
    positions = rollout.l_positions()
    assert positions.shape == rollout.logp.shape[1:]
    ids = torch.arange(N).expand(B, N)
    assert torch.equal(rollout.expand_to_l(ids), positions)
    per_step = torch.arange(M)[None, :, None].expand(B, M, N)
    assert torch.equal(rollout.expand_to_l(per_step), rollout.l_step().expand(B, -1))
    committed = rollout.l_committed()
    R = rollout.plan.num_diffusion_steps
    assert int(committed.sum()) == R * sum(rollout.slots[j].revealed for j in range(M))
    for j in range(M):
        canvas, known = rollout.canvas_known(j)
        assert int(known.sum(1)[0]) == rollout.slots[j].start
        assert torch.equal(canvas[known], rollout.tokens[known]) and not canvas[~known].any()
        # unknown mode: the likelihood positions are exactly those unknown before the step
        assert not known.gather(1, rollout.positions(j)).any()
        assert rollout.positions(j).shape[1] == N - rollout.slots[j].start
    with pytest.raises(ValueError, match="values"):
        rollout.expand_to_l(torch.zeros(B, N + 1))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(likelihood_positions="unknown", num_seeds=3, cfg_scale=2.0),
        dict(record_mask_steps=0),
        dict(likelihood_positions="unknown", known_mask="post_step"),
    ],
)
def test_memory_formula_matches_bytes(backbone, backbone64, sampler, overrides):
    from margrpo.rollout import Rollout

    rollout = _run(backbone, sampler, _config(**overrides))
    B, N, C = rollout.tokens.shape
    K, (H, W) = rollout.seed_tokens.shape[0], rollout.images.shape[2:]
    L, M = rollout.logp.shape[-1], rollout.plan.num_mask_steps
    unknown = rollout.config.likelihood_positions == "unknown"
    post_step = rollout.config.known_mask == "post_step"
    assert rollout.nbytes() == Rollout.footprint(B, N, C, K, H, W, L, M, unknown, post_step=post_step) > 0
    rollout64 = _run(backbone64, sampler, _config(**overrides))
    assert rollout64.nbytes() == Rollout.footprint(B, N, C, K, H, W, L, M, unknown, float_bytes=8, post_step=post_step)


# ---------------------------------------------------------------- seeding of the rollout
def test_same_seeds_reproduce_the_rollout_exactly(backbone, sampler):
    config = _config(cfg_scale=2.0)
    first, second = _run(backbone, sampler, config), _run(backbone, sampler, config)
    assert first.plan == second.plan
    for name in ("order", "tokens", "seed_tokens", "images", "x_t", "x_prev", "logp"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name


def test_samples_do_not_depend_on_the_rest_of_the_batch(backbone64, sampler):
    config = _config(cfg_scale=2.0)
    full = _run(backbone64, sampler, config)
    alone = _run(backbone64, sampler, config, seeds=[7], prompts=PROMPTS[2:])
    assert torch.equal(alone.order[0], full.order[2])
    torch.testing.assert_close(alone.tokens[0], full.tokens[2], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(alone.seed_tokens[:, 0], full.seed_tokens[:, 2], atol=1e-12, rtol=1e-12)


def test_different_samples_get_different_noise(backbone, sampler):
    # images 0 and 1 share the prompt; only their seeds differ
    rollout = _run(backbone, sampler, _config(), seeds=group_seeds(3, 0, [0], 2) + [9])
    assert not torch.equal(rollout.order[0], rollout.order[1])
    assert (rollout.tokens[0] - rollout.tokens[1]).abs().min() > 0
    # and the K seed trajectories of a token differ from its main trajectory and from each other
    trajectories = torch.cat([rollout.tokens[:, None], rollout.seed_tokens.transpose(0, 1)], 1)  # [B, K+1, N, C]
    for a in range(3):
        for b in range(a + 1, 3):
            assert (trajectories[:, a] - trajectories[:, b]).abs().amin(-1).min() > 0
    # a different seed for the same (prompt, position) changes the recorded initial noise as well
    plan = RecordPlan(mask_steps=(2,), diffusion_steps=((0, 1, 2),))
    one = _run(backbone, sampler, _config(record_mask_steps=1), seeds=[1, 2, 3], plan=plan)
    two = _run(backbone, sampler, _config(record_mask_steps=1), seeds=[1, 2, 4], plan=plan)
    assert torch.equal(one.x_t[:, :2], two.x_t[:, :2]) and not torch.allclose(one.x_t[:, 2], two.x_t[:, 2])


# ---------------------------------------------------------------- "unknown" mode: predicted clean latents
def test_unknown_mode_predictions(backbone, sampler):
    from margrpo.rollout import effective_steps, mask_schedule

    config = _config(likelihood_positions="unknown", cfg_scale=2.0)
    effective = effective_steps(mask_schedule(backbone.num_tokens, config.num_mask_steps, config.schedule))
    # record every effective step, and diffusion step 0 whose x_t is the initial noise x_T
    plan = RecordPlan(tuple(effective), tuple((0, 2, 4) for _ in effective))
    rollout = _run(backbone, sampler, config, plan=plan)
    M = len(effective)
    assert rollout.pred_clean.shape == (3, M, backbone.num_tokens, backbone.token_channels)
    assert not rollout.pred_clean_prev[:, 0].any()  # nothing before the first effective step
    torch.testing.assert_close(rollout.pred_clean_prev[:, 1:], rollout.pred_clean[:, :-1], atol=0, rtol=0)
    torch.testing.assert_close(rollout.pred_clean[:, -1], rollout.tokens, atol=0, rtol=0)  # last step commits all
    for j in range(M):
        _, known = rollout.canvas_known(j)
        committed = rollout.positions(j)[:, : rollout.slots[j].revealed]
        after = known.scatter(1, committed, True)
        assert torch.equal(rollout.pred_clean[:, j][after], rollout.tokens[after])
        # the predictions for positions that stay masked are samples of the head, not the final tokens
        if (~after).any():
            assert not torch.allclose(rollout.pred_clean[:, j][~after], rollout.tokens[~after])
        # common random numbers: a position's initial noise x_T is the same at every mask step
        x_T = rollout.x_t[:, :, rollout.l_slice(j)][:, :, : rollout.slots[j].count]  # r = 0 block
        if j + 1 < M:
            later = rollout.x_t[:, :, rollout.l_slice(j + 1)][:, :, : rollout.slots[j + 1].count]
            skip = rollout.slots[j].revealed
            assert torch.equal(x_T[:, :, skip:], later)


def test_without_consistency_predictions_the_steps_before_recorded_ones_denoise_only_their_tokens(backbone, sampler, monkeypatch):
    """consistency_predictions=False: the same rollout (tokens, seeds' tokens, recorded transitions)
    without the predictions, and without the extra denoise of every unknown position at the
    steps before recorded ones (fewer head rows)."""
    import importlib

    from margrpo.grpo import GRPOConfig
    from margrpo.grpo.policy_update import token_selection

    config = _config(likelihood_positions="unknown", cfg_scale=2.0)
    plan = RecordPlan(mask_steps=(3, 5), diffusion_steps=((0, 2, 4), (1, 2, 3)))  # steps 2 and 4 precede them
    generate_module = importlib.import_module("margrpo.rollout.generate")  # the module, not the function
    rows: list[int] = []
    denoise = generate_module.multi_seed_denoise

    def counting(head, condition, *args, num_seeds, **kwargs):
        rows.append(condition.shape[0] * (num_seeds + 1))
        return denoise(head, condition, *args, num_seeds=num_seeds, **kwargs)

    monkeypatch.setattr(generate_module, "multi_seed_denoise", counting)
    runs = {}
    for keep in (True, False):
        rows.clear()
        runs[keep] = generate_module.generate(
            backbone, list(PROMPTS), config, [5, 6, 7], sampler=sampler, plan=plan, consistency_predictions=keep
        )
        runs[keep].head_rows = sum(rows)
    full, lean = runs[True], runs[False]
    assert lean.pred_clean is None and lean.pred_clean_prev is None and full.pred_clean_prev is not None
    for name in ("tokens", "seed_tokens", "x_t", "x_prev", "mean", "std", "logp"):
        torch.testing.assert_close(getattr(lean, name), getattr(full, name), rtol=1e-12, atol=1e-12, msg=name)
    assert lean.head_rows < full.head_rows
    with pytest.raises(ValueError, match="no clean predictions"):
        token_selection(lean, GRPOConfig(consistency=True))


def test_the_step_before_a_recorded_one_runs_seed_chains_only_on_its_committed_tokens(backbone64, sampler, monkeypatch):
    """With the consistency predictions, the step before a recorded one samples every unknown position
    for the previous prediction; its seed chains run only on the step's committed tokens (the seed
    tokens), the main chain alone elsewhere. The prediction equals the main chain written by hand
    (float64), and no call runs seed chains over more than the committed tokens at such a step."""
    import importlib

    config = _config(likelihood_positions="unknown", num_seeds=2)
    plan = RecordPlan(mask_steps=(3, 5), diffusion_steps=((0, 2, 4), (1, 2, 3)))
    generate_module = importlib.import_module("margrpo.rollout.generate")
    calls: list[tuple[int, int, bool]] = []  # (seed chains, head rows, records)
    denoise = generate_module.multi_seed_denoise

    def counting(head, condition, *args, num_seeds, record_steps=(), **kwargs):
        calls.append((num_seeds, condition.shape[0], bool(record_steps)))
        return denoise(head, condition, *args, num_seeds=num_seeds, record_steps=record_steps, **kwargs)

    monkeypatch.setattr(generate_module, "multi_seed_denoise", counting)
    seeds = [5, 6, 7]
    rollout = generate_module.generate(backbone64, list(PROMPTS), config, seeds, sampler=sampler, plan=plan)
    B, N, C, K, T = len(seeds), backbone64.num_tokens, backbone64.token_channels, config.num_seeds, sampler.num_steps
    counts = rollout.reveal_counts
    effective = [s for s, n in enumerate(counts) if n > 0]
    previous = [effective[effective.index(step) - 1] for step in plan.mask_steps]
    # the main chain alone at the other unknown positions: one call per such step, P - n tokens per image
    lone = [rows for seeds_run, rows, _ in calls if seeds_run == 0]
    assert lone == [B * (N - sum(counts[: step + 1])) for step in previous]
    # seed chains beyond the committed tokens only at the recorded steps themselves
    assert all(rows <= B * max(counts) for seeds_run, rows, records in calls if seeds_run == K and not records)
    with torch.no_grad():
        for b, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
            generator = torch.Generator().manual_seed(seed)
            order = torch.randperm(N, generator=generator)
            bank = torch.randn(N, T + 1, K + 1, C, generator=generator, dtype=torch.float64)
            assert torch.equal(order, rollout.order[b])
            cond = backbone64.encode_prompts([prompt])
            for j, step in enumerate(previous):
                start = sum(counts[:step])
                known = torch.zeros(1, N, dtype=torch.bool)
                known[0, order[:start]] = True
                canvas = torch.where(known[..., None], rollout.tokens[b : b + 1], torch.zeros(()).double())
                positions = order[start:]
                z = backbone64.forward_z(cond, canvas, known)[0, positions]
                x = bank[positions, 0, 0]  # trajectory 0's x_T
                for i in range(T):
                    out = backbone64.head(x, sampler.model_time(i), z)
                    x = sampler.step(out, x, i, bank[positions, i + 1, 0]).x_prev
                expected = canvas[0].clone()
                expected[positions] = x
                torch.testing.assert_close(rollout.pred_clean_prev[b, j], expected, atol=1e-10, rtol=1e-10)
                # its committed tokens are the final ones, their seed chains the seed tokens
                committed = order[start : start + counts[step]]
                torch.testing.assert_close(rollout.tokens[b, committed], x[: counts[step]], atol=1e-10, rtol=1e-10)
                assert rollout.seed_tokens[:, b, committed].abs().sum() > 0


def test_the_nova_flop_model_counts_the_head_work_that_generate_does(backbone, sampler, monkeypatch):
    """margrpo.bench.nova_flops composes the fused step's FLOPs from per-image head work; its count
    of conditioned tokens and denoised chains must be what generate() hands the head (unknown
    positions, consistency predictions on), or the model's ratio describes other code."""
    import importlib

    from margrpo.bench.nova_flops import fused_rollout_head_work

    generate_module = importlib.import_module("margrpo.rollout.generate")
    tokens = chains = 0
    denoise = generate_module.multi_seed_denoise

    def counting(head, condition, *args, num_seeds, **kwargs):
        nonlocal tokens, chains
        tokens, chains = tokens + condition.shape[0], chains + condition.shape[0] * (num_seeds + 1)
        return denoise(head, condition, *args, num_seeds=num_seeds, **kwargs)

    monkeypatch.setattr(generate_module, "multi_seed_denoise", counting)
    plans = (RecordPlan((3, 5), ((0, 2, 4), (1, 2, 3))), RecordPlan((2, 3), ((0, 1, 2), (1, 2, 3))))
    # seed chains past the committed tokens in the recorded step's call, or deferred for none or all
    selections = {None: None, 0.0: lambda seeds: seeds.new_zeros(seeds.shape[1:3], dtype=torch.bool)}
    selections[1.0] = lambda seeds: seeds.new_ones(seeds.shape[1:3], dtype=torch.bool)
    for plan in plans:
        for share, select in selections.items():
            tokens = chains = 0
            config = _config(likelihood_positions="unknown", num_seeds=3)  # unguided: one condition row per token
            rollout = generate_module.generate(
                backbone, list(PROMPTS), config, [5, 6, 7], sampler=sampler, plan=plan, seed_selection=select
            )
            per_image = fused_rollout_head_work(list(rollout.reveal_counts), set(plan.mask_steps), config.num_seeds + 1, share)
            assert (tokens, chains) == (len(PROMPTS) * per_image[0], len(PROMPTS) * per_image[1]), share


def test_the_nova_flop_model_defers_seed_chains_only_where_the_benchmark_does(monkeypatch):
    """The benchmark's fused step runs the reference code's algorithm, whose random MTE position is
    drawn in the update: its rollout draws every seed chain, and the FLOP model must count them all
    (it counted the NOVA preset's deferred chains before); where the trainer would defer, fewer."""
    from margrpo.bench import nova_flops

    recipe = nova_flops.Recipe(images=2, mask_steps=8, record_mask_steps=2, diffusion_steps=4, record_diffusion_steps=2)
    assert nova_flops.bench_defers_seed_chains(recipe) is False
    u = nova_flops.units("nova-tiny", dtype="float32")
    bench = nova_flops.step_flops(u, recipe)
    monkeypatch.setattr(nova_flops, "bench_defers_seed_chains", lambda r: True)
    deferring = nova_flops.step_flops(u, recipe)
    assert not bench["counts"]["seed_chains_deferred"] and deferring["counts"]["seed_chains_deferred"]
    assert deferring["counts"]["fused_rollout_chains_per_image"] < bench["counts"]["fused_rollout_chains_per_image"]
    assert deferring["fused"]["rollout head"] < bench["fused"]["rollout head"]
    assert deferring["reference"] == bench["reference"]


# ---------------------------------------------------------------- plans and bad input
def test_plan_never_picks_deterministic_or_empty_steps(sampler):
    counts = schedule.nova_schedule(12, 6)
    assert counts[0] == 0 and sampler.is_deterministic(5)
    for seed in range(20):
        plan = choose_plan(counts, sampler, 4, 3, torch.Generator().manual_seed(seed))
        assert len(plan.mask_steps) == 4 and list(plan.mask_steps) == sorted(set(plan.mask_steps))
        assert 0 not in plan.mask_steps
        for steps in plan.diffusion_steps:
            assert len(steps) == 3 == len(set(steps)) and 5 not in steps and list(steps) == sorted(steps)
    with pytest.raises(ValueError, match="record_mask_steps"):
        choose_plan(counts, sampler, 6, 3, torch.Generator())
    with pytest.raises(ValueError, match="record_diffusion_steps"):
        choose_plan(counts, sampler, 2, 6, torch.Generator())


def test_plan_diffusion_range_limits_the_candidates(sampler):
    counts = schedule.nova_schedule(12, 6)
    seen = set()
    for seed in range(20):
        plan = choose_plan(counts, sampler, 3, 2, torch.Generator().manual_seed(seed), diffusion_range=(1, None))
        for steps in plan.diffusion_steps:
            assert 0 not in steps and 5 not in steps  # below start; deterministic
            seen.update(steps)
    assert seen == {1, 2, 3, 4}
    plan = choose_plan(counts, sampler, 2, 2, torch.Generator().manual_seed(0), diffusion_range=(0, 2))
    assert all(steps == (0, 1) for steps in plan.diffusion_steps)
    with pytest.raises(ValueError, match=r"record_diffusion_range \[3, 4\]"):
        choose_plan(counts, sampler, 2, 2, torch.Generator(), diffusion_range=(3, 4))
    for bad in ([0], [3, 2], [-1, None], [None, 3], [1.5, None]):
        with pytest.raises(ValueError, match="record_diffusion_range"):
            RolloutConfig(record_diffusion_range=bad)
    assert RolloutConfig(record_diffusion_range=[1, None]).record_diffusion_range == (1, None)


def test_bad_input_names_the_argument(backbone, sampler):
    from margrpo.rollout import generate, rollout_logprob

    config = _config()
    cases = [
        (dict(prompts=[]), "prompts"),
        (dict(prompts="a red square"), "prompts"),
        (dict(seeds=[1, 2]), "seeds"),
        (dict(seeds=[1, 2, -3]), "seeds"),
        (dict(plan=RecordPlan((0,), ((0, 1, 2),))), "plan.mask_steps"),  # step 0 reveals nothing
        (dict(plan=RecordPlan((1,), ((0, 1, 5),))), "plan.diffusion_steps"),  # 5 is deterministic
        (dict(config=_config(record_mask_steps=9)), "record_mask_steps"),
    ]
    for change, name in cases:
        args = dict(prompts=PROMPTS, config=config, seeds=[1, 2, 3], plan=None) | change
        with pytest.raises(ValueError, match=name):
            generate(backbone, args["prompts"], args["config"], args["seeds"], sampler=sampler, plan=args["plan"])
    with pytest.raises(TypeError, match="config"):
        generate(backbone, PROMPTS, {"cfg_scale": 2.0}, [1, 2, 3], sampler=sampler)
    with pytest.raises(ValueError, match="cfg_scale"):
        RolloutConfig(cfg_scale=-1.0)
    with pytest.raises(ValueError, match="unknown words"):
        generate(backbone, ["a purple square"], config, [1], sampler=sampler)
    rollout = _run(backbone, sampler, config)
    with pytest.raises(ValueError, match="cfg"):
        rollout_logprob(backbone, rollout, cfg="half")
    with pytest.raises(ValueError, match="steps"):
        rollout_logprob(backbone, rollout, steps=[3])


def test_default_sampler_comes_from_the_backbone(backbone):
    from margrpo.rollout import generate

    rollout = generate(backbone, PROMPTS[:1], _config(num_diffusion_steps=5), [1])
    assert rollout.sampler.num_steps == 5 and rollout.x_t.shape[1] == 1
    with pytest.raises(ValueError, match="num_diffusion_steps"):
        RolloutConfig(num_diffusion_steps=0)


def test_rollout_benchmark_smoke(capsys):
    from margrpo.bench import rollout as bench

    assert bench.main(["--models", "tiny", "--batch", "1", "--mask-steps", "2", "--diffusion-steps", "3"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    table = printed[next(i for i, line in enumerate(printed) if line.startswith("model")) :]  # below the header
    assert [line.split()[1] for line in table[1:]] == ["fused", "per-seed", "reference"]
    assert table[-1].split()[-4:-1] == ["1.00", "[1.00,", "1.00]"]  # the reference against itself


def test_flow_sde_sampler_rollout_and_likelihood():
    """The loop is sampler-agnostic: a flow-matching SDE (NOVA flow checkpoints, fixed std per step)."""
    from margrpo.diffusion import FlowSDESampler
    from margrpo.rollout import generate, rollout_logprob

    torch.manual_seed(1)
    model = TinyTestBackbone(learn_sigma=False).double()
    sampler = FlowSDESampler(5, noise_level=0.7)
    config = _config(cfg_scale=4.0, record_diffusion_steps=2)
    rollout = generate(model, PROMPTS, config, [1, 2, 3], sampler=sampler)
    assert all(not sampler.is_deterministic(i) for steps in rollout.plan.diffusion_steps for i in steps)
    assert torch.isfinite(rollout.tokens).all() and torch.isfinite(rollout.logp).all()
    likelihood = rollout_logprob(model, rollout)
    torch.testing.assert_close(likelihood.logp, rollout.logp, atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------- common random numbers in a group
def test_common_random_numbers_make_a_group_differ_only_where_recorded(backbone64, sampler):
    from margrpo.rollout import shared_seed

    prompts, seeds, shared = ["a red square"] * 2, [11, 12], [shared_seed(3, 0, 0)] * 2
    config = _config(record_mask_steps=0)
    nothing = _run(backbone64, sampler, config, seeds=seeds, prompts=prompts, plan=RecordPlan((), ()))
    crn = generate_with(backbone64, sampler, config, prompts, seeds, shared, RecordPlan((), ()))
    # with nothing recorded the two samples are one image; without sharing they are two
    torch.testing.assert_close(crn.tokens[0], crn.tokens[1], atol=1e-12, rtol=0)  # batch rows round alike
    assert (nothing.tokens[0] - nothing.tokens[1]).abs().max() > 1e-3
    # the order comes from the shared seed; the seed trajectories stay each sample's own
    expected_order = torch.randperm(backbone64.num_tokens, generator=torch.Generator().manual_seed(shared[0]))
    assert torch.equal(crn.order[0], expected_order) and torch.equal(crn.order[1], expected_order)
    assert (crn.seed_tokens[:, 0] - crn.seed_tokens[:, 1]).abs().amax(-1).min() > 0


@pytest.mark.parametrize("positions", ["revealed", "unknown"])
def test_common_random_numbers_draw_recorded_noise_from_the_own_seed(backbone64, sampler, positions):
    from margrpo.rollout import mask_schedule, shared_seed

    prompts, seeds, shared = ["a red square", "a red square"], [11, 12], [shared_seed(3, 0, 0)] * 2
    config = _config(likelihood_positions=positions, record_mask_steps=2)
    effective = [s for s, n in enumerate(mask_schedule(backbone64.num_tokens, 6, "nova")) if n > 0]
    plan = RecordPlan(mask_steps=(effective[1], effective[3]), diffusion_steps=((0, 2, 3), (1, 3, 4)))
    rollout = generate_with(backbone64, sampler, config, prompts, seeds, shared, plan)
    N, C, T, K = backbone64.num_tokens, backbone64.token_channels, sampler.num_steps, config.num_seeds
    counts = rollout.reveal_counts
    for b, seed in enumerate(seeds):
        generator = torch.Generator().manual_seed(seed)
        torch.randperm(N, generator=generator)  # the own stream: its order draw is not used
        own = torch.randn(N, T + 1, K + 1, C, generator=generator, dtype=torch.float64)
        for j, step in enumerate(plan.mask_steps):
            start = sum(counts[:step])
            stop = N if positions == "unknown" else start + counts[step]
            pos = rollout.order[b, start:stop]
            x_t, x_prev, mean, std, _ = _recorded(rollout, b, j)
            for r, i in enumerate(plan.diffusion_steps[j]):
                drawn = (x_prev[r, 0] - mean[r, 0]) / std[r, 0]
                torch.testing.assert_close(drawn, own[pos, i + 1, 0], atol=1e-9, rtol=1e-9)
    # before the first recorded mask step the group's canvases agree; the images then differ
    first = sum(counts[: plan.mask_steps[0]])
    early = rollout.order[0, :first]
    torch.testing.assert_close(rollout.tokens[0, early], rollout.tokens[1, early], atol=1e-12, rtol=0)
    assert not torch.allclose(rollout.tokens[0], rollout.tokens[1])


@pytest.mark.parametrize("positions", ["revealed", "unknown"])
def test_mirrored_pairs_record_negated_noise_and_share_the_rest(backbone64, sampler, positions):
    from margrpo.rollout import generate, mask_schedule, mirror_pairs, shared_seed

    prompts, seeds = ["a red square"] * 4, [11, 12, 13, 14]
    shared = [shared_seed(3, 0, 0)] * 4
    mirror = mirror_pairs(1, 4)
    assert mirror == [-1, 0, -1, 2]
    config = _config(likelihood_positions=positions, record_mask_steps=2)
    effective = [s for s, n in enumerate(mask_schedule(backbone64.num_tokens, 6, "nova")) if n > 0]
    plan = RecordPlan(mask_steps=(effective[1], effective[3]), diffusion_steps=((0, 2, 3), (1, 3, 4)))
    paired = generate(backbone64, prompts, config, seeds, sampler=sampler, plan=plan, shared_seeds=shared, mirror=mirror)
    common = generate_with(backbone64, sampler, config, prompts, seeds, shared, plan)
    for j in range(len(plan.mask_steps)):
        drawn = []
        for b in range(4):
            _, x_prev, mean, std, _ = _recorded(paired, b, j)
            drawn.append((x_prev[:, 0] - mean[:, 0]) / std[:, 0])
        _, x_prev, mean, std, _ = _recorded(common, 0, j)
        torch.testing.assert_close(drawn[0], (x_prev[:, 0] - mean[:, 0]) / std[:, 0], atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(drawn[1], -drawn[0], atol=1e-9, rtol=1e-9)  # the mirrored partner
        torch.testing.assert_close(drawn[3], -drawn[2], atol=1e-9, rtol=1e-9)
        assert (drawn[2] + drawn[0]).abs().max() > 1e-3  # the two pairs draw their own noise
    # the unmirrored samples are exactly the common-noise rollout's; the mirrored ones differ
    torch.testing.assert_close(paired.tokens[0], common.tokens[0], atol=1e-12, rtol=0)
    assert not torch.allclose(paired.tokens[1], common.tokens[1])


@pytest.mark.parametrize(
    "mirror, shared, match",
    [
        ([-1, 0], None, "needs shared_seeds"),
        ([-1], [5, 5], "one per sample"),
        ([1, -1], [5, 6], "shares sample"),
        ([1, 0], [5, 5], "draws its own noise"),
        ([0, -1], [5, 5], "another sample"),
    ],
)
def test_mirror_rejects_bad_pairs(backbone64, sampler, mirror, shared, match):
    from margrpo.rollout import generate

    with pytest.raises(ValueError, match=match):
        generate(
            backbone64,
            ["a red square"] * 2,
            _config(record_mask_steps=0),
            [1, 2],
            sampler=sampler,
            plan=RecordPlan((), ()),
            shared_seeds=shared,
            mirror=mirror,
        )


def generate_with(backbone, sampler, config, prompts, seeds, shared, plan):
    from margrpo.rollout import generate

    return generate(backbone, prompts, config, seeds, sampler=sampler, plan=plan, shared_seeds=shared)

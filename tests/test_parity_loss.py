"""The *-parity presets reproduce the reference code's (AMAP-ML/mar-grpo) update, term by term.

The reference trainers' loss is written here from their formulas, in float64, the way those trainers
lay it out: for NOVA on latent images [B, 4, H, W] (the 16-channel tokens unpatchified), every sum an
element mean under a per-pixel mask; for Harmon on tokens [B, N, C] with a per-token mask that sums
channels and counts tokens. For each recorded mask step j (one optimizer update each):

    A        = (r - mean_G r) / (std_G r + 1e-4), std unbiased (torch's default)
    lp_t     = log N(x_prev_t; mu_t, s^2) per element, s the rollout's std (Harmon: trajectory 0's for
               every trajectory, a constant, as the chain was sampled, under the pre-step canvas;
               NOVA: the fixed-variance std of the step)
    term_t   = A exp(lp_t - stop_grad(lp_t))        (value A, gradient A d lp_t)
    crit     = top max(1, int(0.3 n)) positions of std over seeds of the final latent, channel mean
               (NOVA: per latent pixel, OR one random pixel)
    cm       = the step's likelihood positions; sel = (cos_cur - cos_prev > 0) * cm + committed
               (from the third effective step; NOVA per pixel over its 4 channels)
    policy_j = sum(cm sel [term_0 (1 - crit) + mean_k term_k crit]) / sum(cm sel)
    kl_j     = sum(cm k3(mu_ref_0 - mu_0)) / sum(cm),     k3(d) = exp(d) - d - 1
    loss_j   = -(policy_j - beta kl_j)

(Harmon's policy_j sums a token's C per-element terms of value A, so its value is C times the
library's per-token REINFORCE value; the gradients are equal and the comparison scales that value.)

The library side is margrpo.grpo.update itself on a Rollout built from random recorded tensors, with
the training likelihood replaced by means that depend on a parameter theta (the policy) or are
fixed (the reference), so d loss / d theta of every optimizer update and the summed loss value are
compared (relative 1e-6).
Each test switches on one point of the reference's update, so a failure names the term; each also
checks that the library default differs, so the comparison can fail.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from unittest import mock

import pytest
import torch

from margrpo.grpo import Collectives, policy_update
from margrpo.heads.nova_head import unpatchify
from margrpo.rollout import Rollout, RolloutConfig
from margrpo.rollout.likelihood import RolloutLikelihood
from margrpo.rollout.plan import RecordPlan
from margrpo.train.config import load_config
from margrpo.train.step import group_advantages
from margrpo.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"nova": ROOT / "configs" / "nova-512-parity.yaml", "harmon": ROOT / "configs" / "harmon-1.5b-parity.yaml"}
B, N, C, R = 4, 16, 16, 2  # images (one group), tokens (a 4x4 grid), channels, diffusion steps per mask step
GRID, PATCH, PIXEL_CHANNELS = 4, 2, 4  # NOVA: 2x2 patches of 4-channel latent pixels -> an 8x8 latent
RTOL = 1e-6
# (reveal counts per mask step, recorded mask steps): NOVA's first step reveals nothing
SCHEDULES = {"nova": ([0, 2, 3, 3, 4, 4], (1, 3, 4)), "harmon": ([2, 3, 3, 4, 4], (0, 2, 3))}
SEEDS = {"nova": 3, "harmon": 5}
DIRECTIONS = {"nova": "pre_step", "harmon": "post_step"}


# ---------------------------------------------------------------------------------------------- setup
class Case:
    """Random recorded tensors of one rollout, the trainer shell that scores them, and theta."""

    def __init__(self, model: str, overrides: list[str], seed: int = 0):
        self.model = model
        gen = torch.Generator().manual_seed(seed)
        counts, mask_steps = SCHEDULES[model]
        K = SEEDS[model]
        T, M = K + 1, len(mask_steps)
        config = RolloutConfig(
            num_mask_steps=len(counts),
            schedule=model,
            num_seeds=K,
            record_mask_steps=M,
            record_diffusion_steps=R,
            likelihood_positions="unknown",
            known_mask=DIRECTIONS[model],
        )
        plan = RecordPlan(mask_steps, tuple((1, 3) for _ in mask_steps))
        order = torch.stack([torch.randperm(N, generator=gen) for _ in range(B)])

        def randn(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64)

        shell = Rollout(
            prompts=["p"] * B,
            seeds=torch.arange(B),
            order=order,
            tokens=randn(B, N, C),
            seed_tokens=randn(K, B, N, C),
            images=torch.zeros(B, 3, 2, 2, dtype=torch.float64),
            x_t=randn(T, B, 0, C),
            x_prev=randn(T, B, 0, C),
            mean=randn(T, B, 0, C),
            std=randn(T, B, 0, C),
            logp=randn(T, B, 0),
            pred_clean=randn(B, M, N, C),
            pred_clean_prev=randn(B, M, N, C),
            reveal_counts=tuple(counts),
            plan=plan,
            cfg_scales=(1.0,) * M,
            config=config,
            sampler=None,
        )
        L = sum(shell.slots[j].count for j in range(M)) * R
        x_prev = randn(T, B, L, C)
        if model == "nova":  # fixed variance: one std per recorded diffusion step, whatever the trajectory
            per_step = 0.2 + 0.3 * torch.rand(1, B, L, 1, generator=gen, dtype=torch.float64)
            std = per_step.expand(T, B, L, C).clone()
        else:  # learned range: a std per element and trajectory
            std = 0.2 + 0.3 * torch.rand(T, B, L, C, generator=gen, dtype=torch.float64)
        recorded_mean = x_prev + std * randn(T, B, L, C)
        logp = torch.distributions.Normal(recorded_mean, std).log_prob(x_prev).sum(-1)
        self.rollout = dataclasses.replace(shell, x_t=randn(T, B, L, C), x_prev=x_prev, mean=recorded_mean, std=std, logp=logp)
        # the current policy's means and (learned-range) std as functions of theta; the reference model's means
        self.policy = torch.nn.Module()
        self.policy.theta = torch.nn.Parameter(torch.zeros(T, B, L, C, dtype=torch.float64))
        self.reference = torch.nn.Module()
        self.base_mean = recorded_mean + 0.1 * randn(T, B, L, C)
        self.log_std_shift = 0.3 * randn(T, B, L, C)
        self.ref_mean = self.base_mean + 0.05 * randn(T, B, L, C)
        self.rewards = randn(B)
        self.config = load_config(PRESETS[model], [f"grpo.minibatches={M}", *overrides])
        self.trainer = Trainer.__new__(Trainer)  # for its advantages only
        self.trainer.config, self.trainer.rank, self.trainer.collectives = self.config, 0, Collectives()
        if config.known_mask == "post_step":
            # the rollout's std above is the post-step re-evaluation; the main chain was drawn with another
            sampled_std = 0.2 + 0.3 * torch.rand(1, B, L, C, generator=gen, dtype=torch.float64)
            self.rollout = dataclasses.replace(self.rollout, sampled_std=sampled_std)

    @property
    def theta(self) -> torch.Tensor:
        return self.policy.theta

    def policy_mean(self) -> torch.Tensor:
        return self.base_mean + self.theta

    def policy_std(self) -> torch.Tensor:
        """The current head's std: the recorded one moved by theta (a learned-range variance depends on z)."""
        return self.rollout.std * torch.exp(self.log_std_shift * self.theta)

    def _likelihood(self, model, sub_rollout, config, steps=None, bf16=False, seed_positions=None):
        """The training likelihood of the policy (means moved by theta) or of the reference model,
        every trajectory everywhere (seed_positions only says which seed entries the loss reads)."""
        images = sub_rollout.seeds.tolist()
        cols = self.rollout.columns(steps)
        if model is self.reference:
            mean, std = self.ref_mean, self.rollout.std
        else:
            mean, std = self.policy_mean(), self.policy_std()
        T = sub_rollout.num_trajectories  # the trajectories it is given (the update may pass trajectory 0 alone)
        mean, std = (v[:T, images][:, :, cols] for v in (mean, std))
        x_prev = self.rollout.x_prev[:T, images][:, :, cols]
        logp = torch.distributions.Normal(mean, std).log_prob(x_prev).sum(-1)
        return RolloutLikelihood(logp, mean, torch.zeros(logp.shape[1:], dtype=torch.bool))

    def ours(self, selection_seed: int = 1) -> tuple[list[torch.Tensor], float]:
        """(d loss / d theta of every optimizer update, the summed loss value), from margrpo.grpo.update."""
        advantages = group_advantages(self.trainer, self.rewards, self.rollout.prompts)
        theta, grads = self.theta, []

        class Capture:  # an optimizer that records the gradient of every step
            def zero_grad(self, set_to_none=True):
                theta.grad = None

            def step(self):
                grads.append(theta.grad.clone())

        torch.manual_seed(selection_seed)
        with mock.patch.object(policy_update, "likelihood", self._likelihood):
            result = policy_update.update(
                self.policy, self.reference, self.rollout, advantages, self.config.grpo, Capture(), grad_clip=math.inf
            )
        assert result.skipped is None
        return grads, result.metrics["loss"]


# ------------------------------------------------------------------------------- the reference's loss
def reference_advantages(rewards: torch.Tensor) -> torch.Tensor:
    groups = rewards.view(-1, B)
    centered = groups - groups.mean(1, keepdim=True)
    return (centered / (groups.std(1) + 1e-4)).flatten()


def to_maps(case: Case, values: torch.Tensor) -> torch.Tensor:
    """[..., B, N, C] per token -> the layout the reference trainer computes in: NOVA's latent images
    [..., B, 4, 8, 8]; Harmon's tokens unchanged."""
    if case.model == "harmon":
        return values
    lead = values.shape[:-3]
    flat = values.reshape(-1, N, C)
    size = GRID * PATCH
    return unpatchify(flat, size, size, PATCH).reshape(*lead, B, PIXEL_CHANNELS, size, size)


def channel_dim(case: Case) -> int:
    return -3 if case.model == "nova" else -1


def scatter_step(case: Case, values: torch.Tensor, j: int) -> torch.Tensor:
    """Recorded step j's transitions [T, B, L, C] -> full token maps [R, T, B, N, C] (0 elsewhere)."""
    r = case.rollout
    positions = r.positions(j)
    part = values[:, :, r.l_slice(j)].unflatten(2, (R, positions.shape[1]))  # [T, B, R, P, C]
    full = values.new_zeros(R, values.shape[0], B, N, C)
    index = positions[None, None, :, :, None].expand(R, values.shape[0], B, -1, C)
    return full.scatter(3, index, part.permute(2, 0, 1, 3, 4))


def position_mask(case: Case, tokens: torch.Tensor) -> torch.Tensor:
    """bool [B, N] per token -> the reference's mask: NOVA [B, 1, 8, 8] per pixel (all 4 channels of a
    pixel agree); Harmon [B, N, 1] (a per-token weight that the channel sum multiplies)."""
    if case.model == "harmon":
        return tokens[..., None].double()
    return to_maps(case, tokens[..., None].double().expand(B, N, C))[:, :1]


def critic_mask(case: Case, selection_seed: int) -> torch.Tensor:
    """The top 30% most uncertain positions (NOVA: pixels, OR one random pixel) in mask layout."""
    seeds = to_maps(case, case.rollout.seed_tokens)  # [K, B, ...]
    std = seeds.std(0, unbiased=False).mean(channel_dim(case), keepdim=True)  # NOVA [B, 1, 8, 8]; Harmon [B, N, 1]
    flat = std.reshape(B, -1)
    k = max(1, int(flat.shape[1] * case.config.grpo.mte_ratio))
    mask = torch.zeros_like(flat).scatter(1, flat.topk(k, 1).indices, 1.0).view_as(std)
    if case.model == "nova":
        # one uniformly drawn pixel (the library draws over its own pixel order, so draw in that order
        # and place the pixel on the map: the same uniform choice, here the same pixel)
        torch.manual_seed(selection_seed)
        draws = torch.rand(B, N * C // PIXEL_CHANNELS)
        one = torch.zeros(B, N * C // PIXEL_CHANNELS, dtype=torch.float64).scatter(1, draws.argmax(1, keepdim=True), 1.0)
        one_map = to_maps(case, one.view(B, N, C // PIXEL_CHANNELS, 1).expand(B, N, -1, PIXEL_CHANNELS).reshape(B, N, C))
        mask = (mask + one_map[:, :1]).clamp(0, 1)
    return mask


def cosine(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    return (a * b).sum(dim) / (a.norm(dim=dim) * b.norm(dim=dim))


def count(case: Case, mask: torch.Tensor, per: torch.Tensor) -> torch.Tensor:
    """The reference's normaliser sum(mask) over the R diffusion steps: elements for NOVA (the mask
    spans a pixel's channels), tokens for Harmon (a [.., N, 1] mask)."""
    if case.model == "nova":
        return mask.expand_as(per).sum()
    return R * mask.sum()


def reference_losses(case: Case, *, mte: bool, consistency: bool, beta: float, selection_seed: int = 1):
    """(loss_j, d loss_j / d theta) of every recorded mask step j, the reference trainer's formula."""
    r = case.rollout
    advantages = reference_advantages(case.rewards)
    crit = critic_mask(case, selection_seed) if mte else None
    effective = [i for i, n in enumerate(r.reveal_counts) if n > 0]
    x_prev_all = r.x_prev
    # the std the main chain was sampled with (post-step: the sampling-time one), for every trajectory
    std_all = (r.std[:1] if r.sampled_std is None else r.sampled_std).expand_as(x_prev_all)
    out = []
    for j, mask_step in enumerate(r.plan.mask_steps):
        mean_all = case.policy_mean()
        x_prev, mean, std = (to_maps(case, scatter_step(case, v, j)) for v in (x_prev_all, mean_all, std_all))
        ref_mean = to_maps(case, scatter_step(case, case.ref_mean, j))
        likelihood_tokens = torch.zeros(B, N, dtype=torch.bool).scatter(1, r.positions(j), True)
        committed = torch.zeros(B, N, dtype=torch.bool)
        start = r.slots[j].start
        committed.scatter_(1, r.order[:, start : start + r.slots[j].revealed], True)
        cm = position_mask(case, likelihood_tokens)
        std = torch.where(std > 0, std, torch.ones_like(std))  # outside the positions (masked out anyway)
        lp = -((x_prev - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)  # [R, T, B, ...]
        adv = advantages.view(1, 1, B, *([1] * (lp.dim() - 3)))
        term = torch.exp(lp - lp.detach()) * adv
        selected = cm
        if consistency and effective.index(mask_step) > 1:
            final, cur, prev = (to_maps(case, v) for v in (r.tokens, r.pred_clean[:, j], r.pred_clean_prev[:, j]))
            dim = channel_dim(case)
            moved = ((cosine(cur, final, dim) - cosine(prev, final, dim)) > 0).double().unsqueeze(dim)
            if case.model == "nova":
                moved = moved[:, :1]
            selected = cm * (moved * cm + position_mask(case, committed)).clamp(0, 1)
        if mte:
            per = term[:, 0] * (1 - crit) + term[:, 1:].mean(1) * crit  # [R, B, ...]
        else:
            per = term[:, 0]
        policy = (per * selected).sum() / count(case, selected, per)
        d = ref_mean[:, 0] - mean[:, 0]
        kl = ((torch.exp(d) - d - 1) * cm).sum() / count(case, cm, per)
        loss = -(policy - beta * kl)
        # the value the library reports: Harmon's reference sums a token's C per-element ratios (each
        # exp(0) = 1), so its REINFORCE value counts the token C times; the library's per-token ratio
        # counts it once. Same gradient; only the reported number differs.
        value = -(policy.detach() / (C if case.model == "harmon" else 1) - beta * kl.detach())
        out.append((value, torch.autograd.grad(loss, case.theta)[0]))
    return [grad for _, grad in out], float(sum(value for value, _ in out))


def assert_updates_match(ours, reference):
    """The gradient of every update to a relative 1e-6, and the summed loss value to 1e-6 of its own
    size or, where the groups' advantages cancel (a REINFORCE value is a weighted mean of them, often
    about 0), of the advantages' (about 1)."""
    (grads, loss), (ref_grads, ref_loss) = ours, reference
    assert len(grads) == len(ref_grads)
    for u, (grad, ref_grad) in enumerate(zip(grads, ref_grads)):
        scale = ref_grad.abs().max()
        assert scale > 0, f"update {u}: the reference gradient is 0, the comparison would check nothing"
        torch.testing.assert_close(grad, ref_grad, rtol=RTOL, atol=RTOL * float(scale), msg=lambda m: f"update {u} gradient: {m}")
    assert loss == pytest.approx(ref_loss, rel=RTOL, abs=RTOL), "summed loss value"


def updates_differ(ours, reference) -> bool:
    return any(not torch.allclose(g, rg, rtol=1e-3, atol=0) for g, rg in zip(ours[0], reference[0]))


# ----------------------------------------------------------------------------------------- one point each
def only(*, mte=False, consistency=False, beta=0.0):
    return [f"grpo.mte={str(mte).lower()}", f"grpo.consistency={str(consistency).lower()}", f"grpo.kl_beta={beta}"]


@pytest.mark.parametrize("model", ["nova", "harmon"])
def test_kl_reduction_matches_the_policy_term(model):
    """1. KL relative to the policy term: summed over channels with the policy log-prob (Harmon),
    averaged over elements with it (NOVA)."""
    case = Case(model, only(beta=0.5))
    reference = reference_losses(case, mte=False, consistency=False, beta=0.5)
    assert_updates_match(case.ours(), reference)
    flipped = Case(model, only(beta=0.5) + ["grpo.channel_reduction=" + ("sum" if model == "nova" else "mean")])
    assert updates_differ(flipped.ours(), reference)


def assert_point(model, settings, flips, **reference_terms):
    """The preset's update matches the reference's on this point, and each of `flips` (the default's
    value of one option) breaks the match, so the test can fail."""
    case = Case(model, settings)
    reference = reference_losses(case, **reference_terms)
    assert_updates_match(case.ours(), reference)
    for change in flips:
        assert updates_differ(Case(model, settings + [change]).ours(), reference), change


def test_mte_weighs_the_seeds_only():
    """2. MTE positions: the rollout's own chain weighs 0, each of the K seeds 1/K."""
    assert_point("harmon", only(mte=True), ["grpo.mte_include_rollout=true"], mte=True, consistency=False, beta=0.0)


def test_harmon_recorded_main_chain_std():
    """3. Learned range: the rollout's std of trajectory 0 as a constant, for every trajectory."""
    assert_point("harmon", only(mte=True), ["grpo.likelihood_std=policy"], mte=True, consistency=False, beta=0.0)


def relative_gradient_error(ours, reference) -> float:
    """The largest |d loss / d theta - the reference's| over updates, relative to the reference's largest."""
    return max(float((g - rg).abs().max() / rg.abs().max()) for g, rg in zip(ours[0], reference[0]))


def test_harmon_recorded_main_takes_the_sampling_time_std():
    """3b. With the post-step known mask the rollout's std is re-evaluated under the post-step canvas;
    the reference holds the std the main chain was sampled with (pre-step canvas). The preset uses
    that one; the re-evaluated one (the rollout without sampled_std) misses the reference."""
    case = Case("harmon", only(mte=True, beta=0.5))
    assert case.rollout.sampled_std is not None and not torch.allclose(case.rollout.sampled_std, case.rollout.std[:1])
    reference = reference_losses(case, mte=True, consistency=False, beta=0.5)
    ours = case.ours()
    assert_updates_match(ours, reference)
    case.rollout = dataclasses.replace(case.rollout, sampled_std=None)
    assert relative_gradient_error(case.ours(), reference) > 1e-2


@pytest.mark.parametrize("model", ["nova", "harmon"])
def test_unbiased_advantage_std(model):
    """4. Advantages divide by the unbiased group std."""
    case = Case(model, only())
    ours = group_advantages(case.trainer, case.rewards, case.rollout.prompts)
    torch.testing.assert_close(ours, reference_advantages(case.rewards), rtol=RTOL, atol=0)
    assert_updates_match(case.ours(), reference_losses(case, mte=False, consistency=False, beta=0.0))
    default = Case(model, only() + ["grpo.advantage_std=population"])
    assert not torch.allclose(group_advantages(default.trainer, case.rewards, case.rollout.prompts), ours)


@pytest.mark.parametrize("model", ["nova", "harmon"])
def test_per_mask_step_normalisation_one_update_each(model):
    """5. One update per recorded mask step, its loss normalised over that step's positions."""
    case = Case(model, only(beta=0.5))
    reference = reference_losses(case, mte=False, consistency=False, beta=0.5)
    ours = case.ours()
    assert len(ours[0]) == case.rollout.plan.num_mask_steps
    assert_updates_match(ours, reference)
    assert updates_differ(Case(model, only(beta=0.5) + ["grpo.normalization=batch"]).ours(), reference)


def test_nova_top_k_per_pixel_with_one_random_pixel():
    """6a. NOVA ranks latent pixels (not tokens) and ORs in one random pixel."""
    assert_point("nova", only(mte=True), ["grpo.pixels_per_token=1", "grpo.mte_random_positions=0"], mte=True, consistency=False, beta=0.0)


def test_nova_consistency_per_pixel():
    """6b. NOVA's consistency compares each latent pixel's 4 channels, not a token's 16."""
    assert_point("nova", only(consistency=True), ["grpo.pixels_per_token=1"], mte=False, consistency=True, beta=0.0)


@pytest.mark.parametrize("model, ratio", [("nova", 0.01), ("harmon", 0.05)])
def test_reference_top_k_count_when_ratio_times_positions_is_below_one(model, ratio):
    """The reference's top-k count max(1, int(ratio * n)): with ratio * n < 1 (NOVA: 0.64 of 64
    pixels; Harmon: 0.8 of 16 tokens) it still takes the most uncertain position, where the default
    floor takes none."""
    assert_point(model, only(mte=True) + [f"grpo.mte_ratio={ratio}"], ["grpo.mte_k=floor"], mte=True, consistency=False, beta=0.0)


def test_harmon_consistency_per_token():
    case = Case("harmon", only(consistency=True))
    assert_updates_match(case.ours(), reference_losses(case, mte=False, consistency=True, beta=0.0))


@pytest.mark.parametrize("model", ["nova", "harmon"])
def test_whole_preset_update(model):
    """Every point at once, with the presets' own switches (MTE, consistency, beta 0.01)."""
    case = Case(model, [])
    g = case.config.grpo
    assert g.mte and g.consistency and g.kl_beta == 0.01
    assert_updates_match(case.ours(), reference_losses(case, mte=True, consistency=True, beta=g.kl_beta))


# ------------------------------------------------------------------- the same options on a real rollout
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from conftest import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def _captured_gradient(tmp_path, checkpoint, *extra) -> dict[str, torch.Tensor]:
    """The summed gradients of one train step of the tiny model (lr 0, so every update sees the
    same policy), with the given options."""
    overrides = [
        f"backbone.checkpoint={checkpoint}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=1",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "rollout.num_seeds=2",
        "rollout.likelihood_positions=unknown",
        "grpo.group_size=4",
        "grpo.prompts_per_step=1",
        "grpo.objective=reinforce",
        "grpo.kl_beta=0.1",
        "rewards={jpeg_incompressibility: 1.0}",
        "optim.lr=0",
        "optim.grad_clip=1e9",
        *extra,
    ]
    trainer = Trainer(load_config(None, overrides))
    captured, original_step = {}, trainer.optimizer.step

    def capture(*args, **kwargs):
        for name, p in trainer.policy.named_parameters():
            if p.grad is not None:
                captured[name] = captured.get(name, 0) + p.grad.clone()
        return original_step(*args, **kwargs)

    trainer.optimizer.step = capture
    metrics = trainer.train_step()
    assert "skipped" not in metrics and math.isfinite(metrics["loss"])
    return captured


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_pixel_positions_and_recorded_std_on_a_real_rollout(tmp_path, tiny_checkpoint, reduction):
    """The trainer's glue on a real rollout: with every position kept, splitting tokens into pixels
    changes nothing (a pixel's log-prob is scaled to its token's), and (fixed variance) neither does
    the recorded std; every parity option at once runs, with one update per mask step."""
    common = (f"grpo.channel_reduction={reduction}",)
    tokens = _captured_gradient(tmp_path / "a", tiny_checkpoint, *common)
    assert tokens and any(float(g.abs().max()) > 0 for g in tokens.values())
    for extra in (["grpo.pixels_per_token=4"], ["grpo.likelihood_std=recorded_main"]):
        other = _captured_gradient(tmp_path / extra[0], tiny_checkpoint, *common, *extra)
        assert other.keys() == tokens.keys()
        for name in tokens:
            torch.testing.assert_close(other[name], tokens[name], rtol=1e-4, atol=1e-7, msg=lambda m: f"{extra}: {name}: {m}")
    everything = [
        "grpo.pixels_per_token=4",
        "grpo.likelihood_std=recorded_main",
        "grpo.mte=true",
        "grpo.mte_include_rollout=false",
        "grpo.mte_k=reference",
        "grpo.mte_random_positions=1",
        "grpo.consistency=true",
        "grpo.consistency_start_step=1",
        "grpo.normalization=update",
        "grpo.minibatch_over=mask_steps",
        "grpo.minibatches=2",
        "grpo.advantage_std=unbiased",
        "grpo.kl_type=parity_mean_k3",
    ]
    assert _captured_gradient(tmp_path / "all", tiny_checkpoint, *everything)


def test_pixel_positions_need_a_fixed_std():
    """Pixel positions rebuild the log-probs from a std the rollout fixed: a learned-range variance
    needs likelihood_std recorded_main, and the error names both settings."""
    from types import SimpleNamespace

    case = Case("harmon", only() + ["grpo.pixels_per_token=4", "grpo.likelihood_std=policy"])
    case.rollout = dataclasses.replace(case.rollout, sampler=SimpleNamespace(variance_type="learned_range"))
    with pytest.raises(ValueError, match="pixels_per_token.*likelihood_std"):
        case.ours()

"""The `matching` likelihood estimator: each committed token scored by the frozen head's own denoising
objective, on forward-noised draws that end at the token the reward saw.

For a token committed at recorded mask step j (final latent x0, condition z produced by the AR model
at that step), D draws of (training time t, noise e) give x_t = q(x_t | x0) and the head's regression
target y (e, x0 or v: the head's own parameterisation; the flow velocity e - x0 for flow heads). The
token's score is

    s(z) = -1/2 * mean_d  sum_c (f(x_t, t, z) - y)^2       (channel_reduction "mean": mean over c)

the pretraining loss with its sign flipped: a Monte Carlo estimate of the diffusion ELBO under the
head's training weighting (uniform t, unweighted error), i.e. of log p(x0 | z) up to a constant and a
per-t weight. Every draw ends at the committed x0, so averaging draws lowers the variance without
losing the signal (a Rao-Blackwellised multi-trajectory expectation); the seed chains of the
`transition` estimator are fresh samples of p(. | z) instead, whose score term has zero expectation.

The policy term is the clipped GRPO surrogate with ratio exp(s_new - s_old) per token (advantage-
weighted matching, AWM, in the per-token form); the KL to the ref policy is the KL between unit
Gaussians around the two predictions on the same draws, 1/2 mean_d sum_c (f - f_ref)^2. Under
guidance f is the guided output, the policy that sampled. The draws are fixed per rollout (seeded by
its seeds), so the old, new and ref policy scores see the same (t, e).

Layout: the estimator reads what every rollout records (tokens, order, reveal counts, the recorded
mask steps); its values are [D, B, L_m(, C)] with L_m = sum_j n_j, the committed tokens of the
recorded mask steps, step after step (`committed_columns`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from margrpo import ops
from margrpo.diffusion import DDPMSampler, FlowSDESampler
from margrpo.heads.multi_seed import guided_output
from margrpo.rollout import Rollout
from margrpo.rollout.guidance import forward_rows, guidance_for, head_condition, prompt_rows

from .objective import ChunkLoss, grouped_token_weights
from .selection import mte_mask


@dataclass
class MatchingDraws:
    """Per recorded mask step j: times[j] [D, B, n_j] (training timesteps: integers for DDPM, sigmas
    in [0, 1] for flow heads), noise[j] [D, B, n_j, C], and active[j] bool [D, B, n_j]: the draws a
    token uses (None: all D; the multi-trajectory expectation gives uncertain tokens more)."""

    times: list[torch.Tensor]
    noise: list[torch.Tensor]
    active: list[torch.Tensor] | None = None

    @property
    def num_draws(self) -> int:
        return self.noise[0].shape[0] if self.noise else 0

    def select(self, images: Sequence[int]) -> MatchingDraws:
        """The draws of some images (a chunk of the update)."""
        rows = torch.tensor(list(images), dtype=torch.long)

        def pick(values):
            return [v.index_select(1, rows.to(v.device)) for v in values]

        return MatchingDraws(pick(self.times), pick(self.noise), None if self.active is None else pick(self.active))

    def with_active(self, active: list[torch.Tensor]) -> MatchingDraws:
        return MatchingDraws(self.times, self.noise, active)


def train_times(sampler, shape: tuple[int, ...], generator: torch.Generator, time_range: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """Training times as the head was trained, uniform over the fraction `time_range` of the training
    process (0 = clean): integer steps (DDPM) or sigmas (flow)."""
    low, high = time_range
    if isinstance(sampler, DDPMSampler):
        n = sampler.num_train_timesteps
        first, stop = int(round(low * n)), max(int(round(high * n)), int(round(low * n)) + 1)
        return torch.randint(first, min(stop, n), shape, generator=generator)
    if isinstance(sampler, FlowSDESampler):
        return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)
    raise TypeError(
        f"sampler: got {type(sampler).__name__}, expected a DDPMSampler or FlowSDESampler "
        "(the matching estimator needs the head's training-time forward process)"
    )


def _draw_seed(sample_seed: int) -> int:
    key = f"margrpo-matching:{int(sample_seed)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def draw_matching(rollout: Rollout, num_draws: int, time_range: tuple[float, float] = (0.0, 1.0)) -> MatchingDraws:
    """D = num_draws (time, noise) draws for every committed token of the rollout's recorded mask
    steps. Each image draws from its own CPU generator, seeded by its sample seed, so its draws do not
    depend on what else shares the batch; the old, new and ref policy scores all read these."""
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 1:
        raise ValueError(f"num_draws: got {num_draws!r}, expected an integer >= 1")
    C, device, dtype = rollout.tokens.shape[-1], rollout.tokens.device, rollout.tokens.dtype
    counts = [slot.revealed for slot in rollout.slots]
    per_image = []
    for seed in rollout.seeds.tolist():
        generator = torch.Generator().manual_seed(_draw_seed(seed))
        per_image.append(
            [
                (
                    train_times(rollout.sampler, (num_draws, n), generator, time_range),
                    torch.randn(num_draws, n, C, generator=generator, dtype=torch.float64),
                )
                for n in counts
            ]
        )
    times = [torch.stack([image[j][0] for image in per_image], 1).to(device) for j in range(len(counts))]
    noise = [torch.stack([image[j][1] for image in per_image], 1).to(device, dtype) for j in range(len(counts))]
    return MatchingDraws(times, noise)


def committed_columns(rollout: Rollout, steps: Sequence[int] | None) -> torch.Tensor | slice:
    """The L_m-axis columns (committed tokens, step after step) of recorded mask steps `steps`
    (all when None), in their order."""
    if steps is None:
        return slice(None)
    offsets = [0]
    for j in range(rollout.plan.num_mask_steps):
        offsets.append(offsets[-1] + rollout.slots[j].revealed)
    parts = [torch.arange(offsets[j], offsets[j + 1]) for j in steps]
    return torch.cat(parts).to(rollout.order.device) if parts else rollout.order.new_zeros(0)


@dataclass
class MatchingValues:
    """For the committed tokens of the requested steps, [D, b, l, C]: the head's (guided) prediction
    (with gradient to z; 0 on inactive draws) and its regression target; active bool [D, b, l]."""

    prediction: torch.Tensor
    target: torch.Tensor
    active: torch.Tensor


def matching_values(
    model, rollout: Rollout, draws: MatchingDraws, *, cfg: str = "rollout", steps: Sequence[int] | None = None
) -> MatchingValues:
    """The head's predictions on the forward-noised committed tokens of recorded mask steps `steps`
    (default all, in order) under `model`'s z, each token's z from the canvas its step was sampled from.
    cfg: "rollout" (the rollout's guidance) or "none" (conditional only)."""
    if cfg not in ("rollout", "none"):
        raise ValueError(f"cfg: got {cfg!r}, expected 'rollout' or 'none'")
    if rollout.config.known_mask != "pre_step":
        raise ValueError(
            "rollout: the matching estimator needs rollout.known_mask: pre_step (with the post-step "
            "mask the committed tokens are known to the forward that would score them)"
        )
    M = rollout.plan.num_mask_steps
    steps = list(range(M)) if steps is None else list(steps)
    guided = rollout.config.uses_cfg and cfg == "rollout"
    rows = prompt_rows(model, rollout.prompts, rollout.config, guided=guided)
    B, C, D = rollout.batch_size, rollout.tokens.shape[-1], draws.num_draws
    sampler, head = rollout.sampler, model.head
    predictions, targets, actives = [], [], []
    for j in steps:
        slot = rollout.slots[j]
        n = slot.revealed
        positions = rollout.order[:, slot.start : slot.start + n]  # committed at step j
        canvas, known = rollout.canvas_known(j)
        z = head_condition(forward_rows(model, rows, canvas, known, slot.known), rows, positions)
        x0 = rollout.tokens.gather(1, positions[..., None].expand(-1, -1, C)).reshape(B * n, C)
        t, noise = draws.times[j].reshape(D, B * n), draws.noise[j].reshape(D, B * n, C)
        target = sampler.training_target(x0.expand(D, -1, -1), noise, t)
        cond = head.embed_condition(z if not guided else z.reshape(2, B * n, -1))
        guidance = guidance_for(rollout.config, rollout.cfg_scales[j], guided=guided)
        if draws.active is None:  # every draw of every token: one broadcast head call
            model_t = sampler.train_model_time(t)
            x_t = sampler.add_noise(x0.expand(D, -1, -1), noise, t)
            if guided:
                model_t = model_t[:, None]  # [D, 1, B*n]: broadcast over the cond / uncond halves
            out = guided_output(head, head.modulation(cond, model_t), x_t, guidance)[..., :C].to(x0.dtype)
            active = torch.ones(D, B, n, dtype=torch.bool, device=x0.device)
        else:  # only the active (draw, token) pairs, as rows
            active = draws.active[j]
            draw, token = active.reshape(D, B * n).nonzero(as_tuple=True)
            rows_t = t[draw, token]
            x_t = sampler.add_noise(x0[token], noise[draw, token], rows_t)
            model_t = sampler.train_model_time(rows_t)
            cond_rows = cond[..., token, :]
            active_out = guided_output(head, head.modulation(cond_rows, model_t), x_t, guidance)[..., :C]
            out = x0.new_zeros(D, B * n, C).index_put((draw, token), active_out.to(x0.dtype))
        predictions.append(out.reshape(D, B, n, C))
        targets.append(target.reshape(D, B, n, C))
        actives.append(active)
    if not predictions:
        empty = rollout.tokens.new_zeros(D, B, 0, C)
        return MatchingValues(empty, empty, torch.zeros(D, B, 0, dtype=torch.bool, device=empty.device))
    return MatchingValues(torch.cat(predictions, 2), torch.cat(targets, 2), torch.cat(actives, 2))


def _acc(values: torch.Tensor) -> torch.Tensor:
    """fp32 (fp64 stays fp64: exact tests) for the squared errors of bf16 / fp16 predictions."""
    return values if values.dtype == torch.float64 else values.float()


def _reduce_channels(values: torch.Tensor, channel_reduction: str) -> torch.Tensor:
    return values.sum(-1) if channel_reduction == "sum" else values.mean(-1)


def _mean_over_active(values: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """[D, b, l] -> [b, l]: the mean over each token's active draws."""
    weights = active.to(values.dtype)
    return (values * weights).sum(0) / weights.sum(0).clamp_min(1.0)


def matching_score(values: MatchingValues, channel_reduction: str = "sum") -> torch.Tensor:
    """s = -1/2 mean_d reduce_c (prediction - target)^2 over each token's active draws: -> [b, l]."""
    error = (_acc(values.prediction) - _acc(values.target)).pow(2)
    return -0.5 * _mean_over_active(_reduce_channels(error, channel_reduction), values.active)


def matching_kl(
    prediction: torch.Tensor, ref_prediction: torch.Tensor, active: torch.Tensor, channel_reduction: str = "sum"
) -> torch.Tensor:
    """KL(N(f, I) || N(f_ref, I)) averaged over each token's active draws: [D, b, l, C] -> [b, l]."""
    diff = (_acc(prediction) - _acc(ref_prediction)).pow(2)
    return 0.5 * _mean_over_active(_reduce_channels(diff, channel_reduction), active)


def draw_counts(num_draws: int, mte_ratio: float) -> tuple[int, int]:
    """(draws of every token, extra draws of an uncertain one) under the multi-trajectory expectation,
    at the cost of num_draws per token when a share mte_ratio of the tokens is uncertain: half the
    draws (at least 1) for every token, the rest of the budget spread over the uncertain ones."""
    base = max(1, num_draws // 2)
    return base, int((num_draws - base) / mte_ratio)


@dataclass
class MatchingUpdate:
    """What one GRPO update under the matching estimator scores against, over the whole rollout:
    the draws, token weights [B, L_m] (normalised over the batch), uniform KL weights [B, L_m], the
    old scores [B, L_m] (None: taken from the first evaluation, which precedes every optimizer step)
    and the reference's predictions [D, B, L_m, C] (None without a KL term)."""

    draws: MatchingDraws
    weights: torch.Tensor
    kl_weights: torch.Tensor
    old_score: torch.Tensor | None
    ref_prediction: torch.Tensor | None
    uncertain: torch.Tensor | None = None  # bool [B, L_m]: the tokens given more draws (MTE), else None


def prepare_matching(policy, ref_context, rollout: Rollout, config, batches, samples, scoring) -> MatchingUpdate:
    """The draws, weights, old scores (when an optimizer step precedes some chunk's first evaluation:
    several minibatches or epochs; scored in the policy's current mode, the rollout's) and ref policy
    predictions (ref_context: yields the ref policy, None without a KL term) of one update;
    leaves the policy in training mode. `scoring(model, rollout, draws, steps)` evaluates
    matching_values as the update does (autocast, guidance)."""
    uncertain_scored = None
    if config.mte:  # more draws for the most uncertain tokens, at the uniform budget's cost
        base, extra = draw_counts(config.matching_draws, config.mte_ratio)
        draws = draw_matching(rollout, base + extra, tuple(config.matching_times))
        uncertain = mte_mask(rollout.seed_tokens, config.mte_ratio, k_rule=config.mte_k, random_positions=config.mte_random_positions)[
            ..., 0
        ]  # [B, N]
        active, picked = [], []
        for j in range(rollout.plan.num_mask_steps):
            start = rollout.slots[j].start
            picked.append(uncertain.gather(1, rollout.order[:, start : start + rollout.slots[j].revealed]))  # [B, n_j]
            every = torch.ones(base, *picked[-1].shape, dtype=torch.bool, device=uncertain.device)
            active.append(torch.cat([every, picked[-1][None].expand(extra, -1, -1)]))
        draws = draws.with_active(active)
        uncertain_scored = torch.cat(picked, 1)
    else:
        draws = draw_matching(rollout, config.matching_draws, tuple(config.matching_times))
    keep = torch.ones(
        rollout.batch_size,
        sum(slot.revealed for slot in rollout.slots),
        dtype=torch.bool,
        device=rollout.tokens.device,
    )
    if samples is not None:
        keep &= samples.to(keep.device)[:, None]
    dtype = rollout.tokens.dtype
    weights = grouped_token_weights(keep, config.aggregation, dtype)
    kl_weights = grouped_token_weights(torch.ones_like(keep), "token_mean", dtype)
    old = None
    if config.objective == "clip" and (len(batches) > 1 or config.inner_epochs > 1):
        old = torch.zeros(keep.shape, dtype=torch.float64 if dtype == torch.float64 else torch.float32, device=keep.device)
        with torch.no_grad():
            for minibatch in batches:
                for images, steps in minibatch:
                    part = rollout.select(images)
                    score = matching_score(scoring(policy, part, draws.select(images), steps), config.channel_reduction)
                    _put(old, images, committed_columns(rollout, steps), score)
    policy.train()  # the update trains in training mode; the ref policy runs in the same mode
    ref = None
    if ref_context is not None:
        with torch.no_grad(), ref_context as model:
            model.train(policy.training)
            ref = scoring(model, rollout, draws, None).prediction.detach()
    return MatchingUpdate(draws, weights, kl_weights, old, ref, uncertain_scored)


def _put(values: torch.Tensor, images: Sequence[int], cols, part: torch.Tensor) -> None:
    rows = torch.tensor(list(images), dtype=torch.long, device=values.device)
    if isinstance(cols, slice):
        values[rows] = part.to(values.dtype)
    else:
        values[rows[:, None], cols[None]] = part.to(values.dtype)


def _take(values: torch.Tensor, images: Sequence[int], cols, axis: int = 0) -> torch.Tensor:
    rows = torch.tensor(list(images), dtype=torch.long, device=values.device)
    picked = values.index_select(axis, rows)
    return picked[(slice(None),) * (axis + 1) + (cols,)]


def matching_chunk_loss(
    policy, rollout: Rollout, prepared: MatchingUpdate, advantages: torch.Tensor, images: Sequence[int], steps, config, scoring
):
    """The loss of one chunk (images x recorded mask steps) under the policy, with gradient."""
    values = scoring(policy, rollout.select(images), prepared.draws.select(images), steps)
    score = matching_score(values, config.channel_reduction)
    cols = committed_columns(rollout, steps)
    if prepared.old_score is None or config.objective == "reinforce":
        old = score.detach()  # no optimizer step yet in this update (or no ratio): the policy is the old one
    else:
        old = _take(prepared.old_score, images, cols)
    rows = torch.tensor(list(images), dtype=torch.long, device=advantages.device)
    out = ops.grpo_surrogate(
        score[None],
        old[None],
        advantages.index_select(0, rows),
        _take(prepared.weights, images, cols),
        clip_eps=config.clip_eps,
        clip_eps_high=config.clip_eps_high,
        aggregation="sum",
        check_finite=False,  # policy_update.update checked the advantages once
    )
    kl = score.new_zeros(())
    if prepared.ref_prediction is not None:
        ref = _take(prepared.ref_prediction, images, cols, axis=1)
        kl = (matching_kl(values.prediction, ref, values.active, config.channel_reduction) * _take(prepared.kl_weights, images, cols)).sum()
    beta = config.kl_beta if prepared.ref_prediction is not None else 0.0
    return ChunkLoss(
        out.loss + beta * kl,
        out.loss.detach(),
        kl.detach(),
        out.clip_fraction.detach(),
        out.approx_kl.detach(),
        out.ratio_mean.detach(),
        out.ratio_max.detach(),
    )

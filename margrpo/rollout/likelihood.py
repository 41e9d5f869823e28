"""rollout_logprob(): the training likelihood of a rollout's recorded transitions under the current
backbone, with gradient to the backbone's parameters through the frozen diffusion head.

For each recorded mask step the backbone recomputes z from the canvas and known mask of the step's
training forward (Rollout.canvas_known: before the step by default, so the step's own tokens get
gradient; after it with the post-step known mask), the head re-evaluates the recorded diffusion
transitions of all T = 1 + K trajectories under that z (margrpo.heads.transitions_logprob), and the
sampler's Gaussian gives their log-probabilities. Called with the rollout's own policy this reproduces the recorded
log-probs (ratio 1: exact in float64, to rounding in float32), which an on-policy PPO/GRPO step
relies on.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from margrpo.heads import transitions_logprob
from margrpo.models.base import check_backbone

from .guidance import condition_at, forward_rows, guidance_for, head_condition, prompt_rows
from .record import Rollout

LIKELIHOOD_CFG = ("rollout", "none")


@dataclass
class RolloutLikelihood:
    """In the rollout's layout (margrpo.rollout.record), L covering the requested steps: logp fp32
    [T, B, L]; mean fp32 [T, B, L, C] of the policy's transitions (for a Gaussian KL against a
    reference model; the std of a fixed-variance sampler is the recorded one, a learned-range
    variance depends on z and is not returned); mask bool [B, L]: True where the transition's token
    was committed at its mask step (all True in "revealed" mode, all False with the post-step known
    mask; in "unknown" mode the others are candidates for consistency-aware selection)."""

    logp: torch.Tensor
    mean: torch.Tensor
    mask: torch.Tensor


def true_indices(masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """The indices where each 1-d bool mask is True, with one host read for all of them together
    (their counts; torch.nonzero_static then needs no second read)."""
    if not masks:
        return []
    counts = torch.stack([m.sum() for m in masks]).tolist()
    flat = torch.nonzero_static(torch.cat(masks), size=sum(counts)).squeeze(1)
    offsets = itertools.accumulate((m.numel() for m in masks), initial=0)
    return [rows - offset for rows, offset in zip(flat.split(counts), offsets)]


def _seeds_where_selected(score, z_rows, x_t, x_prev, selected, rows, recorded):
    """(logp [T, B, R, P], mean [T, B, R, P, C]) of one recorded step: trajectory 0 scored at every
    position, the K seeds only at the tokens `rows` (one head call on those rows), the recorded values
    where `selected` [B, R, P] is False; recorded: the rollout's logp and mean of the step."""
    B, R, P = x_t.shape[1:4]
    logp, mean = score(z_rows, x_t=x_t[:1], x_prev=x_prev[:1])
    seed_logp, seed_mean = (values[1:].detach().to(like.dtype) for values, like in zip(recorded, (logp, mean)))
    if rows.numel():
        z_seeds = condition_at(z_rows, rows, B * P)

        def seed_rows(values):  # [T, B, R, P, ...] -> the seeds' [K, R, n, ...] at the chosen tokens
            return values[1:].transpose(1, 2).flatten(2, 3)[:, :, rows]

        s_logp, s_mean = score(z_seeds, x_t=seed_rows(x_t), x_prev=seed_rows(x_prev))
        scored_logp = seed_logp.transpose(1, 2).flatten(2, 3).index_copy(2, rows, s_logp).unflatten(2, (B, P)).transpose(1, 2)
        scored_mean = seed_mean.transpose(1, 2).flatten(2, 3).index_copy(2, rows, s_mean).unflatten(2, (B, P)).transpose(1, 2)
        seed_logp = torch.where(selected, scored_logp, seed_logp)
        seed_mean = torch.where(selected[..., None], scored_mean, seed_mean)
    return torch.cat([logp, seed_logp]), torch.cat([mean, seed_mean])


def rollout_logprob(
    backbone,
    rollout: Rollout,
    *,
    cfg: str = "rollout",
    steps: Sequence[int] | None = None,
    seed_positions: torch.Tensor | None = None,
) -> RolloutLikelihood:
    """Log-probs of `rollout`'s recorded transitions under `backbone`'s current parameters.

    cfg: "rollout" (default: the guidance the samples were drawn with, same scale per step, same
    channels; the likelihood of the actual sampling policy) or "none" (conditional branch only, as
    the reference code trains). steps: recorded mask-step indices j to evaluate (default all, in
    order); the L axis of the result is the concatenation of their `rollout.l_slice(j)`, so a
    trainer can backpropagate one mask step at a time. Ratio 1 on-policy needs the backbone in the
    same mode as in the rollout (eval: no dropout). seed_positions: bool [B, L] (the result's L),
    where the K seed trajectories are scored; elsewhere only trajectory 0 is, and the seeds' entries
    hold the rollout's recorded log-probs and means, without gradient (the MTE positions of a loss that
    reads the seeds nowhere else: about a third of the head's work), at the cost of one host read per
    call (how many tokens that is per step). None: every trajectory everywhere.
    """
    check_backbone(backbone)
    if cfg not in LIKELIHOOD_CFG:
        raise ValueError(f"cfg: got {cfg!r}, expected one of {', '.join(LIKELIHOOD_CFG)}")
    M = rollout.plan.num_mask_steps
    steps = list(range(M)) if steps is None else list(steps)
    bad = [j for j in steps if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < M]
    if bad:
        raise ValueError(f"steps: got {bad}, expected recorded mask-step indices in [0, {M})")
    guided = rollout.config.uses_cfg and cfg == "rollout"
    rows = prompt_rows(backbone, rollout.prompts, rollout.config, guided=guided)
    B, R = rollout.batch_size, rollout.plan.num_diffusion_steps
    committed = rollout.l_committed()
    L = R * sum(rollout.slots[j].count for j in steps)
    if seed_positions is not None and (seed_positions.dtype != torch.bool or seed_positions.shape != (B, L)):
        raise ValueError(
            f"seed_positions: got {seed_positions.dtype} {tuple(seed_positions.shape)}, expected bool [{B}, {L}] (B, L of the steps)"
        )
    selections = seed_rows = None
    if seed_positions is not None and rollout.num_trajectories > 1 and steps:
        widths = [R * rollout.slots[j].count for j in steps]
        selections = [part.unflatten(1, (R, -1)) for part in seed_positions.split(widths, 1)]
        # per step, the tokens (image-major rows b * P + p) with a selected transition
        seed_rows = true_indices([mask.any(1).reshape(-1) for mask in selections])
    logps, means, masks = [], [], []
    for i, j in enumerate(steps):
        canvas, known = rollout.canvas_known(j)
        positions = rollout.positions(j)
        slot = rollout.slots[j]
        z = forward_rows(backbone, rows, canvas, known, slot.known)
        z_rows = head_condition(z, rows, positions)
        part = slot.columns
        # the step's part of L is its [R, P_j] transitions: the head reads it as a [T, B, R, P_j, C] view
        x_t, x_prev = (values[:, :, part].unflatten(2, (R, positions.shape[1])) for values in (rollout.x_t, rollout.x_prev))
        score = functools.partial(
            transitions_logprob,
            backbone.head,
            sampler=rollout.sampler,
            steps=rollout.plan.diffusion_steps[j],
            cfg=guidance_for(rollout.config, rollout.cfg_scales[j], guided=guided),
            temperature=rollout.config.temperature,
            return_mean=True,
        )
        if seed_rows is None:
            logp, mean = score(z_rows, x_t=x_t, x_prev=x_prev)
        else:
            recorded = [values[:, :, part].unflatten(2, (R, positions.shape[1])) for values in (rollout.logp, rollout.mean)]
            logp, mean = _seeds_where_selected(score, z_rows, x_t, x_prev, selections[i], seed_rows[i], recorded)
        logps.append(logp.flatten(2, 3))
        means.append(mean.flatten(2, 3))
        masks.append(committed[part].expand(B, -1))
    if not steps:
        T, C, empty = rollout.num_trajectories, rollout.tokens.shape[-1], rollout.tokens.new_zeros
        no_mask = torch.zeros(B, 0, dtype=torch.bool, device=rollout.tokens.device)
        return RolloutLikelihood(empty(T, B, 0), empty(T, B, 0, C), no_mask)
    return RolloutLikelihood(torch.cat(logps, 2), torch.cat(means, 2), torch.cat(masks, 1))

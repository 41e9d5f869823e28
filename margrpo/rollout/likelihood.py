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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from margrpo.heads import transitions_logprob
from margrpo.models.base import check_backbone

from .guidance import forward_rows, guidance_for, head_condition, prompt_rows
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


def rollout_logprob(
    backbone,
    rollout: Rollout,
    *,
    cfg: str = "rollout",
    steps: Sequence[int] | None = None,
) -> RolloutLikelihood:
    """Log-probs of `rollout`'s recorded transitions under `backbone`'s current parameters.

    cfg: "rollout" (default: the guidance the samples were drawn with, same scale per step, same
    channels; the likelihood of the actual sampling policy) or "none" (conditional branch only, as
    the reference code trains). steps: recorded mask-step indices j to evaluate (default all, in
    order); the L axis of the result is the concatenation of their `rollout.l_slice(j)`, so a
    trainer can backpropagate one mask step at a time. Ratio 1 on-policy needs the backbone in the
    same mode as in the rollout (eval: no dropout).
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
    logps, means, masks = [], [], []
    for j in steps:
        canvas, known = rollout.canvas_known(j)
        positions = rollout.positions(j)
        slot = rollout.slots[j]
        z = forward_rows(backbone, rows, canvas, known, slot.known)
        z_rows = head_condition(z, rows, positions)
        part = slot.columns
        # the step's part of L is its [R, P_j] transitions: the head reads it as a [T, B, R, P_j, C] view
        x_t, x_prev = (values[:, :, part].unflatten(2, (R, positions.shape[1])) for values in (rollout.x_t, rollout.x_prev))
        logp, mean = transitions_logprob(
            backbone.head,
            z_rows,
            rollout.sampler,
            rollout.plan.diffusion_steps[j],
            x_t,
            x_prev,
            cfg=guidance_for(rollout.config, rollout.cfg_scales[j], guided=guided),
            temperature=rollout.config.temperature,
            return_mean=True,
        )
        logps.append(logp.flatten(2, 3))
        means.append(mean.flatten(2, 3))
        masks.append(committed[part].expand(B, -1))
    if not steps:
        T, C, empty = rollout.num_trajectories, rollout.tokens.shape[-1], rollout.tokens.new_zeros
        no_mask = torch.zeros(B, 0, dtype=torch.bool, device=rollout.tokens.device)
        return RolloutLikelihood(empty(T, B, 0), empty(T, B, 0, C), no_mask)
    return RolloutLikelihood(torch.cat(logps, 2), torch.cat(means, 2), torch.cat(masks, 1))

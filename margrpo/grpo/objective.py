"""The MAR-GRPO loss of one chunk of recorded transitions: clipped policy term + beta * KL.

Token weights are normalised once over the whole batch (margrpo.ops.token_weights) and sliced per
chunk, and the loss of a chunk is the plain weighted sum of its terms, so a trainer may evaluate the
loss chunk by chunk (images or mask steps) and the chunk losses add up to the loss of the whole
batch, for either aggregation. With `groups` (one id per optimizer update) the weights are
normalised within each update instead (the reference code's per-mask-step normalisation).

A policy-term position is a token, or one of its P latent pixels (`position_logp`); the KL stays per
token. channel_reduction "sum" scores a transition by its token's log-likelihood (summed over
channels), "mean" by the mean over its channels (the NOVA reference's element mean); the KL is
reduced the same way, so beta weighs the two terms alike under either. A pixel's log-prob is scaled
to its token's (x P under "sum", / (C / P) channels under "mean"), so with every position kept
the loss does not depend on P; P only changes which parts of a token the selection keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo import ops

from .kl import CHANNEL_REDUCTIONS, kl_penalty
from .selection import split_pixels


def position_logp(x_prev: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, pixels_per_token: int = 1) -> torch.Tensor:
    """Gaussian log-probs of transitions per policy-term position: x_prev, mean, std [T, B, L, C]
    -> [T, B, L * P], each of a token's P pixels summing its C / P channels (P = 1: the token's
    log-prob). Differentiable in mean and std."""
    x_prev, mean, std = (split_pixels(v, pixels_per_token) for v in (x_prev, mean, std.expand_as(x_prev)))
    # std <= 0 is an error on the CPU; on a GPU the update stays sync-free (NaN there, caught as a non-finite loss)
    return ops.gaussian_logprob(x_prev, mean, std, reduce="sum", check_std=x_prev.device.type == "cpu")


def grouped_token_weights(keep: torch.Tensor, aggregation: str, dtype: torch.dtype, groups: torch.Tensor | None = None) -> torch.Tensor:
    """ops.token_weights of keep [B, L] over the whole batch, or, with groups (int [B, L], one id per
    optimizer update), within every group separately (each group that keeps anything sums to 1)."""
    if groups is None:
        return ops.token_weights(keep, aggregation, dtype)
    if groups.shape != keep.shape:
        raise ValueError(f"groups: got shape {tuple(groups.shape)}, expected {tuple(keep.shape)} like keep")
    return sum(ops.token_weights(keep * (groups == g), aggregation, dtype) for g in torch.unique(groups).tolist())


@dataclass
class ChunkLoss:
    loss: torch.Tensor  # differentiable: policy + beta * kl, this chunk's share of the batch loss
    policy: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor


def chunk_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    mte_mask: torch.Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
    kl_beta: float = 0.0,
    kl_type: str = "gaussian",
    kl_weights: torch.Tensor | None = None,
    mean: torch.Tensor | None = None,
    ref_mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    mte_include_rollout: bool = True,
    channel_reduction: str = "sum",
    pixels_per_token: int = 1,
) -> ChunkLoss:
    """logp/old_logp [T, B, L * P] (summed over each position's channels, `position_logp`; P = 1:
    per token); advantages [B]; weights, mte_mask [B, L * P] (a slice of token weights normalised
    over the batch or the update); KL per token on trajectory 0 with mean/ref_mean/std [T, B, L, C],
    ref_logp [T, B, L] and kl_weights [B, L] (a slice of uniform weights summing to 1 over the batch
    or the update). The statistics are this chunk's shares, so they too add up over chunks.

    On MTE positions the policy term averages all T trajectories (mte_include_rollout) or only the
    K seeds, the rollout's own trajectory weighing 0 there (the reference code)."""
    if channel_reduction not in CHANNEL_REDUCTIONS:
        raise ValueError(f"channel_reduction: got {channel_reduction!r}, expected one of {', '.join(CHANNEL_REDUCTIONS)}")
    token_scale = 1.0  # a token's log-prob summed over channels -> the reduction's
    if channel_reduction == "mean":
        if mean is None:
            raise ValueError("mean: channel_reduction 'mean' needs the transitions' means [T, B, L, C] (got None)")
        token_scale = 1.0 / mean.shape[-1]
    T, B = logp.shape[:2]
    token_logp = logp.reshape(T, B, -1, pixels_per_token).sum(-1) * token_scale
    scale = token_scale * pixels_per_token  # a pixel's log-prob -> its token's scale (see the module docstring)
    if scale != 1.0:
        logp, old_logp = logp * scale, old_logp * scale
    parts = [(logp, old_logp, weights, mte_mask)]
    if mte_mask is not None and not mte_include_rollout:
        parts = [
            (logp[:1], old_logp[:1], weights * ~mte_mask, None),
            (logp[1:], old_logp[1:], weights * mte_mask, torch.ones_like(mte_mask)),
        ]
    outs = [
        ops.grpo_surrogate(
            part_logp,
            part_old,
            advantages,
            part_weights,
            clip_eps=clip_eps,
            clip_eps_high=clip_eps_high,
            mte_mask=part_mte,
            aggregation="sum",
            check_finite=False,  # the caller checks the advantages once (policy_update.update)
        )
        for part_logp, part_old, part_weights, part_mte in parts
    ]
    policy = sum(out.loss for out in outs)
    kl = logp.new_zeros(())
    if kl_beta > 0:
        per_transition = kl_penalty(
            kl_type,
            mean=None if mean is None else mean[0],
            ref_mean=None if ref_mean is None else ref_mean[0],
            std=None if std is None else std[0],
            logp=token_logp[0],
            ref_logp=None if ref_logp is None else ref_logp[0] * token_scale,
            channel_reduction=channel_reduction,
        )
        kl = (per_transition * kl_weights).sum()
    stats = torch.stack([out.stats for out in outs]).detach()  # [parts, 4]: ops.STATISTICS per part
    clip_fraction, approx_kl, ratio_mean = stats[:, :3].sum(0).unbind()
    return ChunkLoss(policy + kl_beta * kl, policy.detach(), kl.detach(), clip_fraction, approx_kl, ratio_mean, stats[:, 3].max())

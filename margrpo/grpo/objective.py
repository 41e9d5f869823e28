"""The MAR-GRPO loss of one chunk of recorded transitions: clipped policy term + beta * KL.

Token weights are normalised once over the whole batch (`token_weights`), so a trainer may evaluate
the loss chunk by chunk (images or mask steps) and the sum of the chunk losses equals the loss of the
whole batch, for either aggregation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo import ops

from .kl import kl_penalty


def token_weights(keep: torch.Tensor, aggregation: str = "token_mean") -> torch.Tensor:
    """keep [B, L] bool/float -> float weights [B, L] that sum to 1 over the batch.

    token_mean: every kept transition weighs the same; sample_mean: each sample with any kept
    transition weighs the same, split evenly over its kept transitions.
    """
    keep = keep.float()
    if aggregation == "token_mean":
        total = keep.sum()
        return keep / total if total > 0 else keep
    if aggregation == "sample_mean":
        per_sample = keep.sum(1, keepdim=True)
        samples = (per_sample > 0).sum()
        return torch.where(per_sample > 0, keep / per_sample.clamp_min(1), keep) / samples.clamp_min(1)
    raise ValueError(f"aggregation: got {aggregation!r}, expected 'token_mean' or 'sample_mean'")


@dataclass
class ChunkLoss:
    loss: torch.Tensor  # differentiable: policy + beta * kl, already scaled by this chunk's weight share
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
) -> ChunkLoss:
    """logp/old_logp [T, B, L]; advantages [B]; weights [B, L] (a slice of `token_weights`); KL on
    trajectory 0 with kl_weights [B, L] (a slice of uniform weights summing to 1 over the batch)."""
    share = weights.sum()
    zero = logp.sum() * 0.0
    if share > 0:
        out = ops.grpo_surrogate(
            logp, old_logp, advantages, weights, clip_eps=clip_eps, clip_eps_high=clip_eps_high,
            mte_mask=mte_mask, aggregation="token_mean",
        )
        policy = out.loss * share
        stats = [s.detach() * share for s in (out.clip_fraction, out.approx_kl, out.ratio_mean)]
        ratio_max = out.ratio_max.detach()
    else:
        policy, stats, ratio_max = zero, [zero.detach()] * 3, torch.ones(()).to(logp)
    kl = zero
    if kl_beta > 0:
        per_transition = kl_penalty(
            kl_type, mean=None if mean is None else mean[0], ref_mean=None if ref_mean is None else ref_mean[0],
            std=None if std is None else std[0], logp=logp[0], ref_logp=None if ref_logp is None else ref_logp[0],
        )
        kl = (per_transition * kl_weights).sum()
    return ChunkLoss(policy + kl_beta * kl, policy.detach(), kl.detach(), *stats, ratio_max)

"""The MAR-GRPO loss of one chunk of recorded transitions: clipped policy term + beta * KL.

Token weights are normalised once over the whole batch (margrpo.ops.token_weights) and sliced per
chunk, and the loss of a chunk is the plain weighted sum of its terms, so a trainer may evaluate the
loss chunk by chunk (images or mask steps) and the chunk losses add up to the loss of the whole
batch, for either aggregation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo import ops

from .kl import kl_penalty


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
) -> ChunkLoss:
    """logp/old_logp [T, B, L]; advantages [B]; weights [B, L] (a slice of token weights normalised
    over the batch); KL on trajectory 0 with kl_weights [B, L] (a slice of uniform weights summing to
    1 over the batch). The statistics are this chunk's shares, so they too add up over chunks."""
    out = ops.grpo_surrogate(
        logp, old_logp, advantages, weights, clip_eps=clip_eps, clip_eps_high=clip_eps_high,
        mte_mask=mte_mask, aggregation="sum",
    )
    kl = logp.new_zeros(())
    if kl_beta > 0:
        per_transition = kl_penalty(
            kl_type, mean=None if mean is None else mean[0], ref_mean=None if ref_mean is None else ref_mean[0],
            std=None if std is None else std[0], logp=logp[0], ref_logp=None if ref_logp is None else ref_logp[0],
        )
        kl = (per_transition * kl_weights).sum()
    stats = (s.detach() for s in (out.clip_fraction, out.approx_kl, out.ratio_mean, out.ratio_max))
    return ChunkLoss(out.loss + kl_beta * kl, out.loss.detach(), kl.detach(), *stats)

"""MAR-GRPO token selection: which tokens get the multi-trajectory expectation (uncertainty top-k) and
which enter the policy term at a mask step (consistency-aware selection). docs/METHOD.md section 4."""
from __future__ import annotations

import torch

from margrpo import ops


def uncertainty(seed_final: torch.Tensor, pixels_per_token: int = 1) -> torch.Tensor:
    """Per-position uncertainty: std over the K seed trajectories of the final clean latent, averaged
    over channels. seed_final [K, B, N, C] -> [B, N * pixels_per_token].

    pixels_per_token > 1 ranks latent pixels instead of tokens (the NOVA reference code ranks the
    4096 latent pixels of 1024 tokens): a token's C channels are split into P pixels of C/P channels.
    """
    if seed_final.ndim != 4:
        raise ValueError(f"seed_final: expected [K, B, N, C], got shape {tuple(seed_final.shape)}")
    K, B, N, C = seed_final.shape
    if C % pixels_per_token:
        raise ValueError(f"pixels_per_token: {pixels_per_token} does not divide the {C} channels of a token")
    per_pixel = seed_final.reshape(K, B, N * pixels_per_token, C // pixels_per_token)
    return ops.trajectory_std(per_pixel)


def mte_token_mask(seed_final: torch.Tensor, ratio: float, pixels_per_token: int = 1) -> torch.Tensor:
    """bool [B, N]: the floor(ratio * positions) most uncertain positions per image; with pixel ranking
    a token is selected when any of its pixels is."""
    scores = uncertainty(seed_final, pixels_per_token)
    # no NaN check (a host sync per GRPO step): NaN scores come only from NaN samples, which make the
    # loss NaN and are caught there
    selected = ops.topk_mask(scores, ratio=ratio, check_finite=False)
    B, N = seed_final.shape[1], seed_final.shape[2]
    return selected.view(B, N, pixels_per_token).any(-1)


def consistency_keep(
    prev_pred: torch.Tensor,
    cur_pred: torch.Tensor,
    final: torch.Tensor,
    committed: torch.Tensor,
    threshold: float = 0.0,
) -> torch.Tensor:
    """bool [B, N]: keep a position in the policy term when this mask step's predicted clean latent moved
    toward the final one (cos(cur, final) - cos(prev, final) > threshold); tokens committed at this
    step are always kept."""
    if committed.shape != cur_pred.shape[:-1]:
        raise ValueError(f"committed: expected shape {tuple(cur_pred.shape[:-1])}, got {tuple(committed.shape)}")
    return ops.consistency_mask(prev_pred, cur_pred, final, threshold=threshold) | committed.bool()

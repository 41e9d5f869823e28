"""MAR-GRPO token selection: which positions get the multi-trajectory expectation (uncertainty top-k)
and which enter the policy term at a mask step (consistency-aware selection).

A position is a token, or with pixels_per_token = P > 1 one of the P latent pixels a token packs
(NOVA: a 16-channel token is a 2x2 patch of 4-channel latent pixels, pixel-major, channels
innermost), so the selection can work per latent pixel as the NOVA reference code does. Masks come
out as [B, N, P] (P = 1 for tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from margrpo import ops

MTE_K_RULES = ("floor", "reference")


def split_pixels(values: torch.Tensor, pixels_per_token: int) -> torch.Tensor:
    """[..., N, C] -> [..., N * P, C / P]: each token's channels as P pixels of C / P channels."""
    C = values.shape[-1]
    if pixels_per_token < 1 or C % pixels_per_token:
        raise ValueError(f"pixels_per_token: got {pixels_per_token}, expected a divisor of the {C} channels of a token")
    return values.reshape(*values.shape[:-2], values.shape[-2] * pixels_per_token, C // pixels_per_token)


def uncertainty(seed_final: torch.Tensor, pixels_per_token: int = 1) -> torch.Tensor:
    """Per-position uncertainty: std over the K seed trajectories of the final clean latent, averaged
    over the position's channels. seed_final [K, B, N, C] -> [B, N * pixels_per_token]."""
    if seed_final.ndim != 4:
        raise ValueError(f"seed_final: expected [K, B, N, C], got shape {tuple(seed_final.shape)}")
    return ops.trajectory_std(split_pixels(seed_final, pixels_per_token))


def reference_mte_count(ratio: float, positions: int) -> int:
    """The reference code's number of MTE positions per image: max(1, int(ratio * positions)) (at
    least one, and no guard against ratio * positions landing just below an integer)."""
    return min(positions, max(1, int(positions * ratio)))


def mte_mask(
    seed_final: torch.Tensor,
    ratio: float,
    pixels_per_token: int = 1,
    *,
    k_rule: str = "floor",
    random_positions: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """bool [B, N, P]: the most uncertain positions of every image, OR'd with `random_positions`
    positions drawn uniformly (the NOVA reference adds one; it may coincide with a top-k one).
    k_rule "floor": floor(ratio * positions) of them (ops.topk_mask); "reference": the reference
    code's count (reference_mte_count)."""
    scores = uncertainty(seed_final, pixels_per_token)
    # no NaN check (a host sync per GRPO step): NaN scores come only from NaN samples, which make the
    # loss NaN and are caught there
    B, positions = scores.shape
    if k_rule == "floor":
        selected = ops.topk_mask(scores, ratio=ratio, check_finite=False)
    elif k_rule == "reference":
        selected = ops.topk_mask(scores, k=reference_mte_count(ratio, positions))
    else:
        raise ValueError(f"k_rule: got {k_rule!r}, expected one of {', '.join(MTE_K_RULES)}")
    if random_positions < 0 or random_positions > positions:
        raise ValueError(f"random_positions: got {random_positions}, expected an int in [0, {positions}]")
    if random_positions:
        draws = torch.rand(B, positions, generator=generator, device=scores.device)  # generator: on that device
        selected = selected | ops.topk_mask(draws, k=random_positions)
    return selected.view(B, seed_final.shape[2], pixels_per_token)


def mte_tokens(config) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The tokens a GRPO update with `config` (a GRPOConfig) reads the seed trajectories at, as a
    function of the seed tokens [K, B, N, C] -> bool [B, N]: generate's seed_selection, so that the
    rollout draws the seeds' transitions past the committed tokens there alone. None when MTE is off
    or adds random positions (the update draws those itself, so they are not known before it)."""
    if not config.mte or config.mte_random_positions:
        return None

    def tokens(seed_tokens: torch.Tensor) -> torch.Tensor:
        return mte_mask(seed_tokens, config.mte_ratio, config.pixels_per_token, k_rule=config.mte_k).any(-1)

    return tokens


def consistency_keep(
    prev_pred: torch.Tensor,
    cur_pred: torch.Tensor,
    final: torch.Tensor,
    committed: torch.Tensor,
    threshold: float = 0.0,
    pixels_per_token: int = 1,
) -> torch.Tensor:
    """bool [B, N, P]: keep a position in the policy term when this mask step's predicted clean latent
    moved toward the final one (cos(cur, final) - cos(prev, final) > threshold, the cosine over the
    position's channels); every position of a token committed at this step is always kept."""
    if committed.shape != cur_pred.shape[:-1]:
        raise ValueError(f"committed: expected shape {tuple(cur_pred.shape[:-1])}, got {tuple(committed.shape)}")
    prev, cur, fin = (split_pixels(v, pixels_per_token) for v in (prev_pred, cur_pred, final))
    moved = ops.consistency_mask(prev, cur, fin, threshold=threshold).view(*committed.shape, pixels_per_token)
    return moved | committed.bool()[..., None]

"""Mask schedules of MAR generation: how many tokens each of the S mask steps reveals.

Both variants follow a cosine curve of the fraction of tokens still masked, cos(pi/2 * progress);
they differ in rounding and in how they guarantee progress (docs/METHOD.md section 1):

- "nova" (baaivision/NOVA): masked_k = round(N cos(pi/2 k/S)) for k = 0..S and step i reveals
  masked_i - masked_{i+1}. For N >> S the first difference rounds to 0, so only S - 1 steps are
  effective (NOVA skips steps that reveal nothing). Rounding is numpy's (half to even), as upstream.
- "harmon" (wusize/Harmon, MaskGIT/MAR style): after step s < S - 1 the number still masked is
  floor(N cos(pi/2 (s+1)/S)) clamped to [1, masked_before - 1], so every step reveals at least one
  token while one remains; the last step reveals all that remain.

Steps that reveal nothing (possible when N < S) are "ineffective": the rollout skips them and never
records them.
"""

from __future__ import annotations

import math

import numpy as np

SCHEDULES = ("nova", "harmon")


def _check(num_tokens: int, num_steps: int) -> None:
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens: got {num_tokens!r}, expected an integer >= 1")
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_mask_steps: got {num_steps!r}, expected an integer >= 1")


def nova_schedule(num_tokens: int, num_steps: int) -> list[int]:
    """Tokens revealed per step, NOVA variant: differences of round(N cos(pi/2 k/S)), k = 0..S."""
    _check(num_tokens, num_steps)
    masked = np.round(np.cos(0.5 * np.pi * np.arange(num_steps + 1) / num_steps) * num_tokens).astype(np.int64)
    return [int(d) for d in masked[:-1] - masked[1:]]


def harmon_schedule(num_tokens: int, num_steps: int) -> list[int]:
    """Tokens revealed per step, Harmon variant: floor(N cos(pi/2 (s+1)/S)) still masked after step s,
    clamped so each step reveals >= 1 while tokens remain; the last step reveals the rest."""
    _check(num_tokens, num_steps)
    counts, masked = [], num_tokens
    for step in range(num_steps):
        if step == num_steps - 1:
            still_masked = 0
        else:
            still_masked = int(np.floor(num_tokens * np.cos(math.pi / 2.0 * (step + 1) / num_steps)))
            still_masked = max(1, min(masked - 1, still_masked))
        counts.append(masked - still_masked)
        masked = still_masked
    return counts


def mask_schedule(num_tokens: int, num_steps: int, kind: str = "nova") -> list[int]:
    """Tokens revealed at each of the `num_steps` mask steps (sums to `num_tokens`); kind in SCHEDULES."""
    if kind == "nova":
        return nova_schedule(num_tokens, num_steps)
    if kind == "harmon":
        return harmon_schedule(num_tokens, num_steps)
    raise ValueError(f"schedule: got {kind!r}, expected one of {', '.join(SCHEDULES)}")


def effective_steps(counts: list[int]) -> list[int]:
    """Indices of the steps that reveal at least one token."""
    return [step for step, count in enumerate(counts) if count > 0]

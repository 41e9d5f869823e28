"""Paired differences between two evaluations of the same prompts, with a percentile-bootstrap interval.

The unit resampled is the prompt: images of one prompt share it and are not independent, so each
prompt contributes the mean difference over its samples, and the interval is that of the mean over
prompts under resampling of prompts with replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PairedDifference:
    """after - before: the mean over prompts, its bootstrap interval at `level`, and the prompts used."""

    mean: float
    low: float
    high: float
    prompts: int
    level: float


def paired_difference(
    before: Sequence[float], after: Sequence[float], resamples: int = 10000, level: float = 0.95, seed: int = 0
) -> PairedDifference:
    """Mean of after[i] - before[i] over prompts i and its percentile-bootstrap interval (fixed seed, so a
    report is reproducible). One prompt gives a zero-width interval."""
    if len(before) != len(after):
        raise ValueError(f"after: got {len(after)} values for {len(before)} before, expected one per prompt")
    if not before:
        raise ValueError("before: got no values, expected at least one prompt")
    if not 0 < level < 1:
        raise ValueError(f"level: got {level}, expected a number in (0, 1)")
    diff = torch.tensor(after, dtype=torch.float64) - torch.tensor(before, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(len(diff), (resamples, len(diff)), generator=generator)
    means = diff[index].mean(dim=1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return PairedDifference(float(diff.mean()), low, high, len(diff), level)

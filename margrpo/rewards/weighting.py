"""A weighted sum of rewards, with optional per-reward normalization and values to log.

Config form: `{hps: 1.0, shapes: 0.5}` or, with options, `{hps: {weight: 1.0, device: "cuda:1"},
shapes_color: {reward: shapes, category: color, weight: 0.5, normalize: batch}}`. The key names the
term (and the reward, unless `reward` says otherwise); every other key is an option of the reward.

Normalization of each reward's raw scores before weighting:
  none     raw scores (default);
  batch    z-score over the batch (a batch of one gives zeros);
  running  z-score with exponential moving averages of mean and variance across calls, so a
           reward's scale is tracked even when one batch is small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import Metadata, Reward
from .registry import build_reward

NORMALIZATIONS = ("none", "batch", "running")


@dataclass
class RunningStats:
    """Exponential moving mean and variance of a stream of batches (initialised by the first)."""

    momentum: float = 0.99
    mean: float | None = None
    var: float = 1.0

    def update(self, values: torch.Tensor) -> None:
        v = values.double()
        batch_mean, batch_var = v.mean().item(), v.var(unbiased=False).item()
        if self.mean is None:
            self.mean, self.var = batch_mean, batch_var
            return
        m = self.momentum
        delta = batch_mean - self.mean
        self.mean += (1 - m) * delta
        self.var = m * self.var + (1 - m) * batch_var + m * (1 - m) * delta * delta


@dataclass
class RewardTerm:
    """One reward in a weighted sum."""

    name: str
    reward: Reward
    weight: float
    normalize: str = "none"
    stats: RunningStats = field(default_factory=RunningStats)

    def __post_init__(self) -> None:
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"{self.name}: normalize got {self.normalize!r}, expected one of {', '.join(NORMALIZATIONS)}")


@dataclass
class RewardResult:
    """total [B] = sum_i weight_i * normalized_i; raw and normalized [B] per reward term."""

    total: torch.Tensor
    raw: dict[str, torch.Tensor]
    normalized: dict[str, torch.Tensor]

    def log_values(self, prefix: str = "reward") -> dict[str, float]:
        """Scalars for a logger: mean/std of the total and of each term, raw and normalized."""
        out = {f"{prefix}/total_mean": self.total.mean().item(), f"{prefix}/total_std": _std(self.total)}
        for name in self.raw:
            out[f"{prefix}/{name}/raw_mean"] = self.raw[name].mean().item()
            out[f"{prefix}/{name}/raw_std"] = _std(self.raw[name])
            out[f"{prefix}/{name}/normalized_mean"] = self.normalized[name].mean().item()
        return out


def _std(x: torch.Tensor) -> float:
    return x.float().std(unbiased=False).item() if x.numel() else 0.0


class WeightedReward:
    """Score a batch with every term and combine: total = sum(weight * normalize(raw))."""

    def __init__(self, terms: Sequence[RewardTerm], eps: float = 1e-6) -> None:
        if not terms:
            raise ValueError("terms: got none, expected at least one reward")
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"terms: duplicate names in {names}")
        self.terms = list(terms)
        self.eps = eps

    def _normalize(self, term: RewardTerm, raw: torch.Tensor) -> torch.Tensor:
        if term.normalize == "batch":
            return (raw - raw.mean()) / (raw.std(unbiased=False) + self.eps)
        if term.normalize == "running":
            term.stats.update(raw)
            assert term.stats.mean is not None  # update() sets it
            return (raw - term.stats.mean) / (term.stats.var**0.5 + self.eps)
        return raw

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Metadata | None = None) -> RewardResult:
        raw, normalized = {}, {}
        total = torch.zeros(images.shape[0], device=images.device)
        for term in self.terms:
            scores = term.reward(images, prompts, metadata).to(images.device, torch.float32)
            raw[term.name] = scores
            normalized[term.name] = self._normalize(term, scores)
            total = total + term.weight * normalized[term.name]
        return RewardResult(total=total, raw=raw, normalized=normalized)


def build_rewards(spec: Mapping[str, float | Mapping[str, Any]], normalize: str = "none", **common: Any) -> WeightedReward:
    """Build a WeightedReward from a config mapping (see the module doc). `normalize` is the default
    for terms that do not set their own; `common` options (e.g. device) go to every reward."""
    terms = []
    for name, entry in spec.items():
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            options: dict[str, Any] = {"weight": float(entry)}
        elif isinstance(entry, Mapping):
            options = dict(entry)
        else:
            raise TypeError(f"rewards.{name}: got {entry!r}, expected a weight (number) or a mapping of options")
        weight = float(options.pop("weight", 1.0))
        term_norm = options.pop("normalize", normalize)
        reward_name = options.pop("reward", name)
        reward = build_reward(reward_name, **{**common, **options})
        terms.append(RewardTerm(name=name, reward=reward, weight=weight, normalize=term_norm))
    return WeightedReward(terms)

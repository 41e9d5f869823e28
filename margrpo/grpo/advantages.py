"""Group-relative advantages: A = (r - mean_group) / (std + eps), and the variants GRPO papers use."""

from __future__ import annotations

from collections import defaultdict, deque

import torch

MODES = ("group", "batch_std", "no_std", "tracker")


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    mode: str = "group",
    eps: float = 1e-4,
    unbiased: bool = False,
) -> torch.Tensor:
    """rewards [B] laid out as consecutive groups of `group_size` samples of one prompt -> A [B].

    group:     (r - group mean) / (group std + eps)           (GRPO)
    batch_std: (r - group mean) / (std of the whole batch + eps)
    no_std:    r - group mean                                  (Dr. GRPO)
    std is the population std by default (unbiased=False: the advantages of a group have unit RMS
    whatever its size); unbiased=True divides by n - 1 as the reference code does (torch's default),
    which makes every advantage sqrt(G / (G - 1)) times larger (1.1547x for G = 4). A group of
    identical rewards gives exactly 0 either way.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards: expected a 1-D tensor [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size: {group_size} does not divide the batch of {rewards.numel()} rewards")
    if mode not in ("group", "batch_std", "no_std"):
        raise ValueError(f"mode: got {mode!r}, expected one of group, batch_std, no_std (tracker: use PromptTracker)")
    r = rewards.double().view(-1, group_size)
    centered = r - r.mean(1, keepdim=True)
    if mode == "group":
        centered = centered / (r.std(1, unbiased=unbiased, keepdim=True) + eps)
    elif mode == "batch_std":
        centered = centered / (rewards.double().std(unbiased=unbiased) + eps)
    return centered.view(-1).to(rewards.dtype)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """bool [B]: True for samples whose group has identical rewards (no learning signal)."""
    r = rewards.view(-1, group_size)
    flat = r.max(1).values == r.min(1).values
    return flat.repeat_interleave(group_size)


class PromptTracker:
    """Per-prompt running statistics (as in DDPO/Flow-GRPO): the advantage of a sample is its reward
    normalised by the mean/std of the last `buffer_size` rewards seen for the same prompt."""

    def __init__(self, buffer_size: int = 32, min_count: int = 8, eps: float = 1e-4):
        self.buffer_size, self.min_count, self.eps = buffer_size, min_count, eps
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=buffer_size))

    def __call__(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        if len(prompts) != rewards.numel():
            raise ValueError(f"prompts: got {len(prompts)} for {rewards.numel()} rewards, expected equal counts")
        values = rewards.double().tolist()
        for prompt, value in zip(prompts, values):
            self.history[prompt].append(value)
        batch = torch.tensor(values, dtype=torch.float64)
        out = torch.empty_like(batch)
        for i, prompt in enumerate(prompts):
            seen = torch.tensor(self.history[prompt], dtype=torch.float64)
            if len(seen) < self.min_count:  # too few: fall back to batch statistics
                seen = batch
            out[i] = (batch[i] - seen.mean()) / (seen.std(unbiased=False) + self.eps)
        return out.to(rewards.dtype)

    def state_dict(self) -> dict:
        return {
            "buffer_size": self.buffer_size,
            "min_count": self.min_count,
            "eps": self.eps,
            "history": {k: list(v) for k, v in self.history.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.buffer_size, self.min_count, self.eps = state["buffer_size"], state["min_count"], state["eps"]
        self.history = defaultdict(lambda: deque(maxlen=self.buffer_size))
        for prompt, values in state["history"].items():
            self.history[prompt].extend(values)

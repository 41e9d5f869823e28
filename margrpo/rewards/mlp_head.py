"""The small score head shared by the LAION aesthetic predictor and ImageReward.

Linear(in, 1024) -> Dropout -> Linear(1024, 128) -> Dropout -> Linear(128, 64) -> Dropout ->
Linear(64, 16) -> Linear(16, 1), with no activations: both published checkpoints were trained with
the ReLUs commented out. Parameter names layers.{0,2,4,6,7}.* match both checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn


class ScoreMLP(nn.Module):
    """The score head; `input_size` is 768 for the published checkpoints."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [B, input_size] -> [B]."""
        return self.layers(features).squeeze(-1)

    @staticmethod
    def input_size_of(state: dict[str, torch.Tensor], prefix: str = "") -> int:
        """The input width a checkpoint was saved with (from its first layer's weight)."""
        return state[f"{prefix}layers.0.weight"].shape[1]

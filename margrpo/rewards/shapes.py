"""The ShapesWorld verifier as a reward: exact scores of the testbed's procedural scenes."""
from __future__ import annotations

import torch

from .base import Metadata, Reward
from .registry import register

CATEGORIES = ("overall", "color", "shape", "count", "spatial")


@register("shapes")
class ShapesReward(Reward):
    """margrpo.testbed.verifier.score(images, prompts)[category]: a score in [0, 1] per image.

    Args:
        category: which verifier score to return: overall (default), color, shape, count, spatial.
    """

    def __init__(self, category: str = "overall", device: str | None = "cpu",
                 dtype: torch.dtype | str = torch.float32, batch_size: int | None = None) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if category not in CATEGORIES:
            raise ValueError(f"category: got {category!r}, expected one of {', '.join(CATEGORIES)}")
        self.category = category
        from margrpo.testbed import verifier  # imported here: rewards must not depend on the testbed to import

        self._verifier = verifier

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        scores = self._verifier.score(images, prompts)
        if self.category not in scores:
            raise RuntimeError(f"shapes: the verifier returned keys {sorted(scores)}, expected {self.category!r}")
        return scores[self.category]

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
        partial_credit: score near-objects in proportion to how close they come to passing the
            verifier's object tests (margrpo.testbed.verifier, "Partial credit"): a training reward
            whose value moves with small changes of an image; evaluations use the exact scores.
    """

    def __init__(
        self,
        category: str = "overall",
        partial_credit: bool = False,
        device: str | None = "cpu",
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if category not in CATEGORIES:
            raise ValueError(f"category: got {category!r}, expected one of {', '.join(CATEGORIES)}")
        if not isinstance(partial_credit, bool):
            raise ValueError(f"partial_credit: got {partial_credit!r}, expected true or false")
        self.category = category
        self.partial_credit = partial_credit
        from margrpo.testbed import verifier  # imported here: rewards must not depend on the testbed to import

        self._verifier = verifier

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        scores = self._verifier.score(images, prompts, partial_credit=self.partial_credit)
        if self.category not in scores:
            raise RuntimeError(f"shapes: the verifier returned keys {sorted(scores)}, expected {self.category!r}")
        return scores[self.category]

"""JPEG (in)compressibility: the size of the image saved as JPEG, a weight-free reward (DDPO's).

compressibility = -size in kB (smaller files score higher); incompressibility = +size in kB.
Encoding runs on the CPU through Pillow, one image at a time (the codec has no batched form).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from .base import Metadata, Reward
from .registry import register


def jpeg_kilobytes(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """images float [B, 3, H, W] in [0, 1] -> float32 [B]: JPEG file size at `quality`, in kB (1000 bytes)."""
    pixels = (images.detach() * 255).round().clamp(0, 255).to("cpu", torch.uint8).permute(0, 2, 3, 1).numpy()
    sizes = []
    for image in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


class _JpegSize(Reward):
    sign = 1.0

    def __init__(
        self, quality: int = 95, device: str | None = "cpu", dtype: torch.dtype | str = torch.float32, batch_size: int | None = None
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if not 1 <= quality <= 100:
            raise ValueError(f"quality: got {quality}, expected an integer in [1, 100]")
        self.quality = quality

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        return self.sign * jpeg_kilobytes(images, self.quality)


@register("jpeg_compressibility")
class JpegCompressibility(_JpegSize):
    """-(JPEG size in kB): rewards images that compress well."""

    sign = -1.0


@register("jpeg_incompressibility")
class JpegIncompressibility(_JpegSize):
    """+(JPEG size in kB): rewards detailed images that compress badly."""

    sign = 1.0

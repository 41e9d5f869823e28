"""Batched tensor versions of the image transforms reward models were trained with.

Two published families, both redone on a [B, 3, H, W] tensor on the reward's device (no round trip
through PIL per image):
  - shortest edge + center crop (CLIP, BLIP, the Hugging Face image processors): the published
    transforms resize a PIL image, so results match them to within uint8 rounding (see tests);
    bicubic overshoot is clamped to [0, 1] as PIL saturates it.
  - letterbox (hpsv2's ResizeMaxSize, used by hpsv2.score and the MAR-GRPO HPS reward): the long
    edge is resized to `size` on the float tensor (no rounding, no clamp), then the image is padded
    with black to a centred square.
Resizing uses antialiased interpolation, which follows PIL's filters when shrinking and is what
torchvision applies to tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# PIL resample codes used in Hugging Face preprocessor_config.json files
_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def resized_hw(height: int, width: int, shortest: int, longest: int | None = None) -> tuple[int, int]:
    """Output size of a shortest-edge resize (the torchvision / Hugging Face rule, long side truncated),
    shrinking `shortest` first if the long side would exceed `longest`."""
    short, long = min(height, width), max(height, width)
    if longest is not None and long / short * shortest > longest:
        shortest = int(round(longest * short / long))
    if height <= width:
        return shortest, int(shortest * width / height)
    return int(shortest * height / width), shortest


def center_crop(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Crop the central height x width window (offsets rounded like torchvision's CenterCrop)."""
    h, w = images.shape[-2:]
    if height > h or width > w:
        raise ValueError(f"center_crop: crop {height}x{width} is larger than the image {h}x{w}")
    top, left = int(round((h - height) / 2.0)), int(round((w - width) / 2.0))
    return images[..., top : top + height, left : left + width]


def resize_long_edge_and_pad(images: torch.Tensor, size: int, mode: str = "bicubic") -> torch.Tensor:
    """Resize the long edge to `size` (short edge round()ed, keeping the aspect ratio) and pad with
    zeros to size x size, the image centred (odd padding: the extra pixel right / bottom).

    hpsv2's ResizeMaxSize leaves an image whose long edge is already `size` unpadded, which its
    square ViT then rejects unless the image is square; here every output is square."""
    h, w = images.shape[-2:]
    scale = size / max(h, w)
    out_h, out_w = round(h * scale), round(w * scale)
    x = images
    if (out_h, out_w) != (h, w):
        x = F.interpolate(x, size=(out_h, out_w), mode=mode, align_corners=False, antialias=True)
    pad_h, pad_w = size - out_h, size - out_w
    return F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))


@dataclass(frozen=True)
class ImageTransform:
    """Resize the shortest edge to `size` (long edge capped at `max_size`), optionally center crop
    to `crop` (height, width), then normalize with mean/std. With `letterbox`, instead resize the
    long edge to `size` and pad to a square (see `resize_long_edge_and_pad`; crop and max_size must be None).
    Input float [B, 3, H, W] in [0, 1]."""

    size: int
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    mode: str = "bicubic"
    max_size: int | None = None
    letterbox: bool = False

    def __post_init__(self) -> None:
        if self.letterbox and (self.crop is not None or self.max_size is not None):
            raise ValueError(
                f"ImageTransform: letterbox pads to {self.size}x{self.size}; got crop={self.crop}, "
                f"max_size={self.max_size}, expected None for both"
            )

    def __call__(self, images: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        x = images.float()
        if self.letterbox:
            x = resize_long_edge_and_pad(x, self.size, self.mode)
        else:
            h, w = images.shape[-2:]
            out_hw = resized_hw(h, w, self.size, self.max_size)
            if out_hw != (h, w):
                x = F.interpolate(x, size=out_hw, mode=self.mode, align_corners=False, antialias=True)
                x = x.clamp_(0.0, 1.0)  # PIL saturates cubic overshoot at the uint8 range
            if self.crop is not None:
                x = center_crop(x, *self.crop)
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        return x.to(dtype) if dtype is not None else x

    @classmethod
    def clip(cls, size: int = 224) -> "ImageTransform":
        """OpenAI CLIP's transform: bicubic shortest-edge resize, center crop, CLIP mean/std."""
        return cls(size=size, crop=(size, size), mean=CLIP_MEAN, std=CLIP_STD, mode="bicubic")

    @classmethod
    def clip_letterbox(cls, size: int = 224) -> "ImageTransform":
        """hpsv2's transform: bicubic long-edge resize, black padding to a square, CLIP mean/std."""
        return cls(size=size, crop=None, mean=CLIP_MEAN, std=CLIP_STD, mode="bicubic", letterbox=True)

    @classmethod
    def from_hf_config(cls, path: str | Path) -> "ImageTransform":
        """Read a Hugging Face preprocessor_config.json (CLIP, GIT, GroundingDINO image processors)."""
        path = Path(path)
        cfg = json.loads(path.read_text())
        size = cfg.get("size", 224)
        if isinstance(size, dict):
            if "shortest_edge" not in size:
                raise ValueError(f"{path}: 'size' has keys {sorted(size)}, expected 'shortest_edge'")
            shortest, longest = size["shortest_edge"], size.get("longest_edge")
        else:
            shortest, longest = int(size), None
        crop = None
        if cfg.get("do_center_crop", False):
            c = cfg.get("crop_size", shortest)
            crop = (c["height"], c["width"]) if isinstance(c, dict) else (int(c), int(c))
        resample = cfg.get("resample", 3)
        if resample not in _RESAMPLE:
            raise ValueError(f"{path}: resample {resample} is not supported, expected one of {sorted(_RESAMPLE)}")
        return cls(
            size=shortest,
            crop=crop,
            mean=tuple(cfg.get("image_mean", CLIP_MEAN)),
            std=tuple(cfg.get("image_std", CLIP_STD)),
            mode=_RESAMPLE[resample],
            max_size=longest,
        )

"""The Reward protocol: images + prompts (+ per-image metadata) -> one score per image.

Every reward takes float images in [0, 1] or uint8 images, [B, 3, H, W], moves them to its own
device, runs without autograd in its own dtype, and returns float32 scores [B] on its device.
Subclasses implement `score` on already validated float images; `__call__` does the checks and the
optional splitting of large batches into chunks of `batch_size`. A reward whose score is read from
per-image metadata (`needs_metadata`) refuses a call without any (MissingMetadataError) rather than
scoring every image alike.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch

Metadata = list[dict[str, Any]]


def default_device() -> str:
    """'cuda' when a GPU is visible, else 'cpu': where a reward lives unless told otherwise."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch.float32 or a name such as 'bfloat16' / 'fp16' (configs carry names) -> torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "fp16": torch.float16,
        "float16": torch.float16,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp64": torch.float64,
        "float64": torch.float64,
    }
    if dtype not in names:
        raise ValueError(f"dtype: got {dtype!r}, expected one of {', '.join(names)}")
    return names[dtype]


def to_unit_float(images: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Validate a batch of images and return it as float32 in [0, 1], [B, 3, H, W], on `device`.

    uint8 images are divided by 255; float images must already lie in [0, 1] (a small rounding
    slack is clamped away; values far outside, e.g. [-1, 1] images, are an error).
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images: got {type(images).__name__}, expected a torch.Tensor [B, 3, H, W]")
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images: got shape {tuple(images.shape)}, expected [B, 3, H, W] (channels first, RGB)")
    if images.dtype == torch.uint8:
        return images.to(device).float().div_(255.0)
    if not images.is_floating_point():
        raise TypeError(f"images: got dtype {images.dtype}, expected uint8 or a float dtype with values in [0, 1]")
    out = images.to(device=device, dtype=torch.float32)
    if out.numel():
        lo, hi = out.amin().item(), out.amax().item()
        if not (lo >= -1e-3 and hi <= 1 + 1e-3):  # also catches NaN
            raise ValueError(
                f"images: float values must lie in [0, 1]; got min {lo:.4g}, max {hi:.4g} (map [-1, 1] images with (x + 1) / 2 first)"
            )
    return out.clamp(0.0, 1.0)


def check_batch(images: torch.Tensor, prompts: Sequence[str], metadata: Metadata | None) -> Metadata:
    """Check that prompts (and metadata, if given) have one entry per image; returns the metadata list."""
    batch = images.shape[0]
    if isinstance(prompts, str) or len(prompts) != batch:
        got = "a single string" if isinstance(prompts, str) else f"{len(prompts)} prompts"
        raise ValueError(f"prompts: got {got}, expected a list of {batch} strings (one per image)")
    if metadata is None:
        return [{} for _ in range(batch)]
    if len(metadata) != batch:
        raise ValueError(f"metadata: got {len(metadata)} entries, expected {batch} (one dict per image)")
    return list(metadata)


class MissingMetadataError(ValueError):
    """A reward that scores from per-image metadata was called with none."""


class Reward(abc.ABC):
    """Base class of every reward. Subclasses set `name` and implement `score`.

    Args:
        device: where the reward model lives and computes ('cpu', 'cuda', 'cuda:1', ...).
        dtype: the dtype the reward model computes in (scores are always returned as float32).
        batch_size: if set, larger batches are scored in chunks of this many images (memory bound).
    """

    name: str = "reward"
    # True when the score comes from per-image metadata (objects, counts, relations): without it
    # every image would get the same score, which gives GRPO no advantage
    needs_metadata: bool = False

    def __init__(
        self, device: str | torch.device | None = None, dtype: torch.dtype | str = torch.float32, batch_size: int | None = None
    ) -> None:
        self.device = torch.device(device if device is not None else default_device())
        self.dtype = as_dtype(dtype)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size: got {batch_size}, expected a positive integer or None")
        self.batch_size = batch_size

    @abc.abstractmethod
    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        """images float32 [B, 3, H, W] in [0, 1] on self.device -> scores [B] (any float dtype)."""

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Metadata | None = None) -> torch.Tensor:
        """Score a batch: images [B, 3, H, W] (uint8, or float in [0, 1]) -> float32 [B] on self.device."""
        if metadata is None and self.needs_metadata:
            raise MissingMetadataError(
                f"{self.name}: got no metadata; this reward scores the objects, counts and relations named in "
                "per-image metadata (margrpo.rewards.compbench), without which every image scores alike. Give "
                "prompts as a .jsonl prompt file with 'objects' (and 'position'), see margrpo.prompt_files"
            )
        meta = check_batch(images, prompts, metadata)
        prompts = list(prompts)
        step = self.batch_size or max(images.shape[0], 1)
        chunks = []
        with torch.no_grad():
            for start in range(0, images.shape[0], step):
                end = start + step
                pixels = to_unit_float(images[start:end], self.device)
                scores = self.score(pixels, prompts[start:end], meta[start:end])
                if scores.shape != (pixels.shape[0],):
                    raise RuntimeError(f"{self.name}: score() returned shape {tuple(scores.shape)}, expected ({pixels.shape[0]},)")
                chunks.append(scores.to(device=self.device, dtype=torch.float32))
        if not chunks:
            return torch.zeros(0, device=self.device)
        return torch.cat(chunks)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={self.device}, dtype={self.dtype})"

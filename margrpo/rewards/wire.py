"""The reward service's payloads: one safetensors blob per request and per reply.

Request: tensor "images" (uint8 [B, 3, H, W] by default, or float16 in [0, 1]) and, in the
safetensors text header, "prompts" and "metadata" as JSON. Reply: tensor "scores" float32 [B].
Compact (a 512x512 RGB image is 768 KiB as uint8, no per-image PNG/base64 encoding) and safe to
parse (no pickle). Errors travel as JSON {"error": message} with a 4xx/5xx status.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

WIRE_DTYPES = {"uint8": torch.uint8, "float16": torch.float16}
CONTENT_TYPE = "application/x-safetensors"
TOKEN_ENV = "MARGRPO_REWARD_TOKEN"  # the shared token of `serve-reward --token`, read by both ends
# images a reward can take: a larger side or a thinner strip fails inside a reward (JPEG's side limit is
# 65500; a shortest-edge resize with a capped long side rounds a 1 x 70000 image to 0 rows), which the
# server would report as a 500 the client retries; decode_request refuses them with a 400 instead
MAX_IMAGE_SIDE = 8192
MAX_ASPECT = 32  # long side / short side


class PayloadError(ValueError):
    """A request or reply that does not follow the wire format."""


def encode_request(images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None, wire_dtype: str = "uint8") -> bytes:
    """images float [B, 3, H, W] in [0, 1] -> bytes."""
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype: got {wire_dtype!r}, expected one of {', '.join(WIRE_DTYPES)}")
    cpu = images.detach().to("cpu", torch.float32)
    packed = (cpu * 255).round().clamp(0, 255).to(torch.uint8) if wire_dtype == "uint8" else cpu.half()
    header = {"prompts": json.dumps(list(prompts)), "metadata": json.dumps(metadata)}
    return st_save({"images": packed.contiguous()}, metadata=header)


def decode_request(body: bytes) -> tuple[torch.Tensor, list[str], list[dict[str, Any]] | None]:
    """bytes -> (images uint8 or float16 [B, 3, H, W], prompts, metadata); PayloadError if malformed."""
    try:
        tensors = st_load(body)
        header = _header(body)
        prompts, metadata = json.loads(header["prompts"]), json.loads(header["metadata"])
    except Exception as err:
        raise PayloadError(
            f"body: not a reward request ({type(err).__name__}: {err}); "
            "expected safetensors with tensor 'images' and header keys 'prompts', 'metadata'"
        ) from err
    images = tensors.get("images")
    if images is None or images.dim() != 4 or images.shape[1] != 3 or images.dtype not in WIRE_DTYPES.values():
        got = None if images is None else f"{images.dtype} {tuple(images.shape)}"
        raise PayloadError(f"images: got {got}, expected uint8 or float16 [B, 3, H, W]")
    if images.shape[2] == 0 or images.shape[3] == 0:  # no pixels: a reward model would fail on it (a 500)
        raise PayloadError(f"images: got {images.shape[2]}x{images.shape[3]} pixels, expected H, W >= 1")
    short, long = sorted(images.shape[2:])
    if long > MAX_IMAGE_SIDE or long > MAX_ASPECT * short:
        raise PayloadError(
            f"images: got {images.shape[2]}x{images.shape[3]} pixels, expected each side at most "
            f"{MAX_IMAGE_SIDE} and the long side at most {MAX_ASPECT} times the short one"
        )
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise PayloadError("prompts: expected a JSON list of strings")
    if metadata is not None and not (isinstance(metadata, list) and all(isinstance(m, dict) for m in metadata)):
        raise PayloadError("metadata: expected null or a JSON list of objects")
    return images, prompts, metadata


def encode_scores(scores: torch.Tensor) -> bytes:
    return st_save({"scores": scores.detach().to("cpu", torch.float32).contiguous()})


def decode_scores(body: bytes, batch: int) -> torch.Tensor:
    try:
        scores = st_load(body)["scores"]
    except Exception as err:
        raise PayloadError(f"reply: not a scores payload ({type(err).__name__}: {err})") from err
    if scores.shape != (batch,):
        raise PayloadError(f"reply: scores of shape {tuple(scores.shape)}, expected ({batch},)")
    return scores


def _header(body: bytes) -> dict[str, str]:
    # safetensors layout: 8-byte little-endian header length, then the JSON header
    size = int.from_bytes(body[:8], "little")
    return json.loads(body[8 : 8 + size]).get("__metadata__", {})

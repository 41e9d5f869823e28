"""NovaConfig: the transformer/config.json of a NOVA text-to-image checkpoint, and the sizes of its
three sub-networks.

The official config (NOVATransformer3DModel, baaivision/NOVA) names its sub-networks by registry
keys: arch = (temporal encoder, spatial encoder, diffusion head), e.g. ("vit_d16w1024",
"vit_d32w1024", "mlp_d3w1280"). The registered keys map to (depth, width, heads) below; any other
key must spell its size out, "vit_d{depth}w{width}h{heads}" or "mlp_d{depth}w{width}" (the tiny
test presets use these). Patch sizes follow from the VAE stride as upstream: the spatial encoder
and the head use p = 15 // stride + 1 (2 for the stride-8 SD VAE), the temporal encoder 2p.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from margrpo.heads import NOVA_SIZES

CLASS_NAME = "NOVATransformer3DModel"

# registered encoders of NOVA: name -> (depth, width, heads)
TEMPORAL_ENCODERS: dict[str, tuple[int, int, int]] = {
    "vit_d16w768": (16, 768, 12),
    "vit_d16w1024": (16, 1024, 16),
    "vit_d16w1536": (16, 1536, 16),
}
SPATIAL_ENCODERS: dict[str, tuple[int, int, int]] = {
    "vit_d32w768": (32, 768, 12),
    "vit_d32w1024": (32, 1024, 16),
    "vit_d32w1536": (32, 1536, 16),
}
_VIT_PATTERN = re.compile(r"vit_d(\d+)w(\d+)h(\d+)")
_MLP_PATTERN = re.compile(r"mlp_d(\d+)w(\d+)")


def encoder_size(name: str, registry: dict[str, tuple[int, int, int]], role: str) -> tuple[int, int, int]:
    """(depth, width, heads) of an encoder arch key."""
    if name in registry:
        return registry[name]
    match = _VIT_PATTERN.fullmatch(name)
    if not match:
        raise ValueError(f"arch ({role}): got {name!r}, expected one of {', '.join(registry)} or 'vit_d<depth>w<width>h<heads>'")
    depth, width, heads = (int(g) for g in match.groups())
    if width % heads:
        raise ValueError(f"arch ({role}): {name!r} has width {width} not divisible by {heads} heads")
    return depth, width, heads


def head_size(name: str) -> tuple[int, int]:
    """(depth, width) of a diffusion-head arch key."""
    if name in NOVA_SIZES:
        return NOVA_SIZES[name]
    match = _MLP_PATTERN.fullmatch(name)
    if not match:
        raise ValueError(f"arch (diffusion head): got {name!r}, expected one of {', '.join(NOVA_SIZES)} or 'mlp_d<depth>w<width>'")
    return int(match.group(1)), int(match.group(2))


def _pair(value: Any, name: str) -> tuple[int, ...]:
    values = (value, value) if isinstance(value, int) else tuple(value)
    if len(values) != 2 or not all(isinstance(v, int) and v > 0 for v in values):
        raise ValueError(f"{name}: got {value!r}, expected a positive int or [height, width]")
    return values


@dataclass(frozen=True)
class NovaConfig:
    """The fields of NOVA's transformer/config.json (text-to-image models only)."""

    image_dim: int = 4  # latent channels of the VAE
    image_size: tuple[int, int] = (512, 512)  # pixels
    image_stride: int = 8  # VAE downsampling
    text_token_dim: int = 2560  # width of the text encoder's hidden states (Phi-2)
    text_token_len: int = 256  # prompt tokens kept (longer prompts are truncated)
    image_base_size: tuple[int, int] = (32, 32)  # spatial token grid
    video_base_size: tuple[int, int, int] = (1, 16, 16)  # (frames, temporal token grid)
    video_mixer_rank: int | None = None  # video-only AdaLN mixer; its weights load but images never use it
    rotary_pos_embed: bool = False
    arch: tuple[str, str, str] = ("vit_d16w1024", "vit_d32w1024", "mlp_d3w1280")

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", _pair(self.image_size, "image_size"))
        object.__setattr__(self, "image_base_size", _pair(self.image_base_size, "image_base_size"))
        object.__setattr__(self, "video_base_size", tuple(self.video_base_size))
        object.__setattr__(self, "arch", tuple(self.arch))
        for name in ("image_dim", "image_stride", "text_token_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: got {value!r}, expected a positive integer")
        if not isinstance(self.text_token_dim, int) or self.text_token_dim < 1:
            raise ValueError(
                f"text_token_dim: got {self.text_token_dim!r}, expected a positive integer "
                "(class-conditional NOVA models are not supported)"
            )
        if self.rotary_pos_embed:
            raise ValueError("rotary_pos_embed: got true, expected false (the RoPE variant of NOVA is not supported)")
        if len(self.video_base_size) != 3 or self.video_base_size[0] != 1:
            raise ValueError(
                f"video_base_size: got {list(self.video_base_size)}, expected [1, h, w] "
                "(an image model; NOVA video checkpoints are not supported)"
            )
        if len(self.arch) != 3:
            raise ValueError(f"arch: got {list(self.arch)}, expected [temporal encoder, spatial encoder, head]")
        if any(v % self.image_stride for v in self.image_size):
            raise ValueError(f"image_size: got {list(self.image_size)}, expected multiples of image_stride {self.image_stride}")
        latent, p, pv = self.latent_size, self.patch_size, self.temporal_patch_size
        if any(v % pv for v in latent):
            raise ValueError(f"image_size: the latent grid {list(latent)} is not divisible by the temporal patch {pv}")
        if self.image_base_size != (latent[0] // p, latent[1] // p):
            raise ValueError(
                f"image_base_size: got {list(self.image_base_size)}, expected "
                f"{[latent[0] // p, latent[1] // p]} (latent {list(latent)} / patch {p})"
            )
        if tuple(self.video_base_size[1:]) != (latent[0] // pv, latent[1] // pv):
            raise ValueError(
                f"video_base_size: got {list(self.video_base_size)}, expected "
                f"{[1, latent[0] // pv, latent[1] // pv]} (latent {list(latent)} / patch {pv})"
            )
        widths = {self.temporal[1], self.spatial[1]}
        if len(widths) != 1:
            raise ValueError(f"arch: temporal and spatial encoders must have one width, got {list(self.arch[:2])}")
        head_size(self.arch[2])

    # ------------------------------------------------------------------ derived sizes
    @property
    def latent_size(self) -> tuple[int, int]:
        return self.image_size[0] // self.image_stride, self.image_size[1] // self.image_stride

    @property
    def patch_size(self) -> int:
        """Latent pixels per side of a spatial token (and of the head's tokens)."""
        return 15 // self.image_stride + 1

    @property
    def temporal_patch_size(self) -> int:
        return 2 * self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.image_base_size[0] * self.image_base_size[1]

    @property
    def token_channels(self) -> int:
        return self.patch_size**2 * self.image_dim

    @property
    def frame_tokens(self) -> int:
        """Tokens of one temporal frame."""
        return self.video_base_size[1] * self.video_base_size[2]

    @property
    def temporal(self) -> tuple[int, int, int]:
        return encoder_size(self.arch[0], TEMPORAL_ENCODERS, "temporal encoder")

    @property
    def spatial(self) -> tuple[int, int, int]:
        return encoder_size(self.arch[1], SPATIAL_ENCODERS, "spatial encoder")

    @property
    def head(self) -> tuple[int, int]:
        return head_size(self.arch[2])

    @property
    def width(self) -> int:
        return self.spatial[1]

    # ------------------------------------------------------------------ JSON
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "NovaConfig":
        """From the parsed config.json; diffusers metadata keys ("_class_name", ...) are skipped."""
        class_name = data.get("_class_name", CLASS_NAME)
        if class_name != CLASS_NAME:
            raise ValueError(f"{source}: _class_name is {class_name!r}, expected {CLASS_NAME!r}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if not k.startswith("_")}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown}; expected some of {sorted(known)}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "NovaConfig":
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The config.json content (lists for tuples, as upstream writes it)."""
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        return {"_class_name": CLASS_NAME, **data}

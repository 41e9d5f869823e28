"""Harmon architecture description, read from (and written to) the official config.json layout.

The Hugging Face release (wusize/Harmon-1_5B) stores a HarmonConfig as config.json with two
sections, kept verbatim here:
  "llm"  a Qwen2 config dict (transformers.Qwen2Config)
  "mar"  the MAR constructor arguments plus "type" (mar_base | mar_large | mar_huge), e.g.
         img_size 256, vae_stride 16, patch_size 1, buffer_size 64, diffloss_d 12, diffloss_w 1536,
         num_sampling_steps "100", attn_dropout 0.1, proj_dropout 0.1
The VAE (KL-16: embed_dim 16, ch_mult 1,1,2,2,4) and its latent scale 0.2325 are fixed in the official
model code, and images are generated at 512 px (a 32x32 token grid; the MAR position embeddings,
learned for 16x16, are interpolated). Three optional keys, absent from official files, let small test
checkpoints describe themselves: "vae" (VAEConfig fields), "vae_scale" and "image_size".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# MAR variant -> (width, depth, heads), the same for encoder and decoder (wusize/Harmon mar.py)
MAR_TYPES: dict[str, tuple[int, int, int]] = {
    "mar_base": (768, 12, 12),
    "mar_large": (1024, 16, 16),
    "mar_huge": (1280, 20, 16),
}
# MAR constructor arguments that only matter for MAR pre-training; accepted in config.json, unused here
MAR_TRAINING_ONLY = ("mask_ratio_min", "label_drop_prob", "diffusion_batch_mul", "grad_checkpointing")
VAE_SCALE = 0.2325
IMAGE_SIZE = 512


def _positive_ints(obj, names: tuple[str, ...], where: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}.{name}: got {value!r}, expected a positive integer")


@dataclass
class MARConfig:
    """The MAR encoder/decoder and its diffusion head (official constructor argument names)."""

    encoder_embed_dim: int = 1280
    encoder_depth: int = 20
    encoder_num_heads: int = 16
    decoder_embed_dim: int = 1280
    decoder_depth: int = 20
    decoder_num_heads: int = 16
    mlp_ratio: float = 4.0
    img_size: int = 256  # the resolution the position embeddings were learned at
    vae_stride: int = 16
    patch_size: int = 1
    vae_embed_dim: int = 16
    buffer_size: int = 64
    class_num: int = 1000  # class_emb is kept for the checkpoint's keys; Harmon never uses it
    attn_dropout: float = 0.1
    proj_dropout: float = 0.1
    diffloss_d: int = 12
    diffloss_w: int = 1536
    num_sampling_steps: str = "100"

    def __post_init__(self) -> None:
        _positive_ints(
            self,
            (
                "encoder_embed_dim",
                "encoder_depth",
                "encoder_num_heads",
                "decoder_embed_dim",
                "decoder_depth",
                "decoder_num_heads",
                "img_size",
                "vae_stride",
                "patch_size",
                "vae_embed_dim",
                "buffer_size",
                "class_num",
                "diffloss_d",
                "diffloss_w",
            ),
            "mar",
        )
        for width, heads in (("encoder_embed_dim", "encoder_num_heads"), ("decoder_embed_dim", "decoder_num_heads")):
            if getattr(self, width) % getattr(self, heads):
                raise ValueError(f"mar.{heads}: got {getattr(self, heads)}, expected a divisor of mar.{width} = {getattr(self, width)}")
        if self.img_size % (self.vae_stride * self.patch_size):
            raise ValueError(
                f"mar.img_size: got {self.img_size}, expected a multiple of vae_stride * patch_size = {self.vae_stride * self.patch_size}"
            )
        self.num_sampling_steps = str(self.num_sampling_steps)

    @property
    def seq_side(self) -> int:
        """Side of the token grid the learned position embeddings cover."""
        return self.img_size // self.vae_stride // self.patch_size

    @property
    def token_channels(self) -> int:
        return self.vae_embed_dim * self.patch_size**2

    @classmethod
    def from_official(cls, values: dict[str, Any]) -> "MARConfig":
        """From the config.json "mar" section: "type" sets the widths, depths and heads."""
        values = dict(values)
        kind = values.pop("type", None)
        args = {}
        if kind is not None:
            if kind not in MAR_TYPES:
                raise ValueError(f"config.json mar.type: got {kind!r}, expected one of {', '.join(MAR_TYPES)}")
            width, depth, heads = MAR_TYPES[kind]
            args = dict(
                encoder_embed_dim=width,
                encoder_depth=depth,
                encoder_num_heads=heads,
                decoder_embed_dim=width,
                decoder_depth=depth,
                decoder_num_heads=heads,
            )
        for name in MAR_TRAINING_ONLY:
            values.pop(name, None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"config.json mar: unknown key(s) {unknown}; expected some of {sorted(known | set(MAR_TRAINING_ONLY) | {'type'})}"
            )
        return cls(**{**args, **values})

    def to_official(self) -> dict[str, Any]:
        """The config.json "mar" section ("type" when the dimensions match a named variant)."""
        values = dataclasses.asdict(self)
        dims = (self.encoder_embed_dim, self.encoder_depth, self.encoder_num_heads)
        same = dims == (self.decoder_embed_dim, self.decoder_depth, self.decoder_num_heads)
        kind = next((k for k, v in MAR_TYPES.items() if same and v == dims), None)
        if kind is not None:
            for name in (
                "encoder_embed_dim",
                "encoder_depth",
                "encoder_num_heads",
                "decoder_embed_dim",
                "decoder_depth",
                "decoder_num_heads",
            ):
                del values[name]
            values = {"type": kind, **values}
        return values


@dataclass
class VAEConfig:
    """The LDM-style KL autoencoder (official: KL-16, 16 latent channels, downsampling 16)."""

    embed_dim: int = 16
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    resolution: int = 256  # only places the encoder's attention blocks (at resolution 16)
    encoder_attn_resolutions: tuple[int, ...] = (16,)
    decoder_attn_resolutions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _positive_ints(self, ("embed_dim", "ch", "num_res_blocks", "resolution"), "vae")
        self.ch_mult = tuple(self.ch_mult)
        self.encoder_attn_resolutions = tuple(self.encoder_attn_resolutions)
        self.decoder_attn_resolutions = tuple(self.decoder_attn_resolutions)
        if not self.ch_mult or any(not isinstance(m, int) or m < 1 for m in self.ch_mult):
            raise ValueError(f"vae.ch_mult: got {self.ch_mult!r}, expected positive integers")
        if any(self.ch * m % 32 for m in self.ch_mult):
            raise ValueError(
                f"vae.ch: got {self.ch} with ch_mult {self.ch_mult}, expected every level's channels "
                "to be a multiple of 32 (GroupNorm with 32 groups)"
            )

    @property
    def stride(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


@dataclass
class HarmonConfig:
    """Everything needed to build a Harmon model (llm: a Qwen2 config dict)."""

    llm: dict[str, Any]
    mar: MARConfig = field(default_factory=MARConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    vae_scale: float = VAE_SCALE
    image_size: int = IMAGE_SIZE  # generation resolution in pixels

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if name not in self.llm:
                raise ValueError(f"llm: missing {name!r}; expected a Qwen2 config dict (config.json 'llm' section)")
        if self.vae.embed_dim != self.mar.vae_embed_dim:
            raise ValueError(f"mar.vae_embed_dim: got {self.mar.vae_embed_dim}, expected the VAE's embed_dim {self.vae.embed_dim}")
        if self.vae.stride != self.mar.vae_stride:
            raise ValueError(
                f"mar.vae_stride: got {self.mar.vae_stride}, expected the VAE's downsampling {self.vae.stride} (2 ** (len(ch_mult) - 1))"
            )
        step = self.mar.vae_stride * self.mar.patch_size
        if not isinstance(self.image_size, int) or self.image_size < step or self.image_size % step:
            raise ValueError(f"image_size: got {self.image_size!r}, expected a positive multiple of vae_stride * patch_size = {step}")

    @property
    def grid(self) -> int:
        """Side of the generated token grid (32 at 512 px)."""
        return self.image_size // (self.mar.vae_stride * self.mar.patch_size)

    @classmethod
    def from_official(cls, values: dict[str, Any], image_size: int | None = None) -> "HarmonConfig":
        """From a parsed config.json; other top-level keys (Hugging Face bookkeeping) are ignored."""
        for name in ("llm", "mar"):
            if not isinstance(values.get(name), dict):
                raise ValueError(f"config.json: missing the {name!r} section (a Harmon config.json has 'llm' and 'mar')")
        vae = values.get("vae", {})
        known = {f.name for f in dataclasses.fields(VAEConfig)}
        if set(vae) - known:
            raise ValueError(f"config.json vae: unknown key(s) {sorted(set(vae) - known)}; expected some of {sorted(known)}")
        return cls(
            llm=dict(values["llm"]),
            mar=MARConfig.from_official(values["mar"]),
            vae=VAEConfig(**vae),
            vae_scale=float(values.get("vae_scale", VAE_SCALE)),
            image_size=image_size or int(values.get("image_size", IMAGE_SIZE)),
        )

    def to_official(self) -> dict[str, Any]:
        """config.json content (the optional keys only where they differ from the official model)."""
        values: dict[str, Any] = {"architectures": ["HarmonModel"], "model_type": "harmon", "llm": self.llm, "mar": self.mar.to_official()}
        if self.vae != VAEConfig():
            values["vae"] = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self.vae).items()}
        if self.vae_scale != VAE_SCALE:
            values["vae_scale"] = self.vae_scale
        if self.image_size != IMAGE_SIZE:
            values["image_size"] = self.image_size
        return values

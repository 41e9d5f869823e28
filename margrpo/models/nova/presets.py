"""Random-init NOVA backbones of named sizes, for benchmarks and tests (no downloaded weights):

    nova-0.6b-random  the real NOVA-0.6B @512 transformer (temporal vit_d16w1024, spatial vit_d32w1024,
                      head mlp_d3w1280: 1024 tokens x 16 channels), the SD VAE, and a stand-in text
                      encoder: Phi-2's config (width 2560, so text_embed has its real shape) with 2 of
                      its 32 layers, behind a byte-level tokenizer (Phi-2's BPE vocabulary cannot be
                      made up; prompt encoding happens once per batch, so this barely moves timings)
    nova-tiny         the same architecture at toy sizes: 64 px, 4x4 tokens, DDPM head sampler
    nova-tiny-flow    toy sizes read differently: deeper spatial encoder, 1-block head, a video
                      mixer in the weights, a flow-matching scheduler

The scheduler configs are stand-ins in the diffusers format (a real checkpoint brings its own).
`save_preset` writes a preset in the official directory layout, which `load` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .backbone import NovaBackbone
from .checkpoint import as_dtype, save
from .config import NovaConfig
from .text import PhiTextEncoder
from .transformer import NovaTransformer
from .vae import LatentDecoder

PHI_2 = dict(
    vocab_size=51200,
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=32,
    num_attention_heads=32,
    max_position_embeddings=2048,
    partial_rotary_factor=0.4,
    rope_theta=10000.0,
    layer_norm_eps=1e-5,
    hidden_act="gelu_new",
    bos_token_id=50256,
    eos_token_id=50256,
)
SD_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    latent_channels=4,
    norm_num_groups=32,
    sample_size=512,
    scaling_factor=0.18215,
)
DDPM = {
    "_class_name": "DDPMScheduler",
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
    "prediction_type": "epsilon",
    "variance_type": "fixed_small",
    "timestep_spacing": "leading",
    "steps_offset": 1,
}
FLOW = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0}
TINY_VAE = dict(SD_VAE, block_out_channels=[8, 8, 8, 8], layers_per_block=1, norm_num_groups=4, sample_size=64)
TINY_PHI = dict(
    PHI_2,
    vocab_size=260,
    hidden_size=40,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    bos_token_id=256,
    eos_token_id=256,
)


@dataclass(frozen=True)
class Preset:
    transformer: NovaConfig
    phi: dict[str, Any]
    vae: dict[str, Any]
    scheduler: dict[str, Any]


PRESETS: dict[str, Preset] = {
    "nova-0.6b-random": Preset(NovaConfig(), dict(PHI_2, num_hidden_layers=2), SD_VAE, DDPM),
    "nova-tiny": Preset(
        NovaConfig(
            image_size=(64, 64),
            text_token_dim=40,
            text_token_len=16,
            image_base_size=(4, 4),
            video_base_size=(1, 2, 2),
            arch=("vit_d2w32h2", "vit_d2w32h2", "mlp_d2w32"),
        ),
        TINY_PHI,
        TINY_VAE,
        DDPM,
    ),
    "nova-tiny-flow": Preset(
        NovaConfig(
            image_size=(64, 64),
            text_token_dim=40,
            text_token_len=12,
            image_base_size=(4, 4),
            video_base_size=(1, 2, 2),
            video_mixer_rank=4,
            arch=("vit_d1w48h4", "vit_d3w48h4", "mlp_d1w40"),
        ),
        TINY_PHI,
        TINY_VAE,
        FLOW,
    ),
}


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (any text, one token per UTF-8 byte; id 256 = end of
    text, also used as padding), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=special, eos_token=special, unk_token=special, pad_token=special)


def build(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    training_extra_frame: bool = False,
) -> NovaBackbone:
    """A random-init backbone of preset `name` (weights drawn on `device` from `seed`), in eval mode."""
    if name not in PRESETS:
        raise ValueError(f"name: got {name!r}, expected one of {', '.join(PRESETS)}")
    from diffusers import AutoencoderKL
    from transformers import PhiConfig, PhiModel

    preset, device, dtype = PRESETS[name], torch.device(device), as_dtype(dtype)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        transformer = NovaTransformer(preset.transformer)
        phi = PhiModel(PhiConfig(**preset.phi))
        vae = AutoencoderKL(**preset.vae)
    text_encoder = PhiTextEncoder(byte_tokenizer(), phi, preset.transformer.text_token_len)
    backbone = NovaBackbone(transformer, text_encoder, LatentDecoder(vae), preset.scheduler, training_extra_frame)
    return backbone.to(dtype).eval()


def save_preset(name: str, path: str | Path, seed: int = 0, dtype: torch.dtype | str = torch.float32) -> Path:
    """Write a random-init preset in the official checkpoint layout; returns `path`."""
    return save(build(name, "cpu", dtype, seed), path)

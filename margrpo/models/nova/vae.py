"""NOVA's frozen image decoder: the checkpoint's vae/ (a diffusers AutoencoderKL, SD's for NOVA @512).

Latents are stored scaled: decode(latent / scaling_factor + shift_factor), as upstream's unscale_.
"""

from __future__ import annotations

from pathlib import Path

import torch


class LatentDecoder:
    """Scaled latents [B, c, h, w] -> images [B, 3, H, W] in [0, 1]. Frozen: runs without gradient."""

    def __init__(self, vae):
        self.vae = vae.eval().requires_grad_(False)
        config = vae.config
        self.scaling_factor = float(config.scaling_factor)
        self.shift_factor = float(config.shift_factor or 0.0)
        self.latent_channels = int(config.latent_channels)
        self.stride = 2 ** (len(config.block_out_channels) - 1)

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        weight = self.vae.decoder.conv_in.weight
        z = latents.to(device=weight.device, dtype=weight.dtype) / self.scaling_factor + self.shift_factor
        return self.vae.decode(z).sample.float().add(1).div(2).clamp(0, 1)


def load_vae(vae_dir: Path, device, dtype: torch.dtype) -> LatentDecoder:
    """The AutoencoderKL of a NOVA checkpoint; missing or mismatched weights raise ValueError."""
    from diffusers import AutoencoderKL
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # (no `accelerate`: a note about low_cpu_mem_usage)
    try:
        vae, info = AutoencoderKL.from_pretrained(str(vae_dir), torch_dtype=dtype, output_loading_info=True)
    finally:
        diffusers_logging.set_verbosity(verbosity)
    problems = [f"{key} {sorted(info[key])[:8]}" for key in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[key]]
    if problems:
        raise ValueError(f"{vae_dir}: the VAE weights do not fit its config.json: " + "; ".join(problems))
    return LatentDecoder(vae.to(device))

"""The LDM-style KL autoencoder Harmon decodes its latent tokens with (KL-16 at the official size).

Module and parameter names follow the official checkpoint (kl16.ckpt, and the `vae.` entries of
the Hugging Face release) so its state dict loads unchanged:
  encoder: conv_in, down.{i}.block.{j} (ResnetBlock), down.{i}.attn.{j}, down.{i}.downsample.conv,
           mid.block_1, mid.attn_1, mid.block_2, norm_out, conv_out (2 x embed_dim: mean, logvar)
  decoder: conv_in, mid.*, up.{i}.block.{j}, up.{i}.attn.{j}, up.{i}.upsample.conv, norm_out, conv_out
  quant_conv, post_quant_conv (1x1)
ResnetBlock: GroupNorm(32) -> SiLU -> conv3x3 -> GroupNorm -> SiLU -> conv3x3, plus a 1x1
`nin_shortcut` when the channels change. AttnBlock: single-head self-attention over the pixels with
1x1 q, k, v, proj_out. Downsample pads (0, 1, 0, 1) then a stride-2 conv; Upsample is nearest x2 + conv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import VAEConfig


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        shortcut = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return shortcut + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (conv(n).reshape(b, 1, c, h * w).transpose(2, 3) for conv in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # one head of width c: softmax(q k^T / sqrt(c)) v
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _mid(channels: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = ResnetBlock(channels, channels), AttnBlock(channels), ResnetBlock(channels, channels)
    return mid


def _run_mid(mid: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return mid.block_2(mid.attn_1(mid.block_1(h)))


class Encoder(nn.Module):
    """images [B, 3, H, W] -> moments [B, 2 * embed_dim, H / stride, W / stride]."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        ch, mult = config.ch, config.ch_mult
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.ModuleList()
        resolution, block_in = config.resolution, ch
        for level, m in enumerate(mult):
            down = nn.Module()
            down.block, down.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(config.num_res_blocks):
                down.block.append(ResnetBlock(block_in, ch * m))
                block_in = ch * m
                if resolution in config.encoder_attn_resolutions:
                    down.attn.append(AttnBlock(block_in))
            if level != len(mult) - 1:
                down.downsample = Downsample(block_in)
                resolution //= 2
            self.down.append(down)
        self.mid = _mid(block_in)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, 2 * config.embed_dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for down in self.down:
            for j, block in enumerate(down.block):
                h = block(h)
                if len(down.attn):
                    h = down.attn[j](h)
            if hasattr(down, "downsample"):
                h = down.downsample(h)
        h = _run_mid(self.mid, h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """latents [B, embed_dim, h, w] -> images [B, 3, h * stride, w * stride], roughly in [-1, 1]."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        ch, mult = config.ch, config.ch_mult
        block_in = ch * mult[-1]
        resolution = config.resolution // config.stride
        self.conv_in = nn.Conv2d(config.embed_dim, block_in, 3, padding=1)
        self.mid = _mid(block_in)
        self.up = nn.ModuleList()
        for level in reversed(range(len(mult))):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(config.num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, ch * mult[level]))
                block_in = ch * mult[level]
                if resolution in config.decoder_attn_resolutions:
                    up.attn.append(AttnBlock(block_in))
            if level != 0:
                up.upsample = Upsample(block_in)
                resolution *= 2
            self.up.insert(0, up)  # up[0] is the finest level, as in the checkpoint
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = _run_mid(self.mid, self.conv_in(z))
        for up in reversed(self.up):
            for j, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[j](h)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class AutoencoderKL(nn.Module):
    """The KL autoencoder: encode -> posterior mean (the latents Harmon scales by vae_scale), decode."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.embed_dim = config.embed_dim
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quant_conv = nn.Conv2d(2 * config.embed_dim, 2 * config.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.embed_dim, 1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [-1, 1] -> the posterior mean [B, embed_dim, H/s, W/s] (its mode)."""
        return self.quant_conv(self.encoder(images)).chunk(2, dim=1)[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, embed_dim, h, w] -> images [B, 3, h*s, w*s], roughly in [-1, 1]."""
        return self.decoder(self.post_quant_conv(latents))

"""A small stand-in with the interface of LTH14/mar's MAR model (models/mar.py) and its VAE, for the
"bring your own MAR model" recipe of docs/USING.md, which tests/test_docs_examples.py runs on it.

Written here from MAR's interface, importing nothing of margrpo's heads: attributes seq_len,
token_embed_dim, class_emb, fake_latent, diffloss.net (SimpleMLPAdaLN's layer names: time_embed.mlp,
cond_embed, input_proj, res_blocks[i].{in_ln, mlp, adaLN_modulation}, final_layer); methods
forward_mae_encoder(x, mask, class_embedding), forward_mae_decoder(x, mask), unpatchify(x), and
diffloss.sample(z, temperature, cfg), which draws its noise as MAR's sampler does: torch.randn of N
rows for x_T (the same rows for both CFG halves), then 2N rows per step, and guides the first C
("eps") output channels of the [cond; uncond] batch (MAR's forward_with_cfg). The per-step Gaussian
comes from margrpo's mar_sampler: this stand-in checks the recipe's noise and guidance mapping, not
the IDDPM arithmetic (tests/test_diffusion.py does).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from margrpo.diffusion import mar_sampler


def _sincos(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=torch.float32) / (dim // 2))
    angles = t.float()[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class _AdaLNBlock(nn.Module):
    def __init__(self, width: int, chunks: int):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, chunks * width))


class _ResBlock(_AdaLNBlock):
    def __init__(self, width: int):
        super().__init__(width, 3)
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class _Final(_AdaLNBlock):
    def __init__(self, width: int, out: int):
        super().__init__(width, 2)
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out)

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class _TimeEmbed(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):
        return self.mlp(_sincos(t))


class SimpleMLPAdaLN(nn.Module):
    """MAR's diffusion head: forward(x [M, C], t [M], c [M, Dz]) -> [M, 2C] (eps, variance)."""

    def __init__(self, channels: int, width: int, z_channels: int, depth: int = 2):
        super().__init__()
        self.in_channels = channels
        self.time_embed = _TimeEmbed(width)
        self.cond_embed = nn.Linear(z_channels, width)
        self.input_proj = nn.Linear(channels, width)
        self.res_blocks = nn.ModuleList(_ResBlock(width) for _ in range(depth))
        self.final_layer = _Final(width, 2 * channels)

    def forward(self, x, t, c):
        h, y = self.input_proj(x), self.time_embed(t) + self.cond_embed(c)
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)

    def forward_with_cfg(self, x, t, c, cfg_scale):
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half]), t, c)
        eps, rest = out[:, : self.in_channels], out[:, self.in_channels :]
        cond, uncond = eps.chunk(2)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided]), rest], dim=1)


class DiffLoss(nn.Module):
    def __init__(self, channels: int, z_channels: int, num_sampling_steps: int):
        super().__init__()
        self.in_channels = channels
        self.net = SimpleMLPAdaLN(channels, 32, z_channels)
        self.sampler = mar_sampler(num_sampling_steps)

    @torch.no_grad()
    def sample(self, z, temperature=1.0, cfg=1.0):
        rows = len(z)
        if cfg != 1.0:
            noise = torch.randn(rows // 2, self.in_channels)
            x = torch.cat([noise, noise])
            model = lambda x, t, c: self.net.forward_with_cfg(x, t, c, cfg)  # noqa: E731
        else:
            x, model = torch.randn(rows, self.in_channels), self.net
        for i in range(self.sampler.num_steps):  # noisiest first
            t = torch.full((rows,), self.sampler.model_time(i))
            mean, std = self.sampler.mean_std(model(x, t, z), x, i, temperature)
            x = mean + std * torch.randn(rows, self.in_channels)  # drawn on every step, as MAR does
        return x


class MAR(nn.Module):
    """Class-conditional masked autoregression over seq_len tokens of token_embed_dim channels."""

    def __init__(self, seq_len: int = 16, token_embed_dim: int = 4, width: int = 32, num_classes: int = 10, num_sampling_steps: int = 10):
        super().__init__()
        self.seq_len, self.token_embed_dim = seq_len, token_embed_dim
        self.class_emb = nn.Embedding(num_classes, width)
        self.fake_latent = nn.Parameter(0.02 * torch.randn(1, width))  # the unconditional class embedding
        self.z_proj = nn.Linear(token_embed_dim, width)
        self.encoder_pos_embed = nn.Parameter(0.02 * torch.randn(1, seq_len, width))
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, width))
        self.decoder = nn.Linear(width, width)
        self.diffloss = DiffLoss(token_embed_dim, width, num_sampling_steps)

    def forward_mae_encoder(self, x, mask, class_embedding):
        """x [B, N, C] tokens, mask [B, N] float (1 = still to predict), class_embedding [B, D]."""
        h = self.z_proj(x) + self.encoder_pos_embed
        return h * (1 - mask)[..., None] + class_embedding[:, None]

    def forward_mae_decoder(self, x, mask):
        return self.decoder(torch.where(mask[..., None].bool(), self.mask_token, x))

    def unpatchify(self, x):
        side = int(self.seq_len**0.5)
        return x.transpose(1, 2).reshape(len(x), self.token_embed_dim, side, side)


class VAE(nn.Module):
    """decode(latents [B, C, h, w]) -> images in [-1, 1], 2x upsampled."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.out = nn.Conv2d(channels, 3, 1)

    def decode(self, latents):
        return torch.tanh(nn.functional.interpolate(self.out(latents), scale_factor=2))


def standins(seed: int = 0) -> tuple[MAR, VAE]:
    """(mar, vae): a random-init model whose head is not zero-init (its outputs depend on z)."""
    torch.manual_seed(seed)
    return MAR(), VAE()

"""NOVA diffusion head `DiffusionMLP`, split into condition(z, t) and denoise(x, modulation).

Architecture (baaivision/NOVA diffnext/models/diffusion_mlp.py and normalization.py; module and
parameter names are kept so the official state dicts load unchanged):
  h = Conv2d_{p x p, stride p}(x_t image)                        patch_embed.proj
  cond = MLP(z) + MLP(sincos256(t))                              time_cond_embed.{condition,timestep}_proj.fc{1,2}
  D blocks:                                                      blocks.{i}
    (scale, shift, gate) = Linear_{W->3W}(SiLU(cond))            .norm1.proj   (NOVA's stat order)
    u = LN(h) * (1 + scale) + shift                              (eps 1e-6, no affine)
    h = h + gate * LN_affine(MLP(u))                             .proj.fc{1,2}, .norm2 (eps 1e-5)
  (scale, shift) = Linear_{W->2W}(SiLU(cond)); out = Linear(LN(h) * (1 + scale) + shift)   norm.proj, head

Tokens: the head works on patch tokens of C = p*p*image_dim channels in NOVA's patchify order
(p_h, p_w, channel); the 2x2 conv is then exactly a Linear with the conv kernel permuted, so the
official weights load as they are and are applied to tokens (`patchify` / `unpatchify` convert).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from margrpo import ops

from . import layers
from .layers import Modulation

# registered image decoders of NOVA: name -> (depth, width)
NOVA_SIZES: dict[str, tuple[int, int]] = {
    "mlp_d3w1280": (3, 1280),
    "mlp_d6w768": (6, 768),
    "mlp_d6w1024": (6, 1024),
    "mlp_d6w1536": (6, 1536),
}
ADALN_EPS = 1e-6
BLOCK_NORM_EPS = 1e-5  # nn.LayerNorm default, used by each block's norm2


class Projector(nn.Module):
    """fc2(SiLU(fc1(x)))."""

    def __init__(self, dim: int, mlp_dim: int | None = None, out_dim: int | None = None):
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim or dim)
        self.fc2 = nn.Linear(mlp_dim or dim, out_dim or dim)
        self.activation = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class AdaLayerNormZero(nn.Module):
    """stats = proj(SiLU(cond)).chunk(num_stats) = (scale, shift, rest...); LN(x)(1 + scale) + shift."""

    def __init__(self, dim: int, num_stats: int = 2, eps: float = ADALN_EPS):
        super().__init__()
        self.proj = nn.Linear(dim, num_stats * dim)
        self.norm = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.num_stats = num_stats

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        stats = self.proj(F.silu(cond)).chunk(self.num_stats, dim=-1)
        return self.norm(x) * (1 + stats[0]) + stats[1], stats[2:]


class DiffusionBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm1 = AdaLayerNormZero(dim, num_stats=3)
        self.proj = Projector(dim, dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=BLOCK_NORM_EPS)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h, (gate,) = self.norm1(x, cond)
        return x + gate * self.norm2(self.proj(h))


class TimeCondEmbed(nn.Module):
    """cond = condition_proj(z) + timestep_proj(sincos256(t))."""

    def __init__(self, cond_dim: int, embed_dim: int, freq_dim: int = layers.FREQUENCY_EMBEDDING_SIZE):
        super().__init__()
        self.timestep_proj = Projector(freq_dim, embed_dim, embed_dim)
        self.condition_proj = Projector(cond_dim, embed_dim, embed_dim)
        self.freq_dim = freq_dim

    def embed_time(self, t: torch.Tensor) -> torch.Tensor:
        dtype = self.timestep_proj.fc1.weight.dtype
        return self.timestep_proj(layers.timestep_embedding(t, self.freq_dim, dtype))


class PatchEmbed(nn.Module):
    def __init__(self, image_dim: int, embed_dim: int, patch_size: int):
        super().__init__()
        self.proj = nn.Conv2d(image_dim, embed_dim, patch_size, patch_size)


class DiffusionMLP(nn.Module):
    """The NOVA per-token diffusion head (eps or flow velocity output, no variance channels).

    Args:
        depth: D blocks; embed_dim: W; cond_dim: width of z;
        patch_size: p (2 for NOVA's stride-8 VAE); image_dim: latent image channels (4).
    """

    def __init__(self, depth: int, embed_dim: int, cond_dim: int, patch_size: int = 2, image_dim: int = 4):
        super().__init__()
        self.depth, self.embed_dim, self.z_channels = depth, embed_dim, cond_dim
        self.patch_size, self.image_dim = patch_size, image_dim
        self.in_channels = self.out_channels = patch_size * patch_size * image_dim
        self.patch_embed = PatchEmbed(image_dim, embed_dim, patch_size)
        self.time_cond_embed = TimeCondEmbed(cond_dim, embed_dim)
        self.blocks = nn.ModuleList(DiffusionBlock(embed_dim) for _ in range(depth))
        self.norm = AdaLayerNormZero(embed_dim, num_stats=2)
        self.head = nn.Linear(embed_dim, self.out_channels)

    def zero_init_layers(self) -> list[nn.Linear]:
        """The modulation and output layers (NOVA keeps PyTorch's default init for them; listed so
        tests can re-randomise them like the MAR head's adaLN-Zero layers)."""
        return [b.norm1.proj for b in self.blocks] + [self.norm.proj, self.head]

    def token_patch_weight(self) -> torch.Tensor:
        """The patch conv as a Linear on tokens in (p_h, p_w, channel) order: [W, p*p*image_dim]."""
        w = self.patch_embed.proj.weight  # [W, image_dim, p, p]
        return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)

    # ------------------------------------------------------------------ split path
    def embed_condition(self, z: torch.Tensor) -> torch.Tensor:
        """z [*B, N, Dz] -> condition_proj(z) [*B, N, W], the step-independent part of the condition."""
        if z.shape[-1] != self.z_channels:
            raise ValueError(f"z: got shape {tuple(z.shape)}, expected [..., N, {self.z_channels}]")
        return self.time_cond_embed.condition_proj(z.to(self.time_cond_embed.condition_proj.fc1.weight.dtype))

    def modulation(self, cond: torch.Tensor, t) -> Modulation:
        """cond = embed_condition(z), t a number or a tensor broadcastable against cond's leading dims."""
        s = F.silu(cond + self.time_cond_embed.embed_time(layers.as_time_tensor(t, cond.device)))
        blocks = []
        for block in self.blocks:
            scale, shift, gate = block.norm1.proj(s).chunk(3, dim=-1)
            blocks.append((shift, scale, gate))
        scale, shift = self.norm.proj(s).chunk(2, dim=-1)
        return Modulation(blocks=blocks, final=(shift, scale))

    def condition(self, z: torch.Tensor, t) -> Modulation:
        """The modulation of every block for tokens with condition z [*B, N, Dz] at diffusion time t."""
        return self.modulation(self.embed_condition(z), t)

    def denoise(self, x: torch.Tensor, modulation: Modulation, backend: str | None = None) -> torch.Tensor:
        """x [*L, N, C] patch tokens (L: seed trajectories, broadcast against the modulation) -> [..., N, C]."""
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"x: got shape {tuple(x.shape)}, expected [..., N, {self.in_channels}]")
        h = F.linear(x.to(self.head.weight.dtype), self.token_patch_weight(), self.patch_embed.proj.bias)
        for block, (shift, scale, gate) in zip(self.blocks, modulation.blocks):
            u = ops.ln_modulate(h, shift, scale, None, None, ADALN_EPS, backend=backend)
            u = layers.silu_(F.linear(u, block.proj.fc1.weight, block.proj.fc1.bias))
            u = F.linear(u, block.proj.fc2.weight, block.proj.fc2.bias)
            h = ops.gate_residual(h, u, gate, block.norm2.weight, block.norm2.bias, BLOCK_NORM_EPS, backend=backend)
        shift, scale = modulation.final
        u = ops.ln_modulate(h, shift, scale, None, None, ADALN_EPS, backend=backend)
        return F.linear(u, self.head.weight, self.head.bias)

    # ------------------------------------------------------------------ official forward
    def forward(self, x: torch.Tensor, t, z: torch.Tensor) -> torch.Tensor:
        """The official per-call forward on tokens: x [*, N, C], t number or [*, N], z [*, N, Dz].

        Module by module as in NOVA (modulation recomputed each call); equal to denoise(x, condition(z, t)).
        Use `patchify` first for an image-shaped x_t."""
        h = F.linear(x.to(self.head.weight.dtype), self.token_patch_weight(), self.patch_embed.proj.bias)
        embed = self.time_cond_embed
        cond = embed.condition_proj(z.to(h.dtype)) + embed.embed_time(layers.as_time_tensor(t, x.device))
        for block in self.blocks:
            h = block(h, cond)
        return self.head(self.norm(h, cond)[0])


def patchify(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, c, H, W] latent image -> [B, (H/p)(W/p), p*p*c] tokens in NOVA's (p_h, p_w, c) order."""
    b, c, height, width = image.shape
    p = patch_size
    if height % p or width % p:
        raise ValueError(f"image: got spatial size {height}x{width}, expected multiples of patch_size={p}")
    x = image.reshape(b, c, height // p, p, width // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (height // p) * (width // p), p * p * c)


def unpatchify(tokens: torch.Tensor, height: int, width: int, patch_size: int) -> torch.Tensor:
    """Inverse of patchify: [B, (H/p)(W/p), p*p*c] -> [B, c, H, W] (height, width in latent pixels)."""
    b, n, channels = tokens.shape
    p = patch_size
    c = channels // (p * p)
    if n != (height // p) * (width // p) or c * p * p != channels:
        raise ValueError(
            f"tokens: got shape {tuple(tokens.shape)}, expected [B, {(height // p) * (width // p)}, "
            f"p*p*c] for a {height}x{width} image with patch_size={p}"
        )
    x = tokens.reshape(b, height // p, width // p, p, p, c).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(b, c, height, width)


def nova_head(size: str = "mlp_d6w1024", cond_dim: int = 1024, patch_size: int = 2, image_dim: int = 4) -> DiffusionMLP:
    """A DiffusionMLP of one of NOVA's registered sizes (d3w1280, d6w768, d6w1024, d6w1536; the
    registry's "mlp_" prefix is optional)."""
    size = size if size.startswith("mlp_") else f"mlp_{size}"
    if size not in NOVA_SIZES:
        raise ValueError(f"size: got {size!r}, expected one of {', '.join(NOVA_SIZES)}")
    depth, width = NOVA_SIZES[size]
    return DiffusionMLP(depth, width, cond_dim, patch_size, image_dim)

"""MAR / Harmon diffusion head `SimpleMLPAdaLN`, split into condition(z, t) and denoise(x, modulation).

Architecture (LTH14/mar models/diffloss.py, wusize/Harmon src/models/mar/diffloss.py; module and
parameter names are kept so the official state dicts load unchanged):
  y = TimeMLP(sincos256(t)) + Linear(z)                          time_embed.mlp.{0,2}, cond_embed
  h = Linear_{C->W}(x)                                           input_proj
  D residual blocks:                                             res_blocks.{i}
    (shift, scale, gate) = Linear_{W->3W}(SiLU(y))               .adaLN_modulation.1
    u = LN_affine(h) * (1 + scale) + shift                       .in_ln (eps 1e-6, affine)
    h = h + gate * Linear(SiLU(Linear(u)))                       .mlp.{0,2}
  (shift, scale) = Linear_{W->2W}(SiLU(y));                      final_layer.adaLN_modulation.1
  out = Linear_{W->out}(LN(h) * (1 + scale) + shift)             final_layer.{norm_final, linear}
out = 2C with learned variance (learn_sigma: eps then the variance interpolation channels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from margrpo import ops

from . import layers
from .layers import Modulation

# name -> (depth, width, z width of the MAR decoder that feeds the head)
MAR_SIZES: dict[str, tuple[int, int, int]] = {
    "mar_b": (6, 1024, 768),
    "mar_l": (8, 1280, 1024),
    "mar_h": (12, 1536, 1280),  # Harmon-1.5B uses this head
}
LN_EPS = 1e-6


class TimestepEmbedder(nn.Module):
    """t -> MLP(sincos256(t)); `mlp` = Linear(256, W), SiLU, Linear(W, W)."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = layers.FREQUENCY_EMBEDDING_SIZE):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))
        self.frequency_embedding_size = frequency_embedding_size

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        dtype = self.mlp[0].weight.dtype
        return self.mlp(layers.timestep_embedding(t, self.frequency_embedding_size, dtype))


class ResBlock(nn.Module):
    """adaLN residual MLP block; forward(x, y) is the official per-call computation."""

    def __init__(self, channels: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(channels, eps=LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(channels, channels), nn.SiLU(), nn.Linear(channels, channels))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(channels, 3 * channels))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class FinalLayer(nn.Module):
    """Non-affine LayerNorm, adaLN modulate, Linear W -> out."""

    def __init__(self, model_channels: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(model_channels, elementwise_affine=False, eps=LN_EPS)
        self.linear = nn.Linear(model_channels, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(model_channels, 2 * model_channels))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class SimpleMLPAdaLN(nn.Module):
    """The MAR / Harmon per-token diffusion head.

    Args:
        in_channels: C, channels of a token.
        model_channels: W, the MLP width.
        out_channels: C (eps only) or 2C (eps + learned-range variance).
        z_channels: width of the condition z from the AR model.
        num_res_blocks: D, the number of residual blocks.
    """

    def __init__(self, in_channels: int, model_channels: int, out_channels: int, z_channels: int, num_res_blocks: int):
        super().__init__()
        self.in_channels = in_channels
        self.model_channels = model_channels
        self.out_channels = out_channels
        self.z_channels = z_channels
        self.num_res_blocks = num_res_blocks
        self.time_embed = TimestepEmbedder(model_channels)
        self.cond_embed = nn.Linear(z_channels, model_channels)
        self.input_proj = nn.Linear(in_channels, model_channels)
        self.res_blocks = nn.ModuleList(ResBlock(model_channels) for _ in range(num_res_blocks))
        self.final_layer = FinalLayer(model_channels, out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """The official init: xavier-uniform Linears, N(0, 0.02) time MLP, adaLN-Zero (zeroed modulation
        and output layers, so a fresh head outputs zeros; see reinit_zero_layers_ for tests)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        for layer in self.zero_init_layers():
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def zero_init_layers(self) -> list[nn.Linear]:
        """The layers the adaLN-Zero init sets to zero."""
        return [b.adaLN_modulation[-1] for b in self.res_blocks] + [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]

    # ------------------------------------------------------------------ split path
    def embed_condition(self, z: torch.Tensor) -> torch.Tensor:
        """z [*B, N, Dz] -> the step-independent part of the condition, [*B, N, W]."""
        return mar_embed_condition(self, z)

    def modulation(self, cond: torch.Tensor, t) -> Modulation:
        """cond = embed_condition(z) [*B, N, W], t a number or a tensor broadcastable against the
        leading dims of cond (e.g. [N], or [R, 1, 1] for R steps at once) -> Modulation."""
        return mar_modulation(self, cond, t)

    def condition(self, z: torch.Tensor, t) -> Modulation:
        """The modulation of every block for tokens with condition z [*B, N, Dz] at diffusion time t."""
        return self.modulation(self.embed_condition(z), t)

    def denoise(self, x: torch.Tensor, modulation: Modulation, backend: str | None = None) -> torch.Tensor:
        """x [*L, N, C] (L: seed trajectories, broadcast against the modulation's *B) -> [*L|*B, N, out]."""
        return mar_denoise(self, x, modulation, backend)

    # ------------------------------------------------------------------ official forward
    def forward(self, x: torch.Tensor, t, z: torch.Tensor) -> torch.Tensor:
        """The official per-call forward: x [*, C], t [*] (or a number), z [*, Dz] -> [*, out].

        Recomputes the modulation on every call (module by module, as LTH14/mar does); equal to
        denoise(x, condition(z, t)) and kept as the eager reference."""
        dtype = self.input_proj.weight.dtype
        h = self.input_proj(x.to(dtype))
        y = self.time_embed(layers.as_time_tensor(t, x.device)) + self.cond_embed(z.to(dtype))
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)


def mar_head(size: str = "mar_h", token_channels: int = 16, z_channels: int | None = None, learn_sigma: bool = True) -> SimpleMLPAdaLN:
    """A SimpleMLPAdaLN of a registered size (mar_b 6x1024, mar_l 8x1280, mar_h 12x1536 = Harmon-1.5B).

    z_channels defaults to the MAR decoder width of that size (768 / 1024 / 1280)."""
    if size not in MAR_SIZES:
        raise ValueError(f"size: got {size!r}, expected one of {', '.join(MAR_SIZES)}")
    depth, width, default_z = MAR_SIZES[size]
    out = token_channels * 2 if learn_sigma else token_channels
    return SimpleMLPAdaLN(token_channels, width, out, z_channels or default_z, depth)


# ------------------------------------------------------------------ the split path on any module of this layout
# These read the parameters of a module with SimpleMLPAdaLN's layout (time_embed.mlp, cond_embed,
# input_proj, res_blocks[i].{in_ln, mlp, adaLN_modulation}, final_layer.{norm_final, linear,
# adaLN_modulation}): margrpo's own class, or the original LTH14/mar module through
# margrpo.heads.adapt. Sizes and LayerNorm settings come from the submodules themselves.
def mar_embed_condition(layout: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """z [*B, N, Dz] -> cond_embed(z) [*B, N, W]."""
    cond_embed = layout.cond_embed
    if z.shape[-1] != cond_embed.in_features:
        raise ValueError(f"z: got shape {tuple(z.shape)}, expected [..., N, {cond_embed.in_features}]")
    return cond_embed(z.to(cond_embed.weight.dtype))


def mar_modulation(layout: nn.Module, cond: torch.Tensor, t) -> Modulation:
    """Every block's (shift, scale, gate) and the final (shift, scale) for cond at diffusion time t."""
    time_mlp = layout.time_embed.mlp
    embedded = layers.timestep_embedding(layers.as_time_tensor(t, cond.device), time_mlp[0].in_features, time_mlp[0].weight.dtype)
    # a scalar t embeds to [W] and broadcasts over every token
    y = F.silu(cond + time_mlp(embedded))
    blocks = [tuple(b.adaLN_modulation[-1](y).chunk(3, dim=-1)) for b in layout.res_blocks]
    final = tuple(layout.final_layer.adaLN_modulation[-1](y).chunk(2, dim=-1))
    return Modulation(blocks=blocks, final=final)


def mar_denoise(layout: nn.Module, x: torch.Tensor, modulation: Modulation, backend: str | None = None) -> torch.Tensor:
    """x [*L, N, C] under `modulation` -> [*L|*B, N, out]. GEMMs through F.linear; LayerNorm+modulate
    and gate+residual through the fused primitives."""
    proj = layout.input_proj
    if x.shape[-1] != proj.in_features:
        raise ValueError(f"x: got shape {tuple(x.shape)}, expected [..., N, {proj.in_features}]")
    h = F.linear(x.to(proj.weight.dtype), proj.weight, proj.bias)
    for block, (shift, scale, gate) in zip(layout.res_blocks, modulation.blocks):
        norm = block.in_ln
        u = ops.ln_modulate(h, shift, scale, norm.weight, norm.bias, norm.eps, backend=backend)
        u = layers.silu_(F.linear(u, block.mlp[0].weight, block.mlp[0].bias))
        u = F.linear(u, block.mlp[2].weight, block.mlp[2].bias)
        h = ops.gate_residual(h, u, gate, None, None, 0.0, backend=backend)
    shift, scale = modulation.final
    final = layout.final_layer
    norm = final.norm_final
    u = ops.ln_modulate(h, shift, scale, norm.weight, norm.bias, norm.eps, backend=backend)
    return F.linear(u, final.linear.weight, final.linear.bias)

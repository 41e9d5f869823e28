"""Pieces shared by the diffusion heads: the sinusoidal time embedding and the per-step modulation
container. The heads' fused adaLN steps (LayerNorm + modulate, gate + residual) are the ops
margrpo.ops.ln_modulate / gate_residual, dispatched like every fused op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


FREQUENCY_EMBEDDING_SIZE = 256  # both MAR and NOVA embed t with 128 cos + 128 sin frequencies
MAX_PERIOD = 10000.0


def timestep_embedding(t: torch.Tensor, dim: int = FREQUENCY_EMBEDDING_SIZE, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoidal embedding [cos(t f_j), sin(t f_j)], f_j = MAX_PERIOD^(-j / (dim/2)); shape [*t.shape, dim].

    Computed in fp32 (fp64 when `dtype` is fp64) as the official heads do, then cast to `dtype`."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    half = dim // 2
    freqs = torch.exp(-math.log(MAX_PERIOD) * torch.arange(half, dtype=acc, device=t.device) / half)
    args = t.to(acc)[..., None] * freqs
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb.to(dtype)


def as_time_tensor(t, device: torch.device) -> torch.Tensor:
    """A diffusion time given as a Python number or a tensor, as a tensor on `device`."""
    if isinstance(t, torch.Tensor):
        return t.to(device)
    if isinstance(t, (int, float)):
        return torch.tensor(float(t), device=device)
    raise TypeError(f"t: got {type(t).__name__}, expected a number or a tensor of diffusion times")


@dataclass
class Modulation:
    """The adaLN parameters of one diffusion step for a set of tokens; depends on (z, t) only.

    blocks[i] = (shift, scale, gate) of residual block i; final = (shift, scale) of the output layer.
    Every tensor has shape [*B, N, W] (B: e.g. the 2 CFG halves); `denoise` broadcasts x's leading
    dims (seed trajectories) against *B, so one Modulation serves every trajectory without a copy.
    """

    blocks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    final: tuple[torch.Tensor, torch.Tensor]

    @property
    def shape(self) -> torch.Size:
        """[*B, N, W] of each modulation tensor."""
        return self.final[0].shape


def silu_(h: torch.Tensor) -> torch.Tensor:
    """SiLU, in place when no graph needs the input (saves one activation-sized buffer per block)."""
    return F.silu(h, inplace=not torch.is_grad_enabled())

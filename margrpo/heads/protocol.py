"""The diffusion-head protocol: what the rollout, the fused multi-seed path and the training
likelihood call on a head (margrpo.heads.multi_seed, margrpo.rollout).

The call pattern, per diffusion step t and a set of tokens with conditions z [*B, N, Dz]:

    cond = head.embed_condition(z)        # once for all steps: the step-independent part
    mod = head.modulation(cond, t)        # depends on (z, t) only: shared by every seed chain
    out = head.denoise(x, mod, backend)   # x [*L, N, C] broadcast against mod's *B -> [..., N, out]

t is a number, or a tensor broadcastable against cond's leading dims (e.g. [R, 1, 1] for R steps
in one call). The modulation is opaque to callers: only the same head's denoise reads it. A head
used for training is also an nn.Module (the trainer freezes it or gives it an optimizer group).
margrpo's SimpleMLPAdaLN and DiffusionMLP implement it; margrpo.heads.adapt wraps another
codebase's head module into it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class DiffusionHead(Protocol):
    """A per-token diffusion head split into condition embedding, modulation and denoising."""

    in_channels: int  # C: channels of a token (x)
    out_channels: int  # C, or 2C with a learned-range variance
    z_channels: int  # Dz: width of the condition from the AR model

    def embed_condition(self, z: torch.Tensor) -> Any:
        """z [*B, N, Dz] -> the step-independent part of the condition."""

    def modulation(self, cond: Any, t) -> Any:
        """The condition at diffusion time t (shared by every trajectory of the same tokens)."""

    def denoise(self, x: torch.Tensor, modulation: Any, backend: str | None = None) -> torch.Tensor:
        """x [*L, N, C] -> the head output [*broadcast(L, B), N, out_channels]. backend: None (the
        global margrpo.ops selection) or a selection for the fused ops the head calls
        (margrpo.ops.ln_modulate / gate_residual in margrpo's heads)."""

"""Pieces shared by the diffusion heads: the sinusoidal time embedding, the per-step modulation
container, and the two fused primitives (LayerNorm + modulate, gate + residual) with their backend
choice.

The fused primitives have a torch path (the reference; it carries autograd) and a Triton path
(margrpo.kernels.adaln, forward only). The Triton path is taken only with grad mode off, on CUDA
tensors, or on CPU tensors under TRITON_INTERPRET=1 when the triton backend is selected explicitly.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from margrpo.ops import _backend
from margrpo.ops._validate import broadcast_shape

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


# ------------------------------------------------------------------ fused primitives and backends
def _triton_runs_on(device: torch.device) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and _backend.triton_interpreted())


def resolve_backend(device: torch.device, backend: str | None = None) -> str:
    """'triton' or 'torch' for the head primitives on `device`.

    `backend` (or the global margrpo.ops selection when None) of 'torch' or 'triton' is obeyed; 'auto',
    'cpp' and 'cuda' (no C++/CUDA version of these kernels exists) pick triton on CUDA, torch elsewhere.
    """
    choice = _backend.get_backend() if backend is None else backend
    if choice not in ("auto",) + _backend.BACKENDS:
        raise ValueError(f"backend: got {choice!r}, expected one of auto, {', '.join(_backend.BACKENDS)}")
    if choice == "torch":
        return "torch"
    if choice == "triton":
        if not _triton_runs_on(device):
            raise RuntimeError(f"backend: 'triton' cannot run on {device.type} tensors here (needs CUDA, or TRITON_INTERPRET=1 on CPU)")
        return "triton"
    return "triton" if device.type == "cuda" and _triton_runs_on(device) else "torch"


_ADALN = None


def _adaln_kernels():
    """margrpo.kernels.adaln, imported on first use (it imports triton) and then kept: an import
    statement per call costs more host time than the launch."""
    global _ADALN
    if _ADALN is None:
        from margrpo.kernels import adaln

        _ADALN = adaln
    return _ADALN


def _use_kernels(backend: str, *tensors: torch.Tensor) -> bool:
    """Triton path: forward only, and at most 2 broadcast leading dims (deeper ones would make the
    kernels' row view copy a broadcast operand); the broadcast rank is the largest operand rank."""
    if backend != "triton" or torch.is_grad_enabled():
        return False
    return all(t.dim() <= 4 for t in tensors)


def ln_modulate(x, shift, scale, weight, bias, eps: float, backend: str) -> torch.Tensor:
    """LayerNorm(x; weight, bias, eps) * (1 + scale) + shift; shift/scale broadcast over x's seeds."""
    if _use_kernels(backend, x, shift, scale):
        return _adaln_kernels().ln_modulate(x, shift, scale, weight, bias, eps)
    normed = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return torch.addcmul(shift, normed, 1 + scale)


def gate_residual(residual, h, gate, weight, bias, eps: float, backend: str) -> torch.Tensor:
    """residual + gate * h, or residual + gate * LayerNorm(h; weight, bias, eps) when weight is given.

    With grad mode off, `residual` (the head's running hidden state) is overwritten when it already
    has the broadcast shape: the hidden state is dead after this update, so no new buffer is needed.
    """
    if _use_kernels(backend, residual, h, gate):  # forward only: in place whenever the shapes allow
        return _adaln_kernels().gate_residual(residual, h, gate, weight, bias, eps, in_place=True)
    in_place = (
        not torch.is_grad_enabled()
        and residual.is_contiguous()
        and residual.shape == broadcast_shape(residual=residual.shape, h=h.shape, gate=gate.shape)
    )
    if weight is not None:
        h = F.layer_norm(h, h.shape[-1:], weight, bias, eps)
    return residual.addcmul_(gate, h) if in_place else torch.addcmul(residual, gate, h)


def silu_(h: torch.Tensor) -> torch.Tensor:
    """SiLU, in place when no graph needs the input (saves one activation-sized buffer per block)."""
    return F.silu(h, inplace=not torch.is_grad_enabled())

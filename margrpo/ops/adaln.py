"""ln_modulate and gate_residual: the adaLN steps around the GEMMs of the diffusion heads.

The heads (margrpo/heads: MAR/Harmon SimpleMLPAdaLN, NOVA DiffusionMLP) run, per residual block,
LayerNorm + modulate before the MLP and gate + residual after it; the modulation (shift, scale,
gate) depends on the token and the diffusion step only, so one [*B, N, W] modulation serves every
seed trajectory x [*L, N, W] by broadcasting. Backends: torch (the oracle, differentiable) and
triton (forward only); a selection of cpp or cuda takes `auto`'s choice between those two. With
grad mode on, the oracle runs whatever the selection (see _factory.FusedOp, forward_only).
"""

from __future__ import annotations

import torch

from . import _backend
from ._factory import FusedOp

_MODULE = "adaln"
_BACKENDS = ("torch", "triton")


def _broadcast_like(first: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    return first.new_empty(torch.broadcast_shapes(first.shape, *(t.shape for t in others)))


_LN_MODULATE = FusedOp(
    "ln_modulate",
    _MODULE,
    ("ln_modulate_fwd",),
    "(Tensor x, Tensor shift, Tensor scale, Tensor? weight, Tensor? bias, float eps, str backend) -> Tensor",
    lambda kernels, backend, x, shift, scale, weight, bias, eps: kernels[0](x, shift, scale, weight, bias, eps),
    lambda x, shift, scale, weight, bias, eps: _broadcast_like(x, shift, scale),
    backends=_BACKENDS,
    forward_only=True,
)

_GATE_RESIDUAL = FusedOp(
    "gate_residual",
    _MODULE,
    ("gate_residual_fwd",),
    "(Tensor residual, Tensor h, Tensor gate, Tensor? weight, Tensor? bias, float eps, str backend) -> Tensor",
    # eager: into the dead hidden state when the shapes allow; a custom op must not write its input
    lambda kernels, backend, residual, h, gate, weight, bias, eps: kernels[0](residual, h, gate, weight, bias, eps, True),
    lambda residual, h, gate, weight, bias, eps: _broadcast_like(residual, h, gate),
    backends=_BACKENDS,
    forward_only=True,
    custom_forward=lambda kernels, backend, residual, h, gate, weight, bias, eps: kernels[0](residual, h, gate, weight, bias, eps, False),
)


def _check(backend: str) -> None:
    if backend not in _backend.CHOICES:  # checked even where grad mode skips the choice
        raise ValueError(f"backend: got {backend!r}, expected one of {', '.join(_backend.CHOICES)}")


# The Triton kernels address rows as [A, B, N]: more than two leading dims (a rank above 4) would
# make their row view copy a broadcast operand, so such calls take the oracle.
_DEEP = 4


def ln_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm(x; weight, bias, eps) * (1 + scale) + shift over the last dim.

    x [*Lx, N, W]; shift, scale [*Lm, N, W] (strided views are fine) broadcasting against Lx;
    weight, bias [W] or None. Returns [*broadcast(Lx, Lm), N, W] in x's dtype. backend: this call's
    selection (None: the global one of set_backend).
    """
    if backend is not None:
        _check(backend)
    if x.dim() > _DEEP or shift.dim() > _DEEP or scale.dim() > _DEEP:
        backend = "torch"
    return _LN_MODULATE.run(x.device, (x, shift, scale, weight, bias, eps), backend=backend)


def gate_residual(
    residual: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """residual + gate * h, or residual + gate * LayerNorm(h; weight, bias, eps) when weight is given.

    All three broadcast over their leading dims. With grad mode off, `residual` (the head's running
    hidden state) is overwritten and returned when it already has the broadcast shape: callers must
    not read it afterwards.
    """
    if backend is not None:
        _check(backend)
    if residual.dim() > _DEEP or h.dim() > _DEEP or gate.dim() > _DEEP:
        backend = "torch"
    return _GATE_RESIDUAL.run(residual.device, (residual, h, gate, weight, bias, eps), backend=backend)

"""Triton kernels around the GEMMs of the adaLN diffusion heads (MAR SimpleMLPAdaLN, NOVA DiffusionMLP).

Two row-wise kernels, each reading its input row once and writing its output row once:
  ln_modulate(x, shift, scale[, weight, bias]) = LayerNorm(x) * (1 + scale) + shift
  gate_residual(res, h, gate[, weight, bias])  = res + gate * h            (MAR)
                                               = res + gate * LayerNorm(h) (NOVA: affine LN first)

The modulation (shift, scale, gate) depends on the token and the diffusion step only, so it is
shared by every seed trajectory and by both CFG halves' input. The kernels address rows as
[A, B, N] with one stride per axis for every operand; a stride of 0 broadcasts, so a modulation of
shape [B, N, W] serves x of shape [A, 1, N, W] or [A, B, N, W] without a K-fold (or 2-fold) copy.

Launch helpers take tensors whose leading dims broadcast against each other (torch rules) and
return a new contiguous tensor of the broadcast shape. No autograd: the heads call these only on
no-grad paths (rollout); the torch reference path carries gradients.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ln_modulate_kernel(
    x_ptr, shift_ptr, scale_ptr, w_ptr, b_ptr, out_ptr,
    B, N, W,
    x_sa, x_sb, x_sn,
    sh_sa, sh_sb, sh_sn,
    sc_sa, sc_sb, sc_sn,
    eps,
    HAS_AFFINE: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = row % N
    b = (row // N) % B
    a = row // (N * B)
    cols = tl.arange(0, BLOCK_W)
    inside = cols < W
    acc = tl.float64 if FP64 else tl.float32

    x = tl.load(x_ptr + a * x_sa + b * x_sb + n * x_sn + cols, mask=inside, other=0.0).to(acc)
    mean = tl.sum(x, axis=0) / W
    centered = tl.where(inside, x - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / W
    y = centered / tl.sqrt(var + eps)
    if HAS_AFFINE:
        y = y * tl.load(w_ptr + cols, mask=inside, other=0.0).to(acc)
        y = y + tl.load(b_ptr + cols, mask=inside, other=0.0).to(acc)
    shift = tl.load(shift_ptr + a * sh_sa + b * sh_sb + n * sh_sn + cols, mask=inside, other=0.0).to(acc)
    scale = tl.load(scale_ptr + a * sc_sa + b * sc_sb + n * sc_sn + cols, mask=inside, other=0.0).to(acc)
    y = y * (1.0 + scale) + shift
    tl.store(out_ptr + row * W + cols, y.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _gate_residual_kernel(
    res_ptr, h_ptr, gate_ptr, w_ptr, b_ptr, out_ptr,
    B, N, W,
    r_sa, r_sb, r_sn,
    h_sa, h_sb, h_sn,
    g_sa, g_sb, g_sn,
    eps,
    HAS_NORM: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = row % N
    b = (row // N) % B
    a = row // (N * B)
    cols = tl.arange(0, BLOCK_W)
    inside = cols < W
    acc = tl.float64 if FP64 else tl.float32

    h = tl.load(h_ptr + a * h_sa + b * h_sb + n * h_sn + cols, mask=inside, other=0.0).to(acc)
    if HAS_NORM:
        mean = tl.sum(h, axis=0) / W
        centered = tl.where(inside, h - mean, 0.0)
        var = tl.sum(centered * centered, axis=0) / W
        h = centered / tl.sqrt(var + eps)
        h = h * tl.load(w_ptr + cols, mask=inside, other=0.0).to(acc)
        h = h + tl.load(b_ptr + cols, mask=inside, other=0.0).to(acc)
    gate = tl.load(gate_ptr + a * g_sa + b * g_sb + n * g_sn + cols, mask=inside, other=0.0).to(acc)
    res = tl.load(res_ptr + a * r_sa + b * r_sb + n * r_sn + cols, mask=inside, other=0.0).to(acc)
    tl.store(out_ptr + row * W + cols, (res + gate * h).to(out_ptr.dtype.element_ty), mask=inside)


def _launch_config(width: int) -> tuple[int, int]:
    """(BLOCK_W, num_warps) for one row of `width` elements per program (no autotune: heuristic)."""
    block = triton.next_power_of_2(width)
    return block, 4 if block <= 1024 else 8


def _as_rows(t: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """`t` [..., N, W] broadcast to [*lead, N, W] and viewed as [A, B, N, W] (stride 0 = broadcast).

    Lead shapes of up to 2 dims stay views; deeper ones merge the outer dims (a copy only when the
    strides do not merge)."""
    t = t.expand(*lead, *t.shape[-2:])
    if len(lead) == 0:
        return t[None, None]
    if len(lead) == 1:
        return t[None]
    if len(lead) == 2:
        return t
    return t.reshape(-1, *t.shape[-3:])


def _check(name: str, t: torch.Tensor, width: int) -> torch.Tensor:
    if t.dim() < 2 or t.shape[-1] != width:
        raise ValueError(f"{name}: got shape {tuple(t.shape)}, expected [..., N, {width}]")
    return t if t.stride(-1) == 1 else t.contiguous()


def _output(out: torch.Tensor | None, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if out.shape != shape or not out.is_contiguous():
        raise ValueError(f"out: got shape {tuple(out.shape)} (contiguous={out.is_contiguous()}), "
                         f"expected a contiguous tensor of shape {tuple(shape)}")
    return out


def _row_strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def ln_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dim (optional affine weight/bias), then y * (1 + scale) + shift.

    x [*Lx, N, W]; shift, scale [*Lm, N, W] with leading dims broadcasting against Lx. Returns a
    contiguous [*broadcast(Lx, Lm), N, W] tensor of x's dtype (written into `out` if given);
    statistics in fp32 (fp64 for fp64).
    """
    width = x.shape[-1]
    x, shift, scale = (_check(n, t, width) for n, t in (("x", x), ("shift", shift), ("scale", scale)))
    if (weight is None) != (bias is None):
        raise ValueError("weight/bias: got only one of them, expected both or neither")
    shape = torch.broadcast_shapes(x.shape, shift.shape, scale.shape)
    lead, tokens = shape[:-2], shape[-2]
    out = _output(out, shape, x)
    if out.numel() == 0:
        return out
    x4, sh4, sc4 = (_as_rows(t, lead) for t in (x, shift, scale))
    block, warps = _launch_config(width)
    affine = weight is not None
    _ln_modulate_kernel[(x4.shape[0] * x4.shape[1] * tokens,)](
        x4, sh4, sc4, weight if affine else x4, bias if affine else x4, out,
        x4.shape[1], tokens, width,
        *_row_strides(x4), *_row_strides(sh4), *_row_strides(sc4),
        float(eps),
        HAS_AFFINE=affine, FP64=x.dtype == torch.float64, BLOCK_W=block, num_warps=warps,
    )
    return out


def gate_residual(
    residual: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """residual + gate * h, or residual + gate * LayerNorm(h; weight, bias, eps) when weight is given.

    All three broadcast over their leading dims (gate [*Lm, N, W] is shared by the seeds). `out`, if
    given, must be contiguous with the broadcast shape; it may be `residual` itself (in place).
    """
    width = h.shape[-1]
    residual, h, gate = (_check(n, t, width) for n, t in (("residual", residual), ("h", h), ("gate", gate)))
    if (weight is None) != (bias is None):
        raise ValueError("weight/bias: got only one of them, expected both or neither")
    shape = torch.broadcast_shapes(residual.shape, h.shape, gate.shape)
    out = _output(out, shape, residual)
    if out.numel() == 0:
        return out
    lead, tokens = shape[:-2], shape[-2]
    r4, h4, g4 = (_as_rows(t, lead) for t in (residual, h, gate))
    block, warps = _launch_config(width)
    norm = weight is not None
    _gate_residual_kernel[(r4.shape[0] * r4.shape[1] * tokens,)](
        r4, h4, g4, weight if norm else h4, bias if norm else h4, out,
        r4.shape[1], tokens, width,
        *_row_strides(r4), *_row_strides(h4), *_row_strides(g4),
        float(eps),
        HAS_NORM=norm, FP64=h.dtype == torch.float64, BLOCK_W=block, num_warps=warps,
    )
    return out

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
return a new contiguous tensor of the broadcast shape. No autograd: the public ops
(margrpo/ops/adaln.py) call these only with grad mode off (rollout); the torch oracle
(margrpo/ops/oracle.py) carries gradients. `ln_modulate_fwd` and `gate_residual_fwd` are the
kernel-level functions of the ops' contract (docs/CONTRACTS.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from margrpo.ops._validate import broadcast_shape

# B and N change with every mask step (tokens revealed, trajectories, CFG halves) and only index rows,
# so Triton must not compile a variant per value class (1, a multiple of 16, other); see _util.py
ROW_COUNTS = ["B", "N"]


@triton.jit(do_not_specialize=ROW_COUNTS)
def _ln_modulate_kernel(
    x_ptr,
    shift_ptr,
    scale_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    B,
    N,
    W,
    x_sa,
    x_sb,
    x_sn,
    sh_sa,
    sh_sb,
    sh_sn,
    sc_sa,
    sc_sb,
    sc_sn,
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


@triton.jit(do_not_specialize=ROW_COUNTS)
def _gate_residual_kernel(
    res_ptr,
    h_ptr,
    gate_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    B,
    N,
    W,
    r_sa,
    r_sb,
    r_sn,
    h_sa,
    h_sb,
    h_sn,
    g_sa,
    g_sb,
    g_sn,
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


@dataclass(frozen=True)
class _Plan:
    """How to launch a kernel for one layout of its three row operands (derived once, then cached).

    shape: the broadcast output shape; rows: programs, one per row of W elements; inner: B of the
    [A, B, N] row grid; strides: (a, b, n) element strides of each operand (0 on a broadcast axis);
    first_is_output: the first operand is contiguous with the output's shape (it may be written in
    place); rework: the operands need a copy or a reshape first (a non-unit last stride, or more
    than two leading dims)."""

    shape: tuple[int, ...]
    rows: int
    inner: int
    strides: tuple[int, ...]
    block: int
    warps: int
    first_is_output: bool
    rework: bool


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=1024)
def _plan(names: tuple[str, str, str], *layouts: tuple[int, ...]) -> _Plan:
    """The plan of operands named `names` with layouts (shape0, stride0, shape1, stride1, shape2,
    stride2). A head makes the same dozen layouts at every diffusion step, so this runs a dozen
    times per rollout and the launch helpers cost a cache lookup per call."""
    shapes, strides = layouts[0::2], layouts[1::2]
    width = shapes[0][-1] if shapes[0] else 0
    for name, shape in zip(names, shapes):
        if len(shape) < 2 or shape[-1] != width:
            raise ValueError(f"{name}: got shape {tuple(shape)}, expected [..., N, {width}]")
    shape = broadcast_shape(**dict(zip(names, shapes)))
    lead, tokens = shape[:-2], shape[-2]
    rows = tokens
    for size in lead:
        rows *= size
    per_operand = []
    for sizes, steps in zip(shapes, strides):
        missing = 4 - len(sizes)  # lead dims the operand lacks: broadcast
        outer = [0 if size == 1 else step for size, step in zip(sizes[:-2], steps[:-2])]
        per_operand += [0] * missing + outer + [0 if sizes[-2] == 1 else steps[-2]]
    block = 1 << (width - 1).bit_length()  # next power of two (triton's helper is a jit call)
    first_is_output = tuple(shapes[0]) == shape and tuple(strides[0]) == _contiguous_strides(shape)
    rework = len(lead) > 2 or any(steps[-1] != 1 for steps in strides)
    return _Plan(shape, rows, lead[-1] if lead else 1, tuple(per_operand), block, 4 if block <= 1024 else 8, first_is_output, rework)


def _reworked(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` with a unit last stride, its leading dims merged to two when `shape` has more (a copy only
    when the strides do not merge)."""
    t = t if t.stride(-1) == 1 else t.contiguous()
    if len(shape) > 4:
        t = t.expand(*shape[:-2], *t.shape[-2:]).reshape(-1, *shape[-3:])
    return t


def _launch(
    kernel,
    flag: str,
    names: tuple[str, str, str],
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weight,
    bias,
    eps: float,
    out: torch.Tensor | None,
    in_place: bool = False,
) -> torch.Tensor:
    """Run `kernel` over the rows of operands a, b, c (flag: its constexpr switching weight/bias on)."""
    if (weight is None) != (bias is None):
        raise ValueError("weight/bias: got only one of them, expected both or neither")
    plan = _plan(names, a.shape, a.stride(), b.shape, b.stride(), c.shape, c.stride())
    if in_place and plan.first_is_output:
        out = a
    elif out is None:
        out = torch.empty(plan.shape, dtype=a.dtype, device=a.device)
    elif out.shape != plan.shape or not out.is_contiguous():
        raise ValueError(
            f"out: got shape {tuple(out.shape)} (contiguous={out.is_contiguous()}), expected a contiguous tensor of shape {plan.shape}"
        )
    if plan.rows == 0:
        return out
    launch = plan
    if plan.rework:  # the output keeps its shape; the kernel only sees its base pointer
        a, b, c = (_reworked(t, plan.shape) for t in (a, b, c))
        launch = _plan(names, a.shape, a.stride(), b.shape, b.stride(), c.shape, c.stride())
    affine = weight is not None
    kernel[(launch.rows,)](
        a,
        b,
        c,
        weight if affine else a,
        bias if affine else a,
        out,
        launch.inner,
        launch.shape[-2],
        launch.shape[-1],
        *launch.strides,
        float(eps),
        **{flag: affine},
        FP64=a.dtype == torch.float64,
        BLOCK_W=launch.block,
        num_warps=launch.warps,
    )
    return out


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
    return _launch(_ln_modulate_kernel, "HAS_AFFINE", ("x", "shift", "scale"), x, shift, scale, weight, bias, eps, out)


def gate_residual(
    residual: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    out: torch.Tensor | None = None,
    in_place: bool = False,
) -> torch.Tensor:
    """residual + gate * h, or residual + gate * LayerNorm(h; weight, bias, eps) when weight is given.

    All three broadcast over their leading dims (gate [*Lm, N, W] is shared by the seeds). `out`, if
    given, must be contiguous with the broadcast shape; it may be `residual` itself. in_place: write
    into `residual` whenever it is contiguous with the broadcast shape (else into a new tensor).
    """
    return _launch(_gate_residual_kernel, "HAS_NORM", ("residual", "h", "gate"), residual, h, gate, weight, bias, eps, out, in_place)


def ln_modulate_fwd(x, shift, scale, weight, bias, eps: float) -> torch.Tensor:
    """The kernel-level ln_modulate of margrpo.ops.oracle."""
    return ln_modulate(x, shift, scale, weight, bias, eps)


def gate_residual_fwd(residual, h, gate, weight, bias, eps: float, in_place: bool) -> torch.Tensor:
    """The kernel-level gate_residual of margrpo.ops.oracle (in_place: into `residual` when it has
    the output's shape)."""
    return gate_residual(residual, h, gate, weight, bias, eps, in_place=in_place)

"""ops.consistency_mask on every backend: cos(cur, final) - cos(prev, final) > threshold."""

from __future__ import annotations

import pytest
import torch
from conftest import TOLERANCE, randn

import margrpo.ops as ops

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
MODULE, KERNEL = "consistency", "consistency_mask_fwd"
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def cosine(a, b):
    """Float64 cosine over the last dim; 0 when either vector has zero norm."""
    a, b = a.double().cpu(), b.double().cpu()
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    zero = (na == 0) | (nb == 0)
    return torch.where(zero, 0.0, (a * b).sum(-1) / torch.where(zero, 1.0, na * nb))


def improvement(prev, cur, final):
    return cosine(cur, final) - cosine(prev, final)


def check(prev, cur, final, threshold, dtype):
    """Equal to the float64 decision wherever the improvement is not within rounding of the threshold
    (half inputs compute in float32 on their rounded values, so float32 rounding is the margin)."""
    out = ops.consistency_mask(prev, cur, final, threshold)
    gain = improvement(prev, cur, final)
    assert out.dtype == torch.bool and out.shape == gain.shape
    decided = (gain - threshold).abs() > 10 * TOLERANCE[F64 if dtype == F64 else F32]
    assert decided.float().mean() > 0.9  # the comparison below covers nearly every position
    assert torch.equal(out.cpu()[decided], (gain > threshold)[decided])


# (leading dims, C, dtype, threshold)
CASES = [
    ((1, 1), 2, F64, 0.0),
    ((3, 5), 1, F32, 0.5),  # one channel: cosines are +-1, gains -2, 0 or 2
    ((2, 7), 3, F32, 0.0),
    ((3, 33), 16, BF16, 0.1),
    ((2, 5), 17, F16, -0.2),
    ((33,), 16, F32, 0.05),
    ((2, 3, 7), 4, F64, 0.0),
]


@pytest.mark.parametrize("lead, C, dtype, threshold", CASES)
def test_matches_reference(backend, gen, lead, C, dtype, threshold):
    backend.require(MODULE, KERNEL)
    prev, cur, final = (randn(gen, *lead, C, dtype=dtype, device=backend.device) for _ in range(3))
    check(prev, cur, final, threshold, dtype)


def test_mixed_dtypes_and_non_contiguous_views(backend, gen):
    backend.require(MODULE, KERNEL)
    dev = backend.device
    prev = randn(gen, 16, 9, device=dev).t()  # [9, 16] transposed, float64
    cur = randn(gen, 9, 32, dtype=F32, device=dev)[:, ::2]  # strided slice
    final = randn(gen, 9, 16, dtype=BF16, device=dev)
    assert not prev.is_contiguous() and not cur.is_contiguous()
    check(prev, cur, final, 0.0, F32)


def test_large_magnitudes(backend, gen):
    """Cosines are scale-free: latents of norm ~1e4 or ~1e-3 decide as the float64 reference."""
    backend.require(MODULE, KERNEL)
    scale = torch.tensor([1e4, 1e-3, 1.0], dtype=F64)[:, None, None]
    prev, cur, final = ((randn(gen, 3, 11, 16) * scale).to(backend.device, F32) for _ in range(3))
    check(prev, cur, final, 0.0, F32)


def test_zero_norm_vectors_have_cosine_zero(backend):
    backend.require(MODULE, KERNEL)
    z, a, b = [0.0, 0.0], [1.0, 0.0], [0.6, 0.8]
    # rows: prev zero (cos 0 -> gain = cos(cur, final)); cur zero (gain = -cos(prev, final));
    # final zero (both cosines 0, gain exactly 0); all zero
    prev = torch.tensor([z, a, a, z, z], device=backend.device)
    cur = torch.tensor([b, z, b, z, [-0.6, -0.8]], device=backend.device)
    final = torch.tensor([b, b, z, z, b], device=backend.device)
    assert ops.consistency_mask(prev, cur, final, 0.0).cpu().tolist() == [True, False, False, False, False]
    assert ops.consistency_mask(prev, cur, final, -0.7).cpu().tolist() == [True, True, True, True, False]
    assert ops.consistency_mask(prev, cur, final, -0.5).cpu().tolist() == [True, False, True, True, False]


def test_threshold_is_strict(backend, gen):
    """An improvement exactly equal to the threshold is not kept."""
    backend.require(MODULE, KERNEL)
    prev = randn(gen, 4, 6, 3, device=backend.device)
    final = randn(gen, 4, 6, 3, device=backend.device)
    same = prev.clone()  # cur == prev: the gain is exactly 0 in any implementation
    assert not ops.consistency_mask(prev, same, final, 0.0).any()
    assert ops.consistency_mask(prev, same, final, -1e-12).all()
    # cur = final gives gain 1 - cos(prev, final) > 0 unless prev is parallel to final
    assert ops.consistency_mask(prev, final, final, 0.0).all()
    assert not ops.consistency_mask(prev, final, final, 2.0).any()


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3)])
def test_empty_positions(backend, shape):
    t = torch.zeros(shape, device=backend.device)
    out = ops.consistency_mask(t, t, t)
    assert out.shape == shape[:-1] and out.dtype == torch.bool


def test_opcheck(backend, gen):
    backend.require(MODULE, KERNEL)
    prev, cur, final = (randn(gen, 7, 3, device=backend.device) for _ in range(3))
    torch.library.opcheck(torch.ops.margrpo.consistency_mask.default, (prev, cur, final, 0.0, backend.name))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(cur=torch.ones(2, 4, 4)), ValueError, r"cur: got shape \(2, 4, 4\), expected \(2, 4, 3\)"),
        (dict(final=torch.ones(2, 3)), ValueError, r"final: got shape \(2, 3\), expected \(2, 4, 3\)"),
        (dict(prev=torch.ones(()), cur=torch.ones(()), final=torch.ones(())), ValueError, r"prev: got shape \(\)"),
        (dict(prev=torch.ones(2, 4, 3, dtype=torch.int64)), TypeError, "prev: got dtype torch.int64"),
        (dict(final=torch.ones(2, 4, 3, dtype=torch.bool)), TypeError, "final: got dtype torch.bool"),
        (dict(threshold="0"), TypeError, "threshold: got str"),
        (dict(threshold=float("nan")), ValueError, "threshold: got nan"),
        (dict(cur=torch.ones(2, 4, 3, device="meta")), ValueError, "prev, cur, final: expected one device"),
        (dict(prev=torch.ones(2, 0), cur=torch.ones(2, 0), final=torch.ones(2, 0)), ValueError, "at least one channel"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = dict(prev=torch.ones(2, 4, 3), cur=torch.ones(2, 4, 3), final=torch.ones(2, 4, 3)) | kwargs
    with pytest.raises(error, match=match):
        ops.consistency_mask(**args)

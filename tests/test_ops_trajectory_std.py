"""ops.trajectory_std on every backend against float64 torch.std, its gradient, edge cases and errors."""

from __future__ import annotations

import pytest
import torch
from conftest import TOLERANCE, assert_close, randn

import margrpo.ops as ops

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
MODULE, KERNELS = "trajectory_std", ("trajectory_std_fwd", "trajectory_std_bwd")
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def expected_std(samples):
    return samples.std(dim=0, unbiased=False).mean(-1)


def check_against_expected(samples, dtype, scale=1.0, grads=True):
    out = ops.trajectory_std(samples)
    ref_samples = samples.detach().double().requires_grad_()
    ref = expected_std(ref_samples)
    assert out.shape == ref.shape and out.dtype == (F64 if dtype == F64 else F32)
    assert_close(out, ref, dtype, scale)
    if grads:
        grad_out = torch.randn(ref.shape, dtype=torch.float64).to(ref.device)  # on the backend's device
        torch.autograd.backward(out, grad_out.to(out))
        torch.autograd.backward(ref, grad_out)
        assert samples.grad.shape == samples.shape and samples.grad.dtype == samples.dtype
        assert_close(samples.grad, ref_samples.grad, dtype)


# (K, positions, C, dtype): odd sizes, no position dims (0-d result), every dtype
CASES = [
    (2, (1,), 1, F64),
    (3, (7,), 3, F32),
    (5, (33,), 16, BF16),
    (4, (2, 5), 17, F16),
    (2, (), 16, F32),
    (3, (33,), 17, F64),
    (5, (7,), 1, F32),
]


@pytest.mark.parametrize("K, positions, C, dtype", CASES)
def test_matches_reference(backend, gen, K, positions, C, dtype):
    backend.require(MODULE, *KERNELS)
    samples = randn(gen, K, *positions, C, dtype=dtype, device=backend.device).requires_grad_()
    check_against_expected(samples, dtype)


def test_non_contiguous_input(backend, gen):
    backend.require(MODULE, *KERNELS)
    samples = randn(gen, 5, 9, 3, device=backend.device).permute(2, 1, 0).detach().requires_grad_()  # [3, 9, 5]
    assert not samples.is_contiguous()
    check_against_expected(samples, F64)


def test_agreeing_seeds_give_zero_std_and_zero_gradient(backend, gen):
    """Where all K seeds agree the std is 0 and its gradient is defined as 0 (not NaN). The agreeing
    values are dyadic with K = 4, so every way of computing the mean is exact and so is the zero."""
    backend.require(MODULE, *KERNELS)
    samples = randn(gen, 4, 5, 2, device=backend.device)
    samples[:, 1] = torch.tensor([0.75, -3.5], dtype=F64, device=backend.device)  # position 1 agrees in every channel
    samples[:, 2, 0] = 5.0  # position 2 agrees in one channel only
    samples[:, 3] = samples[0, 3]  # generic agreeing values: zero up to rounding of the mean
    samples.requires_grad_()
    out = ops.trajectory_std(samples)
    out.sum().backward()
    assert out[1].item() == 0.0 and torch.all(samples.grad[:, 1] == 0)
    assert torch.all(samples.grad[:, 2, 0] == 0) and torch.isfinite(samples.grad).all()
    assert_close(out, expected_std(samples.detach()), F64)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_large_magnitudes(backend, gen, dtype):
    """Latents offset by 1e4 with spreads 1e-3..1e3: the error stays at the conditioning limit
    (rounding of the offset, absolute tolerance scaled by it), with no overflow or cancellation blow-up."""
    backend.require(MODULE, *KERNELS)
    spread = torch.logspace(-3, 3, 7, dtype=torch.float64)[:, None]  # one spread per position
    samples = (1e4 + spread * randn(gen, 4, 7, 3)).to(device=backend.device, dtype=dtype)
    check_against_expected(samples, dtype, scale=1e4, grads=False)
    huge = randn(gen, 3, 5, 4, dtype=dtype, device=backend.device, scale=1e4)
    check_against_expected(huge, dtype, scale=1.0, grads=False)


@pytest.mark.parametrize("offset", [1e5, 1e4])
@pytest.mark.parametrize("dtype", [F64, F32, BF16, F16])
def test_large_offset_small_spread(backend, gen, offset, dtype):
    """Latents at a large offset with a small spread (1e-2; a few ulps of the offset in half
    precision, below which the samples all round to the offset). Two-pass moments on the samples
    themselves lose the spread to the rounding of the mean (relative error 0.2 at 1e5 in fp32); on the
    differences from trajectory 0 the result keeps the accuracy of the compute dtype. The float64
    expectation is taken on those differences too, exact in float64: torch.std of the samples is off
    by 2e-10 there."""
    if dtype == F16 and offset > torch.finfo(F16).max:
        pytest.skip("float16 does not reach the offset")
    backend.require(MODULE, *KERNELS)
    spread = 1e-2 if dtype in (F64, F32) else 4 * offset * torch.finfo(dtype).eps
    samples = randn(gen, 4, 37, 16, scale=spread, shift=offset).to(device=backend.device, dtype=dtype)
    samples.requires_grad_()
    out = ops.trajectory_std(samples)
    exact = samples.detach().double().cpu().requires_grad_()
    ref = expected_std(exact - exact[:1])
    compute_tol = TOLERANCE[F64 if dtype == F64 else F32]
    assert (out.detach().cpu().double() / ref - 1).abs().max() < compute_tol
    grad_out = randn(gen, *ref.shape)
    torch.autograd.backward(out, grad_out.to(out))
    torch.autograd.backward(ref, grad_out)
    # the gradient is returned in the input dtype: its rounding bounds the error
    error = (samples.grad.cpu().double() - exact.grad).abs().max() / exact.grad.abs().max()
    assert error < TOLERANCE[dtype]


@pytest.mark.parametrize("shape", [(3, 0, 4), (2, 4, 0, 5)])
def test_empty_positions(backend, shape):
    samples = torch.zeros(shape, device=backend.device, requires_grad=True)
    out = ops.trajectory_std(samples)
    assert out.shape == shape[1:-1] and out.dtype == F32
    out.sum().backward()
    assert samples.grad.shape == shape


def test_gradcheck_torch_backend(gen):
    samples = randn(gen, 3, 2, 5, 4).requires_grad_()
    with ops.use_backend("torch"):
        assert torch.autograd.gradcheck(ops.trajectory_std, (samples,))


def test_opcheck(backend, gen):
    backend.require(MODULE, *KERNELS)
    samples = randn(gen, 3, 5, 4, device=backend.device).requires_grad_()
    torch.library.opcheck(torch.ops.margrpo.trajectory_std.default, (samples, backend.name))
    args = (randn(gen, 5, device=backend.device), samples.detach(), backend.name)
    torch.library.opcheck(torch.ops.margrpo.trajectory_std_backward.default, args)


@pytest.mark.parametrize(
    "samples, error, match",
    [
        (torch.ones(1, 4, 3), ValueError, r"samples: got K=1 trajectories .* expected K >= 2"),
        (torch.ones(4), ValueError, r"samples: got shape \(4,\) \(1-d\), expected \[K, ..., C\]"),
        (torch.ones(3, 4, 3, dtype=torch.int64), TypeError, "samples: got dtype torch.int64"),
        (torch.ones(3, 4, 0), ValueError, "samples: got shape .* at least one channel"),
        (None, TypeError, "samples: got NoneType"),
    ],
)
def test_bad_input(samples, error, match):
    with pytest.raises(error, match=match):
        ops.trajectory_std(samples)

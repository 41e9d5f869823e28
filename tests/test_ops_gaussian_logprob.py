"""ops.gaussian_logprob on every backend against a float64 closed form, its gradients, policy and errors."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close, randn

import margrpo.ops as ops

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
MODULE, KERNELS = "gaussian_logprob", ("gaussian_logprob_fwd", "gaussian_logprob_bwd")
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def expected_logprob(x, mean, std, reduce):
    """The textbook density in float64, broadcasting std; differentiable (for expected gradients)."""
    std = torch.as_tensor(std, dtype=torch.float64)
    elem = -0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return {"none": elem, "sum": elem.sum(-1), "mean": elem.mean(-1)}[reduce]


def make_std(form, gen, rows, C, dtype, device, low=0.5, high=2.0):
    """A positive std in one of the accepted forms, log-uniform in [low, high]."""

    def draw(shape):
        u = torch.rand(shape, generator=gen, dtype=torch.float64)
        return torch.exp(math.log(low) + u * (math.log(high) - math.log(low))).to(device=device, dtype=dtype)

    if form == "float":
        return float(draw(()))
    shape = {"0d": (), "row": (*rows, 1), "element": (*rows, C), "channel": (C,)}[form]
    return draw(shape).requires_grad_()


def leaves(*tensors):
    return [t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]


def check_against_expected(x, mean, std, reduce, dtype):
    """Forward and gradients of the selected backend against the float64 closed form evaluated on
    the same (already rounded) inputs."""
    out = ops.gaussian_logprob(x, mean, std, reduce)
    ref_inputs = [t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in (x, mean, std)]
    ref = expected_logprob(*ref_inputs, reduce)
    assert out.shape == ref.shape and out.dtype == (F64 if dtype == F64 else F32)
    assert_close(out, ref, dtype)

    grad_out = torch.randn(ref.shape, dtype=torch.float64).to(ref.device)  # on the backend's device
    torch.autograd.backward(out, grad_out.to(out))
    torch.autograd.backward(ref, grad_out)
    for got, want in zip(leaves(x, mean, std), leaves(*ref_inputs)):
        assert got.grad is not None and got.grad.shape == want.shape and got.grad.dtype == got.dtype
        assert_close(got.grad, want.grad, dtype)


# (leading dims, C, dtype, std form, reduce): every size, dtype, std form and reduce appears
CASES = [
    ((1,), 1, F64, "float", "sum"),
    ((7,), 3, F32, "0d", "mean"),
    ((33,), 16, BF16, "row", "none"),
    ((5,), 17, F16, "element", "sum"),
    ((3, 11), 16, F32, "channel", "sum"),
    ((7,), 17, F64, "row", "mean"),
    ((33,), 1, F32, "element", "none"),
    ((2, 3, 5), 3, F64, "element", "sum"),
    ((33,), 16, F16, "float", "mean"),
    ((1,), 16, BF16, "0d", "sum"),
    ((7,), 3, F32, "row", "sum"),
]


@pytest.mark.parametrize("rows, C, dtype, std_form, reduce", CASES)
def test_matches_reference(backend, gen, rows, C, dtype, std_form, reduce):
    backend.require(MODULE, *KERNELS)
    dev = backend.device
    x = randn(gen, *rows, C, dtype=dtype, device=dev).requires_grad_()
    mean = randn(gen, *rows, C, dtype=dtype, device=dev).requires_grad_()
    std = make_std(std_form, gen, rows, C, dtype, dev)
    check_against_expected(x, mean, std, reduce, dtype)


@pytest.mark.parametrize("std_form", ["row", "element"])
def test_non_contiguous_inputs(backend, gen, std_form):
    backend.require(MODULE, *KERNELS)
    dev, R, C = backend.device, 9, 5
    x = randn(gen, C, R, device=dev).t().requires_grad_()  # transposed view
    mean = randn(gen, R, 2 * C, device=dev)[:, ::2].detach().requires_grad_()  # strided slice
    width = 1 if std_form == "row" else C
    std = (torch.rand(2 * R, width, generator=gen, dtype=torch.float64).to(dev) + 0.5)[::2].requires_grad_()
    assert not x.is_contiguous() and not mean.is_contiguous() and not std.is_contiguous()
    check_against_expected(x, mean, std, "sum", F64)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("mean_near_x", [True, False], ids=["mean_near_x", "mean_far"])
def test_large_magnitudes(backend, gen, dtype, mean_near_x):
    """x ~ 1e4 and std spanning 1e-3..1e3 per element: no overflow, fp32-level relative error."""
    backend.require(MODULE, *KERNELS)
    dev, R, C = backend.device, 6, 7
    std = make_std("element", gen, (R,), C, dtype, dev, low=1e-3, high=1e3)
    x = randn(gen, R, C, dtype=dtype, device=dev, scale=1e4).requires_grad_()
    if mean_near_x:
        mean = (x.detach().double() + 3.0 * std.detach().double() * randn(gen, R, C, device=dev)).to(dtype)
    else:
        mean = randn(gen, R, C, dtype=dtype, device=dev, scale=1e4)
    check_against_expected(x, mean.requires_grad_(), std, "sum", dtype)


@pytest.mark.parametrize("shape", [(0, 4), (2, 0, 4)])
@pytest.mark.parametrize("reduce", ["sum", "none"])
def test_empty_rows(backend, shape, reduce):
    x = torch.zeros(shape, device=backend.device, requires_grad=True)
    std = torch.ones(*shape[:-1], 1, device=backend.device, requires_grad=True)
    out = ops.gaussian_logprob(x, torch.zeros(shape, device=backend.device), std, reduce)
    assert out.shape == (shape if reduce == "none" else shape[:-1]) and out.dtype == F32
    out.sum().backward()
    assert x.grad.shape == shape and std.grad.shape == std.shape


@pytest.mark.parametrize("reduce", ["sum", "mean", "none"])
@pytest.mark.parametrize("std_form", ["0d", "row", "element", "channel"])
def test_gradcheck_torch_backend(gen, reduce, std_form):
    x = randn(gen, 3, 4).requires_grad_()
    mean = randn(gen, 3, 4).requires_grad_()
    std = make_std(std_form, gen, (3,), 4, F64, "cpu")
    with ops.use_backend("torch"):
        assert torch.autograd.gradcheck(lambda a, b, s: ops.gaussian_logprob(a, b, s, reduce), (x, mean, std))


@pytest.mark.parametrize("per_row", [True, False], ids=["row", "element"])
def test_nonpositive_std_policy(backend, gen, per_row):
    """One policy on every backend: an error naming std and the count by default; NaN exactly there
    on the sync-free path (check_std=False)."""
    backend.require(MODULE, "gaussian_logprob_fwd")
    dev, R, C = backend.device, 5, 3
    x, mean = randn(gen, R, C, device=dev), randn(gen, R, C, device=dev)
    std = torch.rand(R, 1 if per_row else C, generator=gen, dtype=torch.float64).to(dev) + 0.5
    std[1, 0], std[3, 0] = 0.0, -1.0
    count = "2 of 5" if per_row else "2 of 15"
    for reduce in ("none", "sum"):
        with pytest.raises(ValueError, match=f"std: {count} values .* <= 0.*check_std=False"):
            ops.gaussian_logprob(x, mean, std, reduce)
    with pytest.raises(ValueError, match=f"std: {R} of {R}"):  # a deterministic step's std = 0, as a float
        ops.gaussian_logprob(x, mean, 0.0)
    out = ops.gaussian_logprob(x, mean, std, "none", check_std=False).cpu()
    bad = (std <= 0).expand(R, C).cpu()
    assert torch.isnan(out[bad]).all() and torch.isfinite(out[~bad]).all()
    summed = ops.gaussian_logprob(x, mean, std, "sum", check_std=False).cpu()
    assert torch.equal(torch.isnan(summed), bad.any(-1))


def test_opcheck(backend, gen):
    backend.require(MODULE, *KERNELS)
    dev = backend.device
    x = randn(gen, 5, 3, device=dev).requires_grad_()
    mean = randn(gen, 5, 3, device=dev).requires_grad_()
    for std in (torch.rand(5, 1, dtype=F64, device=dev) + 0.5, torch.rand(5, 3, dtype=F64, device=dev) + 0.5):
        std.requires_grad_()
        for check_std in (True, False):
            torch.library.opcheck(torch.ops.margrpo.gaussian_logprob.default, (x, mean, std, 1, check_std, backend.name))
        grad_out = randn(gen, 5, device=dev)
        args = (grad_out, x.detach(), mean.detach(), std.detach(), 1, backend.name)
        torch.library.opcheck(torch.ops.margrpo.gaussian_logprob_backward.default, args)


def _x(*shape, dtype=F32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(reduce="max"), ValueError, "reduce: got 'max'"),
        (dict(x=_x(2, 3, dtype=torch.int64)), TypeError, "x: got dtype torch.int64"),
        (dict(x=[1.0, 2.0]), TypeError, "x: got list"),
        (dict(x=_x(), mean=_x()), ValueError, r"x: got shape \(\)"),
        (dict(mean=_x(2, 4)), ValueError, r"mean: got shape \(2, 4\), expected \(2, 3\)"),
        (dict(mean=_x(2, 3, dtype=torch.int32)), TypeError, "mean: got dtype"),
        (dict(std=_x(2, 2)), ValueError, r"std: got shape \(2, 2\)"),
        (dict(std=_x(1, 2, 3)), ValueError, r"std: got shape \(1, 2, 3\)"),
        (dict(std=_x(2, 1, dtype=torch.int64)), TypeError, "std: got dtype torch.int64"),
        (dict(std="1.0"), TypeError, "std: got str"),
        (dict(mean=_x(2, 3, device="meta")), ValueError, "x, mean, std: expected one device"),
        (dict(x=_x(2, 0), mean=_x(2, 0)), ValueError, "x: got shape .* at least one channel"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = dict(x=_x(2, 3), mean=_x(2, 3), std=_x(2, 1), reduce="sum") | kwargs
    with pytest.raises(error, match=match):
        ops.gaussian_logprob(**args)

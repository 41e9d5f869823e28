"""The two routes from a public op to its kernels (see margrpo/ops/_kernels.py): direct calls in
eager mode, and the torch.library custom op under torch.compile, dispatch modes and torch.func.
Both are checked against the float64 expectations of the op test files, on every backend."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pytest
import test_ops_consistency as consistency_tests
import test_ops_gaussian_logprob as gaussian_tests
import test_ops_grpo_surrogate as grpo_tests
import test_ops_topk as topk_tests
import test_ops_trajectory_std as trajectory_tests
import torch
from conftest import randn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import margrpo.ops as ops
from margrpo.ops import _kernels, oracle

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
F64, F32 = torch.float64, torch.float32


# every public op's FusedOp (margrpo/ops/_factory.py), which holds its custom ops
def _module(name: str):
    return importlib.import_module(f"margrpo.ops.{name}")  # (margrpo.ops.<name> is the public function)


FUSED_OPS = [
    _module("gaussian_logprob")._OP,
    _module("trajectory_std")._OP,
    *_module("topk")._OPS.values(),
    _module("consistency")._OP,
    _module("grpo_surrogate")._OP,
]


@dataclass
class Path:
    name: str  # "direct" or "custom_op"
    calls: list[str] = field(default_factory=list)  # the custom ops the public ops went through

    def check_taken(self) -> None:
        if self.name == "direct":
            assert self.calls == [], f"eager calls went through the custom ops {self.calls}"
        else:
            assert self.calls, "no custom op was called"


@pytest.fixture(params=["direct", "custom_op"])
def path(request, monkeypatch) -> Path:
    """Each route in turn (the custom op forced as if under torch.compile), with every custom op
    wrapped to record its calls."""
    taken = Path(request.param)
    for fused in FUSED_OPS:
        for attr in ("custom_op", "backward_op"):
            custom_op = getattr(fused, attr)
            if custom_op is not None:
                name = f"{fused.name}.{attr}"
                monkeypatch.setattr(fused, attr, lambda *a, _op=custom_op, _n=name: taken.calls.append(_n) or _op(*a))
    if request.param == "custom_op":
        monkeypatch.setattr(_kernels, "direct_call_allowed", lambda: False)
    return taken


@pytest.mark.parametrize(
    "rows, C, dtype, std_form, reduce",
    [((2, 5), 3, F64, "row", "sum"), ((7,), 16, F32, "element", "none"), ((3, 4), 5, F64, "channel", "mean"),
     ((6,), 4, F64, "float", "sum"), ((2, 3), 4, F64, "0d", "none")],
)  # fmt: skip
def test_gaussian_logprob(backend, path, gen, rows, C, dtype, std_form, reduce):
    backend.require(gaussian_tests.MODULE, *gaussian_tests.KERNELS)
    dev = backend.device
    x = randn(gen, *rows, C, dtype=dtype, device=dev).requires_grad_()
    mean = randn(gen, *rows, C, dtype=dtype, device=dev).requires_grad_()
    std = gaussian_tests.make_std(std_form, gen, rows, C, dtype, dev)
    gaussian_tests.check_against_expected(x, mean, std, reduce, dtype)
    path.check_taken()


@pytest.mark.parametrize("K, positions, C, dtype", [(3, (2, 5), 3, F64), (4, (9,), 16, F32)])
def test_trajectory_std(backend, path, gen, K, positions, C, dtype):
    backend.require(trajectory_tests.MODULE, *trajectory_tests.KERNELS)
    samples = randn(gen, K, *positions, C, dtype=dtype, device=backend.device).requires_grad_()
    trajectory_tests.check_against_expected(samples, dtype)
    path.check_taken()


def test_topk(backend, path, gen):
    backend.require(topk_tests.MODULE, "topk_mask_fwd", "topk_indices_fwd")
    topk_tests.check(randn(gen, 2, 20, dtype=F32, device=backend.device), 6, ratio=0.3)
    topk_tests.check(topk_tests.tied_scores(gen, 2, 9, F64, backend.device), 4, k=4)
    with pytest.raises(ValueError, match="scores: got 1 NaN values"):
        ops.topk_mask(torch.tensor([[0.0, float("nan")]], device=backend.device), k=1)
    path.check_taken()


def test_consistency_mask(backend, path, gen):
    backend.require(consistency_tests.MODULE, consistency_tests.KERNEL)
    prev, cur, final = (randn(gen, 3, 11, 8, device=backend.device) for _ in range(3))
    consistency_tests.check(prev, cur, final, 0.05, F64)
    consistency_tests.check(prev.float(), cur, final.float(), -0.1, F32)  # mixed dtypes
    path.check_taken()


@pytest.mark.parametrize("float_mask, aggregation", [(False, "token_mean"), (True, "token_mean"), (True, "sample_mean")])
def test_grpo_surrogate(backend, path, gen, float_mask, aggregation):
    backend.require(grpo_tests.MODULE, grpo_tests.KERNEL)
    dev, T, B, L = backend.device, 3, 4, 9
    logp, old, advantages = grpo_tests.inputs(gen, T, B, L, F64, dev)
    keep = torch.rand(B, L, generator=gen) > 0.3
    mask = (keep * torch.rand(B, L, generator=gen)).to(dev) if float_mask else keep.to(dev)
    mte = (torch.rand(B, L, generator=gen) > 0.5).to(dev)
    grpo_tests.check(logp, old, advantages, mask, 0.2, 0.28, mte, aggregation)
    path.check_taken()


def test_empty_inputs(backend, path):
    """No rows: both routes return the oracle's empty results (and gradients) with no launch."""
    dev = backend.device
    x = torch.zeros(0, 4, device=dev, requires_grad=True)
    out = ops.gaussian_logprob(x, x, 1.0)
    out.sum().backward()
    assert out.shape == (0,) and x.grad.shape == (0, 4)
    assert ops.trajectory_std(torch.zeros(3, 0, 2, device=dev)).shape == (0,)
    assert ops.topk_indices(torch.zeros(0, 5, device=dev), k=2).shape == (0, 2)
    assert ops.consistency_mask(x, x, x).shape == (0,)
    path.check_taken()


def test_no_grad_and_double_backward(backend, path, gen):
    """Under no_grad the outputs carry no graph; a second derivative fails on both routes with the
    same error (the backward kernels have no derivative of their own)."""
    backend.require(gaussian_tests.MODULE, *gaussian_tests.KERNELS)
    backend.require(trajectory_tests.MODULE, *trajectory_tests.KERNELS)
    x = randn(gen, 3, 5, device=backend.device).requires_grad_()
    with torch.no_grad():
        assert not ops.gaussian_logprob(x, x, 0.5).requires_grad and not ops.trajectory_std(x).requires_grad
    values = (ops.gaussian_logprob(x, 0.5 * x, 1.5).sum(), ops.trajectory_std(x).sum())
    path.check_taken()  # (with create_graph=True the eager backward runs the backward custom ops)
    for value in values:
        (grad,) = torch.autograd.grad(value, x, create_graph=True)
        with pytest.raises(RuntimeError, match="no autograd formula was registered"):
            torch.autograd.grad(grad.sum(), x)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def test_dispatch_modes_see_the_custom_ops(gen):
    """Under a dispatch mode the ops go through their custom ops (which fake tensors need)."""
    x = randn(gen, 3, 2, 5, 4)
    with _Recorder() as recorder:
        logp = ops.gaussian_logprob(x, x, 0.5)
        scores = ops.trajectory_std(x)
        ops.topk_mask(scores, k=2)
    assert {"margrpo::gaussian_logprob", "margrpo::trajectory_std", "margrpo::topk_mask"} <= set(recorder.names)
    assert logp.shape == (3, 2, 5) and scores.shape == (2, 5)
    with FakeTensorMode():
        fake = torch.empty(3, 2, 5, 4)
        assert ops.gaussian_logprob(fake, fake, 0.5, "none").shape == (3, 2, 5, 4)
        assert ops.topk_mask(ops.trajectory_std(fake), k=2, check_finite=False).dtype == torch.bool
        assert ops.consistency_mask(fake, fake, fake).shape == (3, 2, 5)
        assert ops.grpo_surrogate(fake[..., 0], fake[..., 1], fake[0, :, 0, 0], fake[0, ..., 0] > 0).loss.shape == ()


def test_eager_backend_follows_set_backend(gen, monkeypatch):
    """The eager route memoises its backend pick per device, op and selection: a new selection
    takes effect at once, and returning to the old one finds the old pick."""
    if "cpp" not in ops.available_backends():
        pytest.skip("cpp: not available in this installation")
    calls = []
    original = oracle.gaussian_logprob_fwd
    monkeypatch.setattr(oracle, "gaussian_logprob_fwd", lambda *args: calls.append(args) or original(*args))
    monkeypatch.setattr(_kernels, "_eager_picks", {})  # picks made before hold the unpatched kernel
    _kernels.find.cache_clear()
    try:
        x, std = randn(gen, 2, 3), torch.tensor([[1.0], [0.5]], dtype=F64)
        with ops.use_backend("cpp"):
            ops.gaussian_logprob(x, x, std)
            assert not calls  # the fused kernel
            with ops.use_backend("torch"):
                ops.gaussian_logprob(x, x, std)
                assert len(calls) == 1  # the oracle
            ops.gaussian_logprob(x, x, std)
            assert len(calls) == 1
    finally:
        _kernels.find.cache_clear()
    with ops.use_backend("auto"):
        picked, _ = _kernels.for_eager(x.device, "gaussian_logprob", gaussian_tests.MODULE, gaussian_tests.KERNELS)
        assert picked == "cpp"

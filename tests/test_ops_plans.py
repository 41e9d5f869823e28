"""The public ops remember what their metadata checks derived per call signature (shapes, dtypes,
devices, options): a repeated call skips those checks, but never the checks of values, and a
signature that failed is not remembered."""

from __future__ import annotations

import importlib

import pytest
import torch

import margrpo.ops as ops
from margrpo.ops import _validate, oracle

gaussian_module = importlib.import_module("margrpo.ops.gaussian_logprob")


def test_value_checks_run_on_every_call_of_a_known_signature():
    x = torch.randn(2, 3, 4)
    std = torch.ones(2, 3, 1)
    ops.gaussian_logprob(x, x, std)
    std[1, 2, 0] = 0.0  # the same signature, one std no longer positive
    with pytest.raises(ValueError, match="std: 1 of 6 values"):
        ops.gaussian_logprob(x, x, std)
    ops.consistency_mask(x, x, x, threshold=0.1)
    with pytest.raises(ValueError, match="threshold: got nan"):
        ops.consistency_mask(x, x, x, threshold=float("nan"))
    logp, adv, mask = torch.randn(3, 2, 5), torch.randn(2), torch.ones(2, 5, dtype=torch.bool)
    ops.grpo_surrogate(logp, logp, adv, mask)
    with pytest.raises(ValueError, match="clip_eps: got -0.1"):
        ops.grpo_surrogate(logp, logp, adv, mask, clip_eps=-0.1)
    with pytest.raises(ValueError, match="advantages: got 1 non-finite values of 2"):
        ops.grpo_surrogate(logp, logp, torch.tensor([0.5, float("nan")]), mask)
    scores = torch.randn(2, 10)
    assert ops.topk_mask(scores, ratio=0.3).sum() == 6
    assert ops.topk_mask(scores, ratio=0.5).sum() == 10  # the ratio is part of the signature
    scores[1, 3] = float("nan")
    with pytest.raises(ValueError, match="scores: got 1 NaN"):
        ops.topk_mask(scores, ratio=0.3)


def test_a_failing_signature_is_not_remembered():
    x = torch.randn(4, 16)
    before = dict(gaussian_module._PLANS)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"mean: got shape \(4, 15\), expected \(4, 16\)"):
            ops.gaussian_logprob(x, torch.randn(4, 15), 1.0)
    assert gaussian_module._PLANS.keys() - before.keys() == set()
    with pytest.raises(TypeError, match="x: got list"):
        ops.gaussian_logprob([1.0], x, 1.0)


def test_signatures_that_differ_in_dtype_layout_or_std_kind_each_get_their_own_plan():
    g = torch.Generator().manual_seed(0)
    x, mean = torch.randn(3, 5, 4, generator=g, dtype=torch.float64), torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    std = torch.rand(3, 5, 4, generator=g, dtype=torch.float64) + 0.5
    for s in (std, std[..., :1], 0.7, std[0, 0]):  # per element, per row, a python float, 0-d
        per_element = torch.as_tensor(s, dtype=torch.float64).expand(3, 5, 4).reshape(15, 4)
        want = oracle.gaussian_logprob_fwd(x.reshape(15, 4), mean.reshape(15, 4), per_element, oracle.REDUCE_SUM).reshape(3, 5)
        for xs, ms in ((x, mean), (x.float(), mean.float())):
            got = ops.gaussian_logprob(xs, ms, s)
            wide_inputs = xs.dtype == torch.float64 or isinstance(s, torch.Tensor)  # std is float64 too
            assert got.dtype == (torch.float64 if wide_inputs else torch.float32)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # a non-contiguous input of a remembered signature
    wide = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    strided = wide[..., ::2]
    torch.testing.assert_close(ops.gaussian_logprob(strided, mean, std), ops.gaussian_logprob(strided.contiguous(), mean, std))
    # trajectory_std and consistency_mask: a 1-d remainder and 0-d outputs
    assert ops.trajectory_std(torch.randn(3, 4, generator=g)).shape == ()
    assert ops.consistency_mask(*torch.randn(3, 6, generator=g)).shape == ()
    assert ops.gaussian_logprob(torch.randn(4), torch.randn(4), 1.0).shape == ()


def test_the_memo_is_bounded():
    plans: dict = {}
    for i in range(_validate.PLAN_LIMIT + 10):
        _validate.remember(plans, i, i)
    assert len(plans) <= _validate.PLAN_LIMIT and plans[_validate.PLAN_LIMIT + 9] == _validate.PLAN_LIMIT + 9
    _validate.remember(plans, None, 1)
    assert None not in plans


def test_finite_check_reads_one_sum_and_counts_only_on_failure():
    _validate.all_finite("a", torch.tensor([3e38, 3e38]))  # the sum overflows, no value is non-finite
    with pytest.raises(ValueError, match="a: got 2 non-finite values of 3"):
        _validate.all_finite("a", torch.tensor([float("inf"), float("-inf"), 1.0]))


@pytest.mark.parametrize("signature", [_validate.signature, _validate._python_signature], ids=["active", "python"])
def test_a_signature_tells_apart_exactly_what_the_checks_read(signature):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, generator=g)
    same = [torch.randn(3, 4, generator=g), torch.randn(3, 8, generator=g)[:, :4].contiguous()]  # other values
    different = [
        torch.randn(4, 3, generator=g),
        torch.randn(12, generator=g),
        torch.randn(3, 4, 1, generator=g),
        torch.randn(1, 3, 4, generator=g),
        base.double(),
        base.to(torch.bfloat16),
        torch.empty(3, 4, device="meta"),
        torch.ones(3, 4, dtype=torch.bool),
        torch.randn(3, 8, generator=g)[:, ::2],  # not contiguous: the ops copy it
        base.clone().requires_grad_(),  # records autograd: the ops detach constants
    ]
    assert all(signature(t) == signature(base) for t in same)
    keys = [signature(t) for t in [base, *different]]
    assert len(set(keys)) == len(keys)
    # per position: None differs from a tensor, and the order of the arguments matters
    assert signature(base, None) != signature(base, base) != signature(None, base)
    assert signature(base, base.double()) != signature(base.double(), base)
    assert signature(torch.zeros(2, 3), torch.zeros(6)) != signature(torch.zeros(2), torch.zeros(3, 6))
    with pytest.raises(TypeError):
        signature(base, [1.0])


def test_the_extension_signature_is_the_one_in_use_when_built():
    extension = ops._backend.extension()
    if extension is None or not hasattr(extension, "signature"):
        pytest.skip("margrpo._C not built with signature(): the Python signature is in use")
    assert _validate.signature is extension.signature


def test_symbolic_sizes_are_not_keyed_and_the_op_still_runs():
    """A tracer's fake tensor with symbolic sizes has no fixed signature: TypeError (the ops then
    check that call without a memo), and the op runs on it through its custom op."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    scores = mode.from_tensor(torch.randn(4, 8), symbolic_context=dynamic)
    for signature in (_validate.signature, _validate._python_signature):
        with pytest.raises(TypeError):
            hash(signature(scores))  # the Python key fails when hashed (a SymInt is unhashable)
    with mode:
        assert ops.topk_mask(scores, k=2).shape == scores.shape

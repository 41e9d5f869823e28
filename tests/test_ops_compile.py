"""Every public op under torch.compile(fullgraph=True) on CPU, with the torch and cpp backends.

The default compiler here is aot_eager: it traces with Dynamo and AOTAutograd (fake impls, autograd
registrations, guards), which is what the ops must support, without Inductor's C++ build time.
One Inductor run is marked slow.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, randn

import margrpo.ops as ops
from margrpo.ops import _kernels, oracle

KERNELS = {
    "gaussian_logprob": ("gaussian_logprob_fwd", "gaussian_logprob_bwd"),
    "trajectory_std": ("trajectory_std_fwd", "trajectory_std_bwd"),
    "topk": ("topk_mask_fwd", "topk_indices_fwd"),
    "consistency": ("consistency_mask_fwd",),
    "grpo_surrogate": ("grpo_surrogate_fwd",),
}


def require_all_kernels(backend: str) -> None:
    if backend not in ops.available_backends():
        pytest.skip(f"{backend}: not available in this installation")
    for module, names in KERNELS.items():
        for name in names:
            if _kernels.find(backend, module, name) is None:
                pytest.skip(f"{backend}: kernel {name} is not built in this installation")


def pipeline(x, mean, std, samples, prev, cur, final, logp, old_logp, advantages, mask):
    """One MAR-GRPO step in miniature: log-probs, uncertainty, top-k, consistency, clipped loss."""
    logp_tokens = ops.gaussian_logprob(x, mean, std)
    per_element = ops.gaussian_logprob(x, mean, 0.5, "none")
    uncertainty = ops.trajectory_std(samples)
    top = ops.topk_mask(uncertainty, ratio=0.5)
    top_idx = ops.topk_indices(uncertainty, k=2)
    keep = ops.consistency_mask(prev, cur, final)
    surrogate = ops.grpo_surrogate(logp, old_logp, advantages, mask & keep, mte_mask=top, aggregation="sample_mean")
    total = logp_tokens.sum() + per_element.mean() + uncertainty.sum() + surrogate.loss
    return total, top, top_idx, keep, surrogate.clip_fraction, surrogate.approx_kl


def make_inputs(gen, B=3, N=8, C=4, K=3, T=2):
    leaf = lambda t: t.requires_grad_()  # noqa: E731
    x, mean = leaf(randn(gen, B, N, C)), leaf(randn(gen, B, N, C))
    std = leaf(torch.rand(B, N, 1, generator=gen, dtype=torch.float64) + 0.5)
    samples = leaf(randn(gen, K, B, N, C))
    prev, cur, final = (randn(gen, B, N, C) for _ in range(3))
    old = randn(gen, T, B, N)
    logp = leaf(old + 0.3 * randn(gen, T, B, N))
    return x, mean, std, samples, prev, cur, final, logp, old, randn(gen, B), torch.rand(B, N, generator=gen) > 0.2


def assert_compiled_matches_eager(compiled, gen):
    inputs = make_inputs(gen)
    eager_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    got, want = compiled(*inputs), pipeline(*eager_inputs)
    for g, w in zip(got, want):
        if w.dtype in (torch.bool, torch.int64):
            assert torch.equal(g, w)
        else:
            assert_close(g, w, torch.float64)
    got[0].backward()
    want[0].backward()
    for a, b in zip(inputs, eager_inputs):
        if b.requires_grad:
            assert_close(a.grad, b.grad, torch.float64)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_fullgraph_matches_eager(backend, gen):
    require_all_kernels(backend)
    torch._dynamo.reset()
    with ops.use_backend(backend):
        assert_compiled_matches_eager(torch.compile(pipeline, fullgraph=True, backend="aot_eager"), gen)


def test_backend_choice_is_guarded(gen, monkeypatch):
    """Changing the backend recompiles instead of reusing a graph that baked in the old one: the
    compiled call reaches the torch backend's kernel only while that backend is selected. Both
    backends apply the one std policy (an error by default, NaN with check_std=False)."""
    require_all_kernels("cpp")
    torch._dynamo.reset()
    calls = []
    original = oracle.gaussian_logprob_fwd

    def spy(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(oracle, "gaussian_logprob_fwd", spy)
    _kernels.find.cache_clear()  # the kernels are looked up (and cached) by name
    try:
        fn = torch.compile(lambda x, s: ops.gaussian_logprob(x, x, s, check_std=False), fullgraph=True, backend="aot_eager")
        checked = torch.compile(lambda x, s: ops.gaussian_logprob(x, x, s), fullgraph=True, backend="aot_eager")
        x, bad_std = randn(gen, 2, 3), torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
        for name in ("torch", "cpp"):
            calls.clear()
            with ops.use_backend(name):
                assert torch.isnan(fn(x, bad_std)[1]) and torch.isfinite(fn(x, bad_std)[0])
                assert bool(calls) == (name == "torch"), name
                with pytest.raises(ValueError, match="std: 1 of 2"):
                    checked(x, bad_std)
    finally:
        _kernels.find.cache_clear()


@pytest.mark.slow
def test_inductor_fullgraph_matches_eager(gen):
    torch._dynamo.reset()
    with ops.use_backend("torch"):
        assert_compiled_matches_eager(torch.compile(pipeline, fullgraph=True), gen)


def test_dynamic_shapes_compile_one_graph_for_every_size(gen):
    """Under dynamic shapes an op's input size is symbolic while Dynamo traces; the backend choice
    must not need its value (a symbolic size handed to the constant-result backend pick broke the
    graph), so one graph serves every size and matches eager."""
    from torch._dynamo.utils import counters

    def logprob_and_spread(x, mean, samples):
        return ops.gaussian_logprob(x, mean, 0.7), ops.trajectory_std(samples)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(logprob_and_spread, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (5, 9, 16):
        x, mean, samples = randn(gen, 2, n, 4), randn(gen, 2, n, 4), randn(gen, 3, 2, n, 4)
        for got, want in zip(compiled(x, mean, samples), logprob_and_spread(x, mean, samples)):
            assert_close(got, want, torch.float64)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()

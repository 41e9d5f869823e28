"""The Triton kernels (margrpo.kernels) against the eager oracle (margrpo.ops.oracle).

Without a GPU the kernels run in the Triton interpreter on CPU tensors; with one, on the GPU. Inputs
are fresh random tensors at odd sizes; every comparison is with the oracle evaluated on the same
inputs, so low-precision inputs are compared at the compute (fp32) tolerance. Kernel outputs are
allocated with torch.empty, which the `poison_uninitialized` fixture fills with NaN / max-int /
True, so an element a kernel forgets to write fails. The last tests compile every kernel ahead of
time for Hopper (sm_90) and check that no launcher configuration spills registers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from conftest import assert_close, randn  # noqa: E402

from margrpo.kernels import consistency, gaussian_logprob, grpo_surrogate, topk, trajectory_std  # noqa: E402
from margrpo.kernels._util import warps_for  # noqa: E402
from margrpo.ops import oracle as ref  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = [
    pytest.mark.usefixtures("poison_uninitialized"),
    # the interpreter evaluates both sides of tl.where with numpy, which warns about 1/0 on the unused side
    pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"),
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def check(actual: torch.Tensor, expected: torch.Tensor, input_dtype: torch.dtype, scale: float = 1.0) -> None:
    """Same dtype and shape as the reference, and close at the compute dtype's tolerance."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.dtype, actual.shape, expected.dtype, expected.shape)
    assert_close(actual, expected, compute_dtype(input_dtype), scale=scale)


# ------------------------------------------------------------------ gaussian log-prob
GAUSSIAN_CASES = [  # (R, C, per-row std, dtype)
    (1, 1, True, torch.float64),
    (5, 3, False, torch.float64),
    (37, 17, True, torch.float64),
    (37, 16, False, torch.float32),
    (5, 3, True, torch.float32),
    (3, 300, True, torch.float32),
    (3, 300, False, torch.float64),
    (37, 17, False, torch.bfloat16),
    (5, 16, True, torch.float16),
]


@pytest.mark.parametrize("R,C,per_row,dtype", GAUSSIAN_CASES)
def test_gaussian_logprob_matches_reference(gen, R, C, per_row, dtype):
    x = randn(gen, R, C, dtype=dtype, device=DEVICE)
    mean = randn(gen, R, C, dtype=dtype, device=DEVICE)
    std = (torch.rand(R, 1 if per_row else C, generator=gen, dtype=torch.float64) + 0.5).to(DEVICE, dtype)
    for reduce in (ref.REDUCE_NONE, ref.REDUCE_SUM, ref.REDUCE_MEAN):
        expected = ref.gaussian_logprob_fwd(x, mean, std, reduce)
        check(gaussian_logprob.gaussian_logprob_fwd(x, mean, std, reduce), expected, dtype, scale=C)
        grad_out = randn(gen, *expected.shape, dtype=expected.dtype, device=DEVICE)
        got = gaussian_logprob.gaussian_logprob_bwd(grad_out, x, mean, std, reduce)
        for name, a, e in zip(("grad_x", "grad_mean", "grad_std"), got, ref.gaussian_logprob_bwd(grad_out, x, mean, std, reduce)):
            assert a.shape == e.shape, name
            check(a, e, dtype, scale=C)


@pytest.mark.parametrize("per_row", [True, False])
def test_gaussian_logprob_nonpositive_std_is_nan(gen, per_row):
    R, C = 6, 5
    x, mean = randn(gen, R, C, device=DEVICE), randn(gen, R, C, device=DEVICE)
    std = torch.rand(R, 1 if per_row else C, generator=gen, dtype=torch.float64).add(0.5).to(DEVICE)
    std[1, 0], std[3, -1] = 0.0, -0.25
    for reduce in (ref.REDUCE_NONE, ref.REDUCE_SUM):
        got = gaussian_logprob.gaussian_logprob_fwd(x, mean, std, reduce)
        expected = ref.gaussian_logprob_fwd(x, mean, std, reduce)
        assert torch.equal(got.isnan(), expected.isnan()) and got.isnan().any()
        check(got, expected, torch.float64)


# ------------------------------------------------------------------ trajectory std
@pytest.mark.parametrize(
    "K,M,C,dtype",
    [
        (2, 1, 1, torch.float64),
        (3, 5, 3, torch.float32),
        (5, 37, 16, torch.float64),
        (8, 37, 17, torch.float32),
        (4, 5, 100, torch.float64),
        (3, 37, 16, torch.bfloat16),
        (2, 5, 17, torch.float16),
    ],
)
def test_trajectory_std_matches_reference(gen, K, M, C, dtype):
    samples = randn(gen, K, M, C, dtype=dtype, device=DEVICE)
    samples[:, 0, : max(1, C // 2)] = 0.75  # equal over K (and exact mean): zero std, gradient defined as 0
    check(trajectory_std.trajectory_std_fwd(samples), ref.trajectory_std_fwd(samples), dtype)
    grad_out = randn(gen, M, dtype=compute_dtype(dtype), device=DEVICE)
    got = trajectory_std.trajectory_std_bwd(grad_out, samples)
    check(got, ref.trajectory_std_bwd(grad_out, samples), dtype)
    assert (got[:, 0, : max(1, C // 2)] == 0).all()


# ------------------------------------------------------------------ top-k
def tie_heavy_scores(gen, B: int, N: int, dtype: torch.dtype) -> torch.Tensor:
    """Few distinct values (many ties), with -0.0 next to +0.0 and both infinities."""
    scores = torch.randint(-3, 4, (B, N), generator=gen).to(dtype)
    if N >= 4:
        scores[0, :4] = torch.tensor([-0.0, float("inf"), 0.0, float("-inf")], dtype=dtype)
    return scores.to(DEVICE)


def check_topk(scores: torch.Tensor, ks) -> None:
    for k in ks:
        assert torch.equal(topk.topk_indices_fwd(scores, k), ref.topk_indices_fwd(scores, k)), k
        assert torch.equal(topk.topk_mask_fwd(scores, k), ref.topk_mask_fwd(scores, k)), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_topk_short_rows(gen, dtype):
    scores = torch.cat([randn(gen, 1, 7, dtype=dtype, device=DEVICE), tie_heavy_scores(gen, 1, 7, dtype)])
    check_topk(scores, ks=(0, 1, 3, 7))
    check_topk(randn(gen, 2, 1, dtype=dtype, device=DEVICE), ks=(1,))


@pytest.mark.parametrize("N,dtype", [(1024, torch.float32), (1500, torch.float64), (1500, torch.float16)])
def test_topk_long_rows(gen, N, dtype):
    scores = torch.cat([randn(gen, 1, N, dtype=dtype, device=DEVICE), tie_heavy_scores(gen, 1, N, dtype)])
    check_topk(scores, ks=(N // 3,))


def test_topk_indices_beyond_one_sort_block_select_then_sort(gen):
    """Rows longer than the sort block take the select + sort path (here with a 256-entry block)."""
    scores = torch.cat([randn(gen, 1, 1500, device=DEVICE), tie_heavy_scores(gen, 1, 1500, torch.float64)])
    for k in (1, 200):
        assert torch.equal(topk._topk_indices(scores, k, max_sort_block=256), ref.topk_indices_fwd(scores, k))
    with pytest.raises(ValueError, match="k: rows of N = 1500 > 256 .* need.* k <= 256, got 300"):
        topk._topk_indices(scores, 300, max_sort_block=256)


def test_topk_ranks_fp64_beyond_fp32_precision():
    """Scores that differ only below fp32 resolution keep their fp64 order (no fp32 ties)."""
    scores = (1.0 + torch.tensor([[3e-12, 1e-12, 4e-12, 1e-12, 5e-12, 9e-12, 2e-12]], dtype=torch.float64)).to(DEVICE)
    assert scores.float().unique().numel() == 1
    check_topk(scores, ks=(3,))


# ------------------------------------------------------------------ consistency mask
@pytest.mark.parametrize(
    "M,C,dtype",
    [
        (1, 1, torch.float64),
        (5, 3, torch.float32),
        (37, 16, torch.float64),
        (37, 17, torch.float32),
        (5, 100, torch.float64),
        (37, 16, torch.bfloat16),
    ],
)
def test_consistency_mask_matches_reference(gen, M, C, dtype):
    prev, cur, final = (randn(gen, M, C, dtype=dtype, device=DEVICE) for _ in range(3))
    if M >= 4:  # zero-norm rows: that row's cosine is defined as 0
        prev[1], cur[2], final[3] = 0.0, 0.0, 0.0
    gain = ref.cosine_or_zero(cur.double(), final.double()) - ref.cosine_or_zero(prev.double(), final.double())
    for threshold in (0.0, 0.05, -0.3):
        got = consistency.consistency_mask_fwd(prev, cur, final, threshold)
        expected = ref.consistency_mask_fwd(prev, cur, final, threshold)
        assert got.dtype == torch.bool and got.shape == (M,)
        # a gain within rounding of the threshold may fall either way; every other row must agree
        decided = (gain - threshold).abs() > 1e-5
        assert torch.equal(got[decided], expected[decided])


def test_consistency_mask_zero_norm_rows_use_cosine_zero():
    final = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], device=DEVICE)
    prev = torch.tensor([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]], device=DEVICE)
    cur = torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 1.0], [-1.0, -1.0]], device=DEVICE)
    # gains: 1 - 0, 0 - (-1), 0 - 0 (final is zero), -1 - 0
    got = consistency.consistency_mask_fwd(prev, cur, final, 0.5)
    assert got.tolist() == [True, True, False, False]
    assert got.tolist() == ref.consistency_mask_fwd(prev, cur, final, 0.5).tolist()


# ------------------------------------------------------------------ GRPO surrogate
def surrogate_inputs(gen, T, B, L, dtype, spread=0.3):
    logp = randn(gen, T, B, L, dtype=dtype, device=DEVICE, scale=spread)
    old_logp = (logp.double() + randn(gen, T, B, L, device=DEVICE, scale=spread)).to(dtype)
    advantages = randn(gen, B, dtype=dtype, device=DEVICE)
    kept = torch.rand(B, L, generator=gen) > 0.3
    kept.view(-1)[0] = True
    weights = torch.rand(B, L, generator=gen, dtype=torch.float64) * kept
    weights = (weights / weights.sum()).to(DEVICE, compute_dtype(dtype))
    mte_mask = (torch.rand(B, L, generator=gen) > 0.5).to(DEVICE)
    return logp, old_logp, advantages, weights, mte_mask


def check_surrogate(args, clip_low, clip_high, dtype):
    got = grpo_surrogate.grpo_surrogate_fwd(*args, clip_low, clip_high)
    expected = ref.grpo_surrogate_fwd(*args, clip_low, clip_high)
    for name, a, e in zip(("loss", "stats", "grad"), got, expected):
        assert a.shape == e.shape, name
        check(a, e, dtype)
    return got


@pytest.mark.parametrize(
    "T,B,L,dtype",
    [(1, 1, 1, torch.float64), (3, 5, 37, torch.float32), (4, 3, 50, torch.float64), (2, 3, 1, torch.bfloat16), (3, 2, 17, torch.float16)],
)
def test_grpo_surrogate_matches_reference(gen, T, B, L, dtype):
    args = surrogate_inputs(gen, T, B, L, dtype)
    check_surrogate(args, 0.2, 0.28, dtype)


def test_grpo_surrogate_clipping_extreme_ratios_and_determinism(gen):
    """Wide log-ratios (many clipped terms, some beyond the +-20 clamp); bitwise repeatable."""
    logp, old_logp, advantages, weights, mte_mask = surrogate_inputs(gen, 3, 4, 40, torch.float32, spread=2.0)
    logp[0, 0, :3] = torch.tensor([45.0, -45.0, 19.0], device=DEVICE)
    args = (logp, old_logp, advantages, weights, mte_mask)
    loss, stats, grad = check_surrogate(args, 0.2, 0.28, torch.float32)
    assert 0.05 < stats[0] < 0.95, "the test should exercise both clipped and unclipped terms"
    again = grpo_surrogate.grpo_surrogate_fwd(*args, 0.2, 0.28)
    assert torch.equal(again[0], loss) and torch.equal(again[1], stats) and torch.equal(again[2], grad)


def test_grpo_surrogate_nan_and_nothing_kept(gen):
    logp, old_logp, advantages, weights, mte_mask = surrogate_inputs(gen, 2, 3, 9, torch.float64)
    weights.zero_()  # nothing kept: zero loss and stats, ratio_max defined as 1
    loss, stats, grad = check_surrogate((logp, old_logp, advantages, weights, mte_mask), 0.2, 0.2, torch.float64)
    assert loss == 0 and stats.tolist() == [0.0, 0.0, 0.0, 1.0] and (grad == 0).all()
    weights.fill_(1.0 / 27)
    logp[0, 1, 2] = float("nan")  # a NaN log-prob must show, not be clamped away
    loss, stats, grad = check_surrogate((logp, old_logp, advantages, weights, mte_mask), 0.2, 0.2, torch.float64)
    assert loss.isnan() and stats[1:].isnan().all()


def test_grpo_finalize_reduces_partials_over_several_chunks(gen):
    """The finalize kernel walks the partials in BLOCK chunks (here 3 chunks of 64)."""
    n = 150
    partials = randn(gen, grpo_surrogate.N_PARTIALS, n, device=DEVICE)
    loss, stats = torch.empty((), device=DEVICE, dtype=torch.float64), torch.empty(4, device=DEVICE, dtype=torch.float64)
    grpo_surrogate._grpo_finalize_kernel[(1,)](partials, loss, stats, n, BLOCK=64)
    assert_close(loss, partials[0].sum(), torch.float64, scale=n)
    assert_close(stats, torch.cat([partials[1:4].sum(1), partials[4].max()[None]]), torch.float64, scale=n)


# ------------------------------------------------------------------ empty inputs
def test_empty_inputs_match_reference():
    """Zero rows, channels or tokens: no launch where there is nothing to write, and the reference's
    values where there is (empty sum 0, empty mean NaN, ratio_max 1)."""
    no_channels, ones = torch.zeros(3, 0, device=DEVICE), torch.ones(3, 1, device=DEVICE)
    for reduce in (ref.REDUCE_NONE, ref.REDUCE_SUM, ref.REDUCE_MEAN):
        check(
            gaussian_logprob.gaussian_logprob_fwd(no_channels, no_channels, ones, reduce),
            ref.gaussian_logprob_fwd(no_channels, no_channels, ones, reduce),
            torch.float32,
        )
    grads = gaussian_logprob.gaussian_logprob_bwd(torch.ones(3, device=DEVICE), no_channels, no_channels, ones, ref.REDUCE_SUM)
    for a, e in zip(grads, ref.gaussian_logprob_bwd(torch.ones(3, device=DEVICE), no_channels, no_channels, ones, ref.REDUCE_SUM)):
        check(a, e, torch.float32)
    samples = torch.zeros(2, 3, 0, device=DEVICE)
    check(trajectory_std.trajectory_std_fwd(samples), ref.trajectory_std_fwd(samples), torch.float32)
    assert consistency.consistency_mask_fwd(no_channels, no_channels, no_channels, 0.0).tolist() == [False] * 3
    assert topk.topk_indices_fwd(torch.zeros(2, 0, device=DEVICE), 0).shape == (2, 0)
    assert topk.topk_mask_fwd(torch.zeros(0, 5, device=DEVICE), 2).shape == (0, 5)
    logp = torch.zeros(2, 3, 0, device=DEVICE)
    no_tokens = (
        logp,
        logp,
        torch.zeros(3, device=DEVICE),
        torch.zeros(3, 0, device=DEVICE),
        torch.zeros(3, 0, dtype=torch.bool, device=DEVICE),
    )
    loss, stats, grad = grpo_surrogate.grpo_surrogate_fwd(*no_tokens, 0.2, 0.2)
    assert loss == 0 and stats.tolist() == [0.0, 0.0, 0.0, 1.0] and grad.shape == (2, 3, 0)


# ------------------------------------------------------------------ argument errors
def test_launchers_name_bad_arguments():
    x = torch.zeros(4, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"std: expected shape \(4, 1\) or \(4, 3\), got \(4, 2\)"):
        gaussian_logprob.gaussian_logprob_fwd(x, x, torch.ones(4, 2, device=DEVICE), ref.REDUCE_SUM)
    with pytest.raises(ValueError, match="reduce: expected 0 .* got 7"):
        gaussian_logprob.gaussian_logprob_fwd(x, x, torch.ones(4, 1, device=DEVICE), 7)
    with pytest.raises(ValueError, match="mean: expected a contiguous tensor"):
        gaussian_logprob.gaussian_logprob_fwd(x, torch.zeros(3, 4, device=DEVICE).t(), torch.ones(4, 1, device=DEVICE), 0)
    with pytest.raises(ValueError, match="k: expected 0 <= k <= N = 3, got 4"):
        topk.topk_mask_fwd(x, 4)
    with pytest.raises(ValueError, match=r"samples: expected a 3-D tensor, got shape \(4, 3\)"):
        trajectory_std.trajectory_std_fwd(x)
    with pytest.raises(ValueError, match=r"final: expected shape \(4, 3\) \(as cur\), got \(4, 2\)"):
        consistency.consistency_mask_fwd(x, x, torch.zeros(4, 2, device=DEVICE), 0.0)
    logp = torch.zeros(2, 4, 3, device=DEVICE)
    with pytest.raises(ValueError, match="mte_mask: expected dtype torch.bool"):
        grpo_surrogate.grpo_surrogate_fwd(logp, logp, torch.zeros(4, device=DEVICE), x, x, 0.2, 0.2)


# ------------------------------------------------------------------ ahead-of-time compile for Hopper
def _aot_cases():
    """(id, kernel, signature, constexprs, tile elements -> num_warps by warps_for) at the blocks the
    launchers choose for Harmon-sized inputs (48 images x 1024 tokens x 16 channels, K = 5); the
    sort is compiled at a 128-entry block because larger bitonic networks take minutes to build."""
    f32 = "*fp32"
    g_blocks = gaussian_logprob._blocks(48 * 1024, 16)
    s_blocks = trajectory_std._blocks(5, 48 * 1024, 16)
    gs_block = grpo_surrogate._block(48 * 1024)
    c_blocks = consistency._blocks(48 * 1024, 16)
    g_sig = dict(x_ptr="*bf16", mean_ptr="*bf16", std_ptr=f32, out_ptr=f32, R="i32", C="i32")
    g_bwd_sig = dict(
        grad_ptr=f32, x_ptr="*bf16", mean_ptr="*bf16", std_ptr=f32, grad_x_ptr=f32, grad_mean_ptr=f32, grad_std_ptr=f32, R="i32", C="i32"
    )
    g_const = dict(BLOCK_R=g_blocks[0], BLOCK_C=g_blocks[1])
    s_const = dict(BLOCK_K=s_blocks[0], BLOCK_M=s_blocks[1], BLOCK_C=s_blocks[2])
    sort_sig = dict(scores_ptr="*bf16", candidates_ptr="*i32", out_ptr="*i64", N="i32", n_sort="i32", k="i32")
    return [
        (
            "gaussian_fwd_sum_row_std",
            gaussian_logprob._gaussian_logprob_fwd_kernel,
            g_sig,
            dict(REDUCE=ref.REDUCE_SUM, STD_PER_ROW=True, **g_const),
            g_blocks[0] * g_blocks[1],
        ),
        (
            "gaussian_fwd_none_elem_std",
            gaussian_logprob._gaussian_logprob_fwd_kernel,
            g_sig,
            dict(REDUCE=ref.REDUCE_NONE, STD_PER_ROW=False, **g_const),
            g_blocks[0] * g_blocks[1],
        ),
        (
            "gaussian_bwd_sum_row_std",
            gaussian_logprob._gaussian_logprob_bwd_kernel,
            g_bwd_sig,
            dict(REDUCE=ref.REDUCE_SUM, STD_PER_ROW=True, **g_const),
            g_blocks[0] * g_blocks[1],
        ),
        (
            "gaussian_bwd_none_elem_std",
            gaussian_logprob._gaussian_logprob_bwd_kernel,
            g_bwd_sig,
            dict(REDUCE=ref.REDUCE_NONE, STD_PER_ROW=False, **g_const),
            g_blocks[0] * g_blocks[1],
        ),
        (
            "trajectory_std_fwd",
            trajectory_std._trajectory_std_fwd_kernel,
            dict(samples_ptr="*bf16", out_ptr=f32, K="i32", M="i32", C="i32"),
            s_const,
            s_blocks[0] * s_blocks[1] * s_blocks[2],
        ),
        (
            "trajectory_std_bwd",
            trajectory_std._trajectory_std_bwd_kernel,
            dict(grad_out_ptr=f32, samples_ptr="*bf16", grad_ptr=f32, K="i32", M="i32", C="i32"),
            s_const,
            s_blocks[0] * s_blocks[1] * s_blocks[2],
        ),
        (
            "consistency_mask",
            consistency._consistency_mask_kernel,
            dict(prev_ptr="*bf16", cur_ptr="*bf16", final_ptr="*bf16", out_ptr="*i1", M="i32", C="i32", threshold="fp32"),
            dict(COMPUTE_DTYPE=tl.float32, TINY=torch.finfo(torch.float32).tiny, BLOCK_M=c_blocks[0], BLOCK_C=c_blocks[1]),
            c_blocks[0] * c_blocks[1],
        ),
        (
            "grpo_surrogate",
            grpo_surrogate._grpo_surrogate_kernel,
            dict(
                logp_ptr=f32,
                old_logp_ptr=f32,
                adv_ptr=f32,
                weights_ptr=f32,
                mte_ptr="*i1",
                grad_ptr=f32,
                partials_ptr=f32,
                T="i32",
                L="i32",
                BL="i32",
                ratio_low="fp32",
                ratio_high="fp32",
            ),
            dict(BLOCK=gs_block),
            gs_block,
        ),
        (
            "grpo_finalize",
            grpo_surrogate._grpo_finalize_kernel,
            dict(partials_ptr=f32, loss_ptr=f32, stats_ptr=f32, n="i32"),
            dict(BLOCK=256),
            256,
        ),
        (
            "topk_select_mask_fp32",
            topk._topk_select_kernel,
            dict(scores_ptr=f32, out_ptr="*i1", N="i32", k="i32"),
            dict(KEY_BITS=32, WRITE_INDICES=False, BLOCK=topk.MAX_SELECT_BLOCK),
            topk.MAX_SELECT_BLOCK,
        ),
        (
            "topk_select_indices_fp64",
            topk._topk_select_kernel,
            dict(scores_ptr="*fp64", out_ptr="*i32", N="i32", k="i32"),
            dict(KEY_BITS=64, WRITE_INDICES=True, BLOCK=topk.MAX_SELECT_BLOCK),
            topk.MAX_SELECT_BLOCK,
        ),
        ("topk_sort_128", topk._topk_sort_kernel, sort_sig, dict(KEY_BITS=32, FROM_CANDIDATES=True, LOG_BLOCK=7, BLOCK=128), 128),
    ]


AOT_CASES = _aot_cases()


def _resource_usage(cubin: bytes) -> dict[str, int] | None:
    """REG / STACK / SHARED of a kernel, read with the cuobjdump that ships with Triton."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([tool, "--dump-resource-usage", file.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", text)
    return {k: int(v) for k, v in zip(("REG", "STACK", "SHARED"), found.groups())} if found else None


def compile_for_hopper() -> dict[str, dict]:
    """Compiles every AOT case for sm_90; run in a process where triton is not interpreting."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report = {}
    for name, kernel, signature, constexprs, tile in AOT_CASES:
        signature = {**signature, **{k: "constexpr" for k in constexprs}}
        num_warps = warps_for(tile)
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}
        )
        report[name] = {
            "sm_90": ".target sm_90" in compiled.asm["ptx"],
            "cubin": len(compiled.asm["cubin"]),
            "num_warps": num_warps,
            "usage": _resource_usage(compiled.asm["cubin"]),
        }
    return report


@pytest.fixture(scope="module")
def hopper_build() -> dict[str, dict]:
    """compile_for_hopper() in a fresh process: code generation cannot run where triton was imported
    under TRITON_INTERPRET=1 (the kernels are then interpreter objects). TRITON_INTERPRET=0 there
    also stops this module and conftest from switching the interpreter on."""
    script = "import json, test_triton_kernels as t; print(json.dumps(t.compile_for_hopper()))"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", script], cwd=tests_dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [c[0] for c in AOT_CASES])
def test_kernel_compiles_for_hopper(hopper_build, name):
    info = hopper_build[name]
    assert info["sm_90"] and info["cubin"] > 0, info
    usage = info["usage"]
    if usage is not None:
        print(f"{name}: num_warps={info['num_warps']} registers={usage['REG']} stack={usage['STACK']} shared={usage['SHARED']}")
        assert usage["STACK"] == 0, f"{name} spills registers: {usage}"
        assert usage["SHARED"] <= 228 * 1024, f"{name} exceeds Hopper's shared memory per block: {usage}"

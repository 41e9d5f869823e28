"""The compiled extension margrpo._C: every kernel of torch.ops.margrpo against margrpo.ops.oracle.

Kernel level (docs/CONTRACTS.md): contiguous 2-D/3-D inputs, outputs in the accumulation dtype.
Each test draws fresh random inputs, rounds them to the dtype under test, and compares the kernel
with the oracle evaluated on those same rounded values, so the tolerance covers only the kernel's
own fp32 (fp64) arithmetic. Outputs are poisoned (NaN / True / max-int) before the kernels run, so an
element a kernel forgets to write fails. CPU kernels always run; the CUDA kernels run in the `gpu`
test when a device is present.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from margrpo.ops import oracle as ref

_C = pytest.importorskip("margrpo._C", reason="margrpo._C is not built (MARGRPO_NO_EXTENSION=1 or a failed build)")
K = torch.ops.margrpo

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# tolerance of the kernel arithmetic: fp64 inputs compute in fp64, every other dtype in fp32
ACC_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def tol(dtype: torch.dtype, device: str = "cpu") -> float:
    # device math runs with --use_fast_math (approximate exp/log/division in fp32)
    base = ACC_TOL[ref.acc_dtype(dtype)]
    return base if device == "cpu" or dtype == torch.float64 else 1e-4


def rand(gen, *shape, dtype=torch.float64, device="cpu", scale=1.0, shift=0.0) -> torch.Tensor:
    """Normal samples drawn on CPU (same values on every device), rounded to dtype, then moved."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype).to(device)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> None:
    """Same dtype and values (NaN where the reference has NaN)."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, expected {expected.dtype}"
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=rtol, atol=atol, equal_nan=True)


# ------------------------------------------------------------------------------------------- builds
def _nvcc_present() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and (CUDA_HOME is not None or shutil.which("nvcc") is not None)


@pytest.mark.skipif(not _nvcc_present(), reason="no nvcc or a CPU-only torch: the extension is CPU-only by design")
def test_extension_built_with_cuda_kernels_for_hopper():
    assert _C.with_cuda, "nvcc is present but margrpo._C was built without its CUDA kernels (MARGRPO_BUILD_CUDA=0?)"
    # nvcc's __CUDA_ARCH_LIST__ as recorded by csrc/build_info.cu: 900 is sm_90 (Hopper)
    assert 900 in _C.cuda_archs, f"the CUDA kernels target {_C.cuda_archs}, expected sm_90 (900) among them"
    with open(_C.__file__, "rb") as f:
        assert b".nv_fatbin" in f.read(), "no embedded device code (.nv_fatbin section) in margrpo._C"


def test_every_contract_kernel_is_registered():
    names = [
        "gaussian_logprob_fwd", "gaussian_logprob_bwd", "trajectory_std_fwd", "trajectory_std_bwd",
        "topk_indices_fwd", "topk_mask_fwd", "consistency_mask_fwd", "grpo_surrogate_fwd",
    ]  # fmt: skip
    missing = [n for n in names if not hasattr(K, n)]
    assert not missing, f"torch.ops.margrpo lacks {missing}"
    assert "float threshold" in str(K.consistency_mask_fwd.default._schema)


# ------------------------------------------------------------------------------------------ checks
def check_gaussian(gen, R, C, per_row, reduce, dtype, device="cpu"):
    x = rand(gen, R, C, dtype=dtype, device=device)
    mean = x + rand(gen, R, C, dtype=dtype, device=device, scale=0.5)
    std = (torch.rand(R, 1 if per_row else C, generator=gen, dtype=torch.float64) * 1.5 + 0.05).to(dtype).to(device)
    if R > 2:  # non-positive std: the element (and its row sum) is NaN, never floored
        std[1, 0] = 0.0
        std[2, -1] = -0.5
    out = K.gaussian_logprob_fwd(x, mean, std, reduce)
    expected = ref.gaussian_logprob_fwd(x, mean, std, reduce)
    # a sum of C terms, each up to ~ (x - mean)^2 / std^2 in magnitude, cancels to this scale
    scale = max(1.0, C * 50.0)
    assert_matches(out, expected, tol(dtype, device), tol(dtype, device) * scale)

    good = torch.ones(R, 1, dtype=torch.bool, device=device) if R <= 2 else (std > 0).all(-1, keepdim=True)
    std_ok = torch.where(good, std, torch.ones_like(std))  # gradients at a valid std only
    g = rand(gen, *(expected.shape), dtype=ref.acc_dtype(dtype), device=device)
    grads = K.gaussian_logprob_bwd(g, x, mean, std_ok, reduce)
    expected_grads = ref.gaussian_logprob_bwd(g, x, mean, std_ok, reduce)
    for got, want in zip(grads, expected_grads):
        assert_matches(got, want, tol(dtype, device), tol(dtype, device) * scale * 10)


def check_trajectory_std(gen, Kt, M, C, dtype, device="cpu"):
    samples = rand(gen, Kt, M, C, dtype=dtype, device=device, shift=3.0)
    if M > 1:
        samples[:, 1, : max(1, C // 2)] = 1.25  # zero spread (exactly representable): std 0, gradient 0
    out = K.trajectory_std_fwd(samples)
    assert_matches(out, ref.trajectory_std_fwd(samples), tol(dtype, device), tol(dtype, device) * 4)
    g = rand(gen, M, dtype=ref.acc_dtype(dtype), device=device)
    grad = K.trajectory_std_bwd(g, samples)
    assert_matches(grad, ref.trajectory_std_bwd(g, samples), tol(dtype, device), tol(dtype, device) * 4)


def tie_heavy_scores(gen, B, N, dtype, device="cpu"):
    """Scores with many exact ties (few distinct values), signed zeros and infinities."""
    scores = torch.randint(-4, 5, (B, N), generator=gen).to(torch.float64) * 0.25
    scores[:, ::7] = -0.0
    if N > 3:
        scores[:, 3] = float("inf")
        scores[:, -1] = float("-inf")
    return scores.to(dtype).to(device)


def check_topk(gen, B, N, k, dtype, ties, device="cpu"):
    scores = tie_heavy_scores(gen, B, N, dtype, device) if ties else rand(gen, B, N, dtype=dtype, device=device)
    idx = K.topk_indices_fwd(scores, k)
    assert idx.dtype == torch.int64 and idx.shape == (B, k)
    assert torch.equal(idx.cpu(), ref.topk_indices_fwd(scores, k).cpu())
    mask = K.topk_mask_fwd(scores, k)
    assert mask.dtype == torch.bool and mask.shape == (B, N)
    assert torch.equal(mask.cpu(), ref.topk_mask_fwd(scores, k).cpu())


def check_consistency(gen, M, C, dtype, threshold, device="cpu"):
    final = rand(gen, M, C, dtype=dtype, device=device)
    prev = (final.double() + rand(gen, M, C, scale=1.5, device=device)).to(dtype)
    cur = (final.double() + rand(gen, M, C, device=device)).to(dtype)
    if M > 3:
        cur[0] = 0  # zero norm: its cosine is defined as 0
        prev[1] = 0
        final[2] = 0
    out = K.consistency_mask_fwd(prev, cur, final, threshold)
    assert out.dtype == torch.bool and out.shape == (M,)
    expected = ref.consistency_mask_fwd(prev, cur, final, threshold)
    # rows within rounding of the threshold may go either way; all others must agree exactly
    p, c, f = prev.double(), cur.double(), final.double()
    margin = (ref.cosine_or_zero(c, f) - ref.cosine_or_zero(p, f) - threshold).abs()
    decided = margin.cpu() > 100 * tol(dtype, device)
    assert decided.float().mean() >= 0.75
    assert torch.equal(out.cpu()[decided], expected.cpu()[decided])


def grpo_inputs(gen, T, B, L, dtype, device="cpu"):
    old = rand(gen, T, B, L, dtype=dtype, device=device, scale=3.0, shift=-20.0)
    logp = (old.double() + rand(gen, T, B, L, scale=0.3, device=device)).to(dtype)
    if logp.numel() > 2:
        logp.view(-1)[0] = old.view(-1)[0] + 40.0  # beyond the +-20 log-ratio clamp
        logp.view(-1)[1] = old.view(-1)[1] - 40.0
    adv = rand(gen, B, device=device)
    kept = torch.rand(B, L, generator=gen) < 0.8
    weights = kept.double() * torch.rand(B, L, generator=gen, dtype=torch.float64)
    weights = (weights / weights.sum().clamp_min(1e-12)).to(ref.acc_dtype(dtype)).to(device)
    mte = (torch.rand(B, L, generator=gen) < 0.3).to(device)
    return logp, old, adv.to(ref.acc_dtype(dtype)), weights, mte


def check_grpo(gen, T, B, L, dtype, clip_low=0.2, clip_high=0.28, device="cpu"):
    args = grpo_inputs(gen, T, B, L, dtype, device)
    loss, stats, grad = K.grpo_surrogate_fwd(*args, clip_low, clip_high)
    e_loss, e_stats, e_grad = ref.grpo_surrogate_fwd(*args, clip_low, clip_high)
    t = tol(dtype, device)
    assert_matches(loss, e_loss, t * 10, t * 10)
    assert_matches(stats, e_stats, t * 10, t * 10)
    assert_matches(grad, e_grad, t, t)
    return args, (loss, stats, grad)


# ------------------------------------------------------------------------------------ CPU kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", [ref.REDUCE_NONE, ref.REDUCE_SUM, ref.REDUCE_MEAN])
@pytest.mark.parametrize("per_row", [True, False], ids=["std_row", "std_elem"])
@pytest.mark.parametrize("R,C", [(37, 16), (5, 3), (3, 67), (1, 1)])
def test_gaussian_logprob_cpu(gen, poison_uninitialized, R, C, per_row, reduce, dtype):
    check_gaussian(gen, R, C, per_row, reduce, dtype)


@pytest.mark.parametrize("reduce", [ref.REDUCE_NONE, ref.REDUCE_SUM, ref.REDUCE_MEAN])
def test_gaussian_logprob_cpu_empty_and_mixed_dtypes(gen, poison_uninitialized, reduce):
    for R, C in [(0, 16), (4, 0)]:
        e = torch.empty(R, C)
        out = K.gaussian_logprob_fwd(e, e, torch.ones(R, 1), reduce)
        assert out.shape == ((R, C) if reduce == ref.REDUCE_NONE else (R,))
        assert_matches(out, ref.gaussian_logprob_fwd(e, e, torch.ones(R, 1), reduce), 0, 0)
        for got, want in zip(K.gaussian_logprob_bwd(out, e, e, torch.ones(R, 1), reduce),
                             ref.gaussian_logprob_bwd(out, e, e, torch.ones(R, 1), reduce)):  # fmt: skip
            assert_matches(got, want, 0, 0)
    # operands of different dtypes compute in the accumulation dtype of x, as the reference does
    x, mean = rand(gen, 9, 16, dtype=torch.bfloat16), rand(gen, 9, 16)
    std = torch.rand(9, 16, generator=gen, dtype=torch.float64) + 0.5
    assert_matches(K.gaussian_logprob_fwd(x, mean, std, reduce), ref.gaussian_logprob_fwd(x, mean, std, reduce), 1e-5, 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Kt,M,C", [(2, 33, 16), (3, 7, 5), (5, 4, 70), (4, 1, 1)])
def test_trajectory_std_cpu(gen, poison_uninitialized, Kt, M, C, dtype):
    check_trajectory_std(gen, Kt, M, C, dtype)


def test_trajectory_std_cpu_empty(poison_uninitialized):
    for shape in [(3, 0, 16), (2, 4, 0)]:
        s = torch.zeros(shape)
        out = K.trajectory_std_fwd(s)
        assert out.shape == (shape[1],)
        assert_matches(out, ref.trajectory_std_fwd(s), 0, 0)
        g = torch.ones(shape[1])
        assert_matches(K.trajectory_std_bwd(g, s), ref.trajectory_std_bwd(g, s), 0, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("B,N,k", [(3, 101, 30), (2, 1024, 307), (1, 5000, 1500), (4, 9, 1), (2, 9, 9), (2, 7, 0)])
def test_topk_cpu(gen, poison_uninitialized, B, N, k, dtype, ties):
    check_topk(gen, B, N, k, dtype, ties)


def test_topk_cpu_empty_and_nan(poison_uninitialized):
    for B, N in [(0, 5), (3, 0)]:
        s = torch.zeros(B, N)
        assert K.topk_indices_fwd(s, 0).shape == (B, 0)
        assert torch.equal(K.topk_mask_fwd(s, 0), torch.zeros(B, N, dtype=torch.bool))
    # NaN is outside the contract; the keys still give a total order (NaN first, like torch.sort)
    s = torch.tensor([[0.5, float("nan"), 2.0, -1.0]])
    assert torch.equal(K.topk_indices_fwd(s, 2), ref.topk_indices_fwd(s, 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,C,threshold", [(257, 16, 0.0), (31, 3, 0.05), (9, 70, -0.1)])
def test_consistency_mask_cpu(gen, poison_uninitialized, M, C, dtype, threshold):
    check_consistency(gen, M, C, dtype, threshold)


def test_consistency_mask_cpu_empty(poison_uninitialized):
    e = torch.empty(0, 16)
    assert K.consistency_mask_fwd(e, e, e, 0.0).shape == (0,)
    z = torch.zeros(3, 0)  # no channels: both cosines are 0, so the gain 0 is kept only below a negative threshold
    assert torch.equal(K.consistency_mask_fwd(z, z, z, -0.5), ref.consistency_mask_fwd(z, z, z, -0.5))
    assert torch.equal(K.consistency_mask_fwd(z, z, z, 0.0), ref.consistency_mask_fwd(z, z, z, 0.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,B,L", [(1, 4, 33), (4, 3, 1024), (6, 2, 7)])
def test_grpo_surrogate_cpu(gen, poison_uninitialized, T, B, L, dtype):
    check_grpo(gen, T, B, L, dtype)


def test_grpo_surrogate_cpu_is_deterministic_across_thread_counts(gen):
    args = grpo_inputs(gen, 5, 8, 1024, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = K.grpo_surrogate_fwd(*args, 0.2, 0.2)
        torch.set_num_threads(max(2, threads))
        many = K.grpo_surrogate_fwd(*args, 0.2, 0.2)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b), "the reduction order must not depend on the thread count"


def test_grpo_surrogate_cpu_empty_and_nothing_kept(gen, poison_uninitialized):
    for T, B, L in [(2, 0, 5), (3, 4, 0)]:
        z = torch.zeros(T, B, L)
        args = (z, z, torch.zeros(B), torch.zeros(B, L), torch.zeros(B, L, dtype=torch.bool))
        loss, stats, grad = K.grpo_surrogate_fwd(*args, 0.2, 0.2)
        assert loss.item() == 0 and stats.tolist() == [0.0, 0.0, 0.0, 1.0] and grad.shape == (T, B, L)
    logp, old, adv, weights, mte = grpo_inputs(gen, 2, 3, 5, torch.float32)
    loss, stats, grad = K.grpo_surrogate_fwd(logp, old, adv, torch.zeros_like(weights), mte, 0.2, 0.2)
    assert loss.item() == 0 and stats[3].item() == 1.0 and not grad.any()


def test_cpu_log_and_exp_are_accurate_over_their_whole_range(gen):
    # the fp32 CPU kernels use polynomial log / exp (csrc/cpu_math.h): check them over every magnitude
    # log: with x == mean the element is -log(std) - log(sqrt(2 pi)); std spans 1e-37 .. 1e37
    std = torch.exp(torch.empty(4096, 1, dtype=torch.float64).uniform_(-85.0, 85.0, generator=gen)).float()
    std = std.expand(4096, 16).contiguous()
    x = torch.randn(4096, 16, generator=gen)
    out = K.gaussian_logprob_fwd(x, x, std, ref.REDUCE_NONE)
    torch.testing.assert_close(out, ref.gaussian_logprob_fwd(x, x, std, ref.REDUCE_NONE), rtol=2e-7, atol=2e-7)
    # exp: with no clipping the gradient is -w A r, r = exp(logp - old) over the whole clamp range
    T, B, L = 1, 2, 4096
    old = torch.zeros(T, B, L)
    logp = torch.empty(T, B, L).uniform_(-21.0, 21.0, generator=gen)
    adv = torch.tensor([-1.0, 1.0])
    weights = torch.ones(B, L)
    mte = torch.zeros(B, L, dtype=torch.bool)
    args = (logp, old, adv, weights, mte, 1.0, 1e30)
    grad = K.grpo_surrogate_fwd(*args)[2]
    torch.testing.assert_close(grad, ref.grpo_surrogate_fwd(*args)[2], rtol=1e-6, atol=0)


_X, _Z3 = torch.zeros(4, 16), torch.zeros(2, 4, 16)
ERROR_CASES = [  # (kernel, args, message): one test each, so a crash in an error path names its call
    (
        "gaussian_logprob_fwd",
        (_X, torch.zeros(4, 15), torch.ones(4, 1), 1),
        r"gaussian_logprob_fwd: mean must have the shape of x \[4, 16\]",
    ),
    ("gaussian_logprob_fwd", (_X, _X, torch.ones(4, 3), 1), r"std must be \[R, 1\] or \[R, C\]"),
    ("gaussian_logprob_fwd", (_X, _X, torch.ones(4, 1), 7), "reduce must be 0 .none., 1 .sum. or 2 .mean., got 7"),
    ("gaussian_logprob_fwd", (_X.long(), _X, torch.ones(4, 1), 1), "x must be a floating tensor"),
    ("trajectory_std_fwd", (torch.zeros(1, 4, 16),), "K >= 2 trajectories"),
    ("topk_mask_fwd", (_X, 17), r"k must be in \[0, N\] = \[0, 16\]"),
    ("consistency_mask_fwd", (_X, _X, torch.zeros(4, 8), 0.0), "final must have the shape of cur"),
    ("grpo_surrogate_fwd", (_Z3, _Z3, torch.zeros(4), torch.zeros(4, 16), torch.zeros(4, 16), 0.2, 0.2), "mte_mask must be a bool tensor"),
    (
        "grpo_surrogate_fwd",
        (_Z3, _Z3, torch.zeros(3), torch.zeros(4, 16), torch.zeros(4, 16, dtype=torch.bool), 0.2, 0.2),
        r"advantages must be \[B\] = \[4\]",
    ),
]


def _on_cuda(*args):
    """`args` with their CPU tensors moved to the GPU, except the tensor arguments at `keep`."""
    return lambda keep=(): tuple(a.cuda() if isinstance(a, torch.Tensor) and i not in keep else a for i, a in enumerate(args))


# the CUDA kernels' error paths (a GPU only), and the device mismatches the dispatcher sends to them:
# one CPU operand among CUDA ones reaches the CUDA kernel, which must name it, not read its pointer
CUDA_ERROR_CASES = [
    ("gaussian_logprob_fwd", (_on_cuda(_X, torch.zeros(4, 15), torch.ones(4, 1), 1), ()), "mean must have the shape of x"),
    ("gaussian_logprob_fwd", (_on_cuda(_X, _X, torch.ones(4, 1), 1), (1,)), "mean is on cpu but x is on cuda"),
    ("gaussian_logprob_fwd", (_on_cuda(_X, _X, torch.ones(4, 1), 1), (2,)), "std is on cpu but x is on cuda"),
    ("gaussian_logprob_bwd", (_on_cuda(torch.zeros(4), _X, _X, torch.ones(4, 1), 1), (0,)), "grad_out is on cpu"),
    ("trajectory_std_fwd", (_on_cuda(torch.zeros(1, 4, 16)), ()), "K >= 2 trajectories"),
    ("trajectory_std_bwd", (_on_cuda(torch.zeros(4), _Z3), (0,)), "grad_out is on cpu but samples is on cuda"),
    ("topk_mask_fwd", (_on_cuda(_X, 17), ()), r"k must be in \[0, N\]"),
    ("topk_indices_fwd", (_on_cuda(_X, 17), ()), r"k must be in \[0, N\]"),
    ("consistency_mask_fwd", (_on_cuda(_X, _X, _X, 0.0), (0,)), "prev is on cpu but cur is on cuda"),
    (
        "grpo_surrogate_fwd",
        (_on_cuda(_Z3, _Z3, torch.zeros(4), torch.zeros(4, 16), torch.zeros(4, 16, dtype=torch.bool), 0.2, 0.2), (3,)),
        "weights is on cpu but logp is on cuda",
    ),
]

# Each error case runs in a child process: a C++ error path that crashes (in run 2 on the H200 the
# pytest process segfaulted in this test, taking every later test with it) fails its own case with
# the signal, and the remaining cases run in a fresh child. One child serves every case until one
# crashes, so the isolation costs one interpreter start.
_RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("extension_error_cases", sys.argv[1])
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
table = getattr(cases, sys.argv[2])
for i in range(int(sys.argv[3]), len(table)):
    kernel, args, match = table[i]
    print(json.dumps({"case": i, "event": "start"}), flush=True)
    if isinstance(args, tuple) and args and callable(args[0]):
        make, keep = args
        args = make(keep)
    try:
        (kernel if callable(kernel) else getattr(cases.K, kernel))(*args)
        result = {"outcome": "returned"}
    except Exception as err:
        result = {"outcome": type(err).__name__, "message": str(err)}
    print(json.dumps({"case": i, **result}), flush=True)
"""


def run_isolated(table: str) -> dict[int, dict]:
    """case index -> {outcome, message} for every case of ERROR_CASES / CUDA_ERROR_CASES, each run
    in a child process; a case whose child died gets outcome "crashed (exit N)"."""
    import json
    import subprocess
    import sys

    n, results, start = len(globals()[table]), {}, 0
    while start < n:
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, __file__, table, str(start)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=str(__import__("pathlib").Path(__file__).parent),
        )
        started = None
        for line in done.stdout.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("event") == "start":
                started = record["case"]
            else:
                results[record["case"]] = record
                started = None
        if done.returncode == 0:
            break
        crashed = start if started is None else started  # died before its first case: blame that one
        results[crashed] = {"outcome": f"crashed (exit {done.returncode})", "message": done.stderr[-3000:]}
        start = crashed + 1
    return results


@pytest.fixture(scope="module")
def cpu_error_outcomes():
    return run_isolated("ERROR_CASES")


@pytest.fixture(scope="module")
def cuda_error_outcomes():
    return run_isolated("CUDA_ERROR_CASES")


def _check_error(outcomes: dict[int, dict], cases: list, case: int) -> None:
    kernel, _, match = cases[case]
    got = outcomes.get(case, {"outcome": "not run"})
    assert got["outcome"] == "RuntimeError", f"{kernel}: expected a RuntimeError matching {match!r}, got {got}"
    assert re.search(match, got["message"]), f"{kernel}: {got['message']!r} does not match {match!r}"


@pytest.mark.parametrize("case", range(len(ERROR_CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(ERROR_CASES)])
def test_errors_name_the_argument(cpu_error_outcomes, case):
    _check_error(cpu_error_outcomes, ERROR_CASES, case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(len(CUDA_ERROR_CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CUDA_ERROR_CASES)])
def test_cuda_errors_name_the_argument(cuda_error_outcomes, case):
    _check_error(cuda_error_outcomes, CUDA_ERROR_CASES, case)


def _segfault():
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


# the isolation's own test: a case that kills its process between two cases that raise
_CRASH_CASES = [ERROR_CASES[0], (_segfault, (), ""), ERROR_CASES[6]]


def test_a_crashing_case_fails_alone():
    results = run_isolated("_CRASH_CASES")
    assert results[0]["outcome"] == "RuntimeError" and results[2]["outcome"] == "RuntimeError", results
    # -11: SIGSEGV (an AddressSanitizer build reports it and exits 1 instead)
    assert results[1]["outcome"].startswith("crashed (exit ") and results[1]["outcome"] != "crashed (exit 0)", results[1]


# ----------------------------------------------------------------------------------- CUDA kernels
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["gaussian_logprob", "trajectory_std", "topk", "consistency_mask", "grpo_surrogate"])
def test_cuda_kernels_match_reference(poison_uninitialized, op, dtype):
    """One test per op and dtype, so the GPU run's table shows which kernel fails at which dtype."""
    assert _C.with_cuda, "a CUDA device is present but margrpo._C has no CUDA kernels"
    gen = torch.Generator().manual_seed(1234)
    dev = "cuda"
    if op == "gaussian_logprob":
        for R, C in [(37, 16), (5, 3), (3, 67), (40961, 16)]:
            for per_row in (True, False):
                for reduce in (ref.REDUCE_NONE, ref.REDUCE_SUM, ref.REDUCE_MEAN):
                    check_gaussian(gen, R, C, per_row, reduce, dtype, dev)
    elif op == "trajectory_std":
        for Kt, M, C in [(2, 33, 16), (3, 7, 5), (5, 4, 70), (3, 4096, 16)]:
            check_trajectory_std(gen, Kt, M, C, dtype, dev)
    elif op == "topk":
        for B, N, k in [(3, 101, 30), (4, 1024, 307), (2, 4096, 1228), (2, 5000, 1500), (3, 16384, 4915),
                        (2, 9, 9), (2, 7, 0), (70000, 3, 1)]:  # fmt: skip
            for ties in (False, True):
                check_topk(gen, B, N, k, dtype, ties, dev)
    elif op == "consistency_mask":
        for M, C, threshold in [(257, 16, 0.0), (31, 3, 0.05), (9, 70, -0.1), (65537, 16, 0.0)]:
            check_consistency(gen, M, C, dtype, threshold, dev)
    else:
        for T, B, L in [(1, 4, 33), (4, 3, 1024), (6, 64, 1024)]:
            check_grpo(gen, T, B, L, dtype, device=dev)


@pytest.mark.gpu
@needs_cuda
def test_cuda_kernels_deterministic_and_empty():
    gen = torch.Generator().manual_seed(1234)
    dev = "cuda"
    # the two-stage reduction is bitwise reproducible
    args = grpo_inputs(gen, 6, 64, 1024, torch.float32, dev)
    first = K.grpo_surrogate_fwd(*args, 0.2, 0.2)
    again = K.grpo_surrogate_fwd(*args, 0.2, 0.2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    # empty inputs on the device
    z = torch.zeros(3, 0, 5, device=dev)
    loss, stats, _ = K.grpo_surrogate_fwd(z, z, torch.zeros(0, device=dev), torch.zeros(0, 5, device=dev),
                                          torch.zeros(0, 5, dtype=torch.bool, device=dev), 0.2, 0.2)  # fmt: skip
    assert loss.item() == 0 and stats.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert K.gaussian_logprob_fwd(*(torch.zeros(0, 16, device=dev),) * 2, torch.ones(0, 1, device=dev), 1).shape == (0,)
    assert K.topk_mask_fwd(torch.zeros(0, 8, device=dev), 3).shape == (0, 8)

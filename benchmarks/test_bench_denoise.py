"""pytest-benchmark suite of multi-seed denoising (margrpo.bench.denoise) at real head sizes.

    pytest benchmarks/test_bench_denoise.py --benchmark-only [--benchmark-json out.json]

Reduced tokens and steps so each case takes seconds on a CPU; every case runs ROUNDS timed rounds
(MARGRPO_BENCH_ROUNDS; default 10 on CUDA, 5 on CPU) after one warm-up round, so the report has a
spread, and checks that the timed path reproduces the eager per-seed reference. `compile` is left to
the CLI suite (its compilation would dominate here).
"""

from __future__ import annotations

import os

import pytest
import torch

from margrpo.bench import denoise as bench

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOKENS, STEPS = (1024, 25) if DEVICE.type == "cuda" else (8, 2)
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
ROUNDS = int(os.environ.get("MARGRPO_BENCH_ROUNDS", "10" if DEVICE.type == "cuda" else "5"))


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """One intra-op thread on CPU: the project machines are shared 2-core boxes where a second
    thread mostly waits (see benchmarks/results); CUDA runs are unaffected."""
    threads = torch.get_num_threads()
    if DEVICE.type == "cpu":
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(bench.CASES))
def setup(request):
    """Head, inputs and the eager reference x0 of one case (its run also warms up both paths)."""
    case = bench.CASES[request.param]
    head = bench.build(case, DEVICE, DTYPE)
    sampler = bench.make_sampler(case, STEPS)
    z, noise = bench.make_inputs(head, case, TOKENS, STEPS, DEVICE)
    fns = bench.methods(head, case, sampler, z, noise, ("fused", "eager"))
    return request.param, fns, fns["eager"]()


@pytest.mark.parametrize("method", ["fused", "eager"])
def test_denoise(benchmark, setup, method):
    case, fns, reference = setup
    benchmark.group = f"denoise {case} tokens={TOKENS} steps={STEPS}"
    x0 = benchmark.pedantic(fns[method], rounds=ROUNDS, warmup_rounds=1, iterations=1)
    assert x0.shape == reference.shape
    relative = (x0.float() - reference.float()).abs().max() / reference.float().abs().max()
    assert relative < (2e-2 if DTYPE == torch.bfloat16 else 1e-4)

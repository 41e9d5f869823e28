"""Triton compiles one variant per launcher configuration, not one per token count.

Triton specialises integer arguments by value class (1, a multiple of 16, other) unless a kernel lists
them in `do_not_specialize`; each class is a separate compile on the GPU, seconds of a timed rollout
whose warm-up saw other token counts. Here every launcher is called at row counts from each class,
its launch arguments are recorded (the kernel itself is not run), and Triton's own binder computes
the specialisation key the GPU would compile for: one key per kernel across the row counts, with the
widths and strides that let the loads vectorise still specialised as multiples of 16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

triton = pytest.importorskip("triton")
jit = pytest.importorskip("triton.runtime.jit")
if not hasattr(jit, "create_function_from_signature"):
    pytest.skip(f"triton {triton.__version__} has no create_function_from_signature to compute keys with", allow_module_level=True)
from triton.backends.compiler import BaseBackend  # noqa: E402

from margrpo.kernels import adaln, consistency, gaussian_logprob, trajectory_std  # noqa: E402

ROW_COUNTS = (1, 5, 16, 37, 48, 1000)  # each of Triton's classes; one block bucket of every launcher
WIDTH = 32  # a multiple of 16, as the real heads' (1024, 1280) and the token channels (16)


class _Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the call."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _key(kernel, args, kwargs) -> tuple:
    """The specialisation a GPU launch of `kernel` with these arguments compiles (Triton's binder)."""
    skipped = kernel.do_not_specialize if hasattr(kernel, "do_not_specialize") else kernel.kwargs.get("do_not_specialize")
    rebuilt = jit.JITFunction(kernel.fn, do_not_specialize=skipped)
    binder = jit.create_function_from_signature(rebuilt.signature, rebuilt.params, BaseBackend)
    params, specialization, _ = binder(*args, **kwargs)
    return tuple(zip(params, specialization))


def _adaln(fn, affine: bool):
    def call(rows: int, trajectories: int = 3, halves: int = 2):
        x = torch.randn(trajectories, halves, rows, WIDTH)
        mod = torch.randn(halves, rows, WIDTH)
        weight = torch.randn(WIDTH) if affine else None
        bias = torch.randn(WIDTH) if affine else None
        fn(x, mod, mod, weight, bias, 1e-6)

    return call


def _gaussian_bwd(rows: int):
    x = torch.randn(rows, 16)
    gaussian_logprob.gaussian_logprob_bwd(torch.randn(rows), x, x, torch.rand(rows, 1) + 0.5, gaussian_logprob.REDUCE_SUM)


CASES = {
    # kernel: (module, launcher at a row count, arguments that must stay multiples of 16)
    "ln_modulate": (adaln, "_ln_modulate_kernel", _adaln(adaln.ln_modulate, False), ("W", "x_sb", "x_sn")),
    "gate_residual": (adaln, "_gate_residual_kernel", _adaln(adaln.gate_residual, True), ("W", "r_sb", "r_sn")),
    "gaussian_logprob_fwd": (
        gaussian_logprob,
        "_gaussian_logprob_fwd_kernel",
        lambda rows: gaussian_logprob.gaussian_logprob_fwd(
            torch.randn(rows, 16), torch.randn(rows, 16), torch.rand(rows, 16) + 0.5, gaussian_logprob.REDUCE_NONE
        ),
        ("C",),
    ),
    "gaussian_logprob_bwd": (gaussian_logprob, "_gaussian_logprob_bwd_kernel", _gaussian_bwd, ("C",)),
    "consistency_mask": (
        consistency,
        "_consistency_mask_kernel",
        lambda rows: consistency.consistency_mask_fwd(*(torch.randn(rows, 16) for _ in range(3)), 0.0),
        ("C",),
    ),
    "trajectory_std_fwd": (
        trajectory_std,
        "_trajectory_std_fwd_kernel",
        lambda rows: trajectory_std.trajectory_std_fwd(torch.randn(4, rows, 16)),
        ("C",),
    ),
    "trajectory_std_bwd": (
        trajectory_std,
        "_trajectory_std_bwd_kernel",
        lambda rows: trajectory_std.trajectory_std_bwd(torch.randn(rows), torch.randn(4, rows, 16)),
        ("C",),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_compile_across_row_counts(name, monkeypatch):
    module, attribute, call, aligned = CASES[name]
    kernel = getattr(module, attribute)
    recorder = _Recorder(kernel)
    monkeypatch.setattr(module, attribute, recorder)
    for rows in ROW_COUNTS:
        call(rows)
    assert len(recorder.calls) == len(ROW_COUNTS)
    keys = {_key(kernel, args, kwargs) for args, kwargs in recorder.calls}
    assert len(keys) == 1, f"{name}: {len(keys)} compiled variants for row counts {ROW_COUNTS}"
    spec = dict(next(iter(keys)))
    for param in aligned:
        assert spec[param][-1] == "D", f"{name}: {param} lost its multiple-of-16 specialisation ({spec[param]})"


@pytest.mark.parametrize("fn", [adaln.ln_modulate, adaln.gate_residual], ids=["ln_modulate", "gate_residual"])
def test_adaln_one_compile_across_trajectories_and_halves(fn, monkeypatch):
    """The adaLN kernels' leading counts change too: seed chains or a lone chain, CFG halves or not."""
    attribute = "_ln_modulate_kernel" if fn is adaln.ln_modulate else "_gate_residual_kernel"
    kernel = getattr(adaln, attribute)
    recorder = _Recorder(kernel)
    monkeypatch.setattr(adaln, attribute, recorder)
    for trajectories, halves in ((1, 1), (4, 2), (4, 1), (1, 16), (3, 5)):
        _adaln(fn, False)(37, trajectories, halves)
    assert len({_key(kernel, args, kwargs) for args, kwargs in recorder.calls}) == 1


_VECTOR_SCRIPT = r"""
import json, re, sys
import torch
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.jit import create_function_from_signature
from margrpo.kernels import adaln

kernel = adaln._ln_modulate_kernel
binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
report = {}
for rows in (37, 48):
    x = torch.randn(3, 2, rows, 1280, dtype=torch.bfloat16)  # NOVA's head width
    mod = torch.randn(2, rows, 1280, dtype=torch.bfloat16)
    calls = []
    adaln._ln_modulate_kernel = type("K", (), {"__getitem__": lambda self, grid: lambda *a, **k: calls.append((a, k))})()
    adaln.ln_modulate(x, mod, mod)
    adaln._ln_modulate_kernel = kernel
    args, kwargs = calls[0]
    params, specialization, _ = binder(*args, **kwargs)
    names = list(params)
    constexprs = {n: kwargs[n] for n in ("HAS_AFFINE", "FP64", "BLOCK_W")}
    signature = {n: "constexpr" if n in constexprs else s[0] for n, s in zip(names, specialization)}
    # what a launch with these arguments compiles: Triton's specialisation as compile attributes
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, s) in enumerate(zip(names, specialization)) if n not in constexprs and s[1] == "D"}
    ptx = compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    report[rows] = {"vector_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v\d", ptx)), "loads": len(re.findall(r"ld\.global", ptx))}
print(json.dumps(report))
"""


def test_unspecialised_token_count_keeps_the_vector_loads():
    """The widths and strides that stay specialised are what lets the loads vectorise: compiled for
    Hopper with the specialisation of a real launch (NOVA's width, 37 and 48 tokens), the adaLN kernel
    loads in vectors, and the same code for both counts. In a fresh process: code generation cannot run
    where triton was imported under TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-P", "-c", _VECTOR_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["37"] == report["48"], report
    assert report["37"]["vector_loads"] > 0 and report["37"]["vector_loads"] == report["37"]["loads"], report

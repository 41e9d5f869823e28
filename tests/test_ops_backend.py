"""Backend selection of the public ops: choice, fallbacks, clear errors, import without extras."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import margrpo.ops as ops
from margrpo.ops import _backend, _kernels

CPU = torch.device("cpu")


def test_set_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="backend: got 'fast', expected one of auto, torch, triton, cuda, cpp"):
        ops.set_backend("fast")


def test_use_backend_restores_the_previous_choice():
    before = ops.get_backend()
    with ops.use_backend("torch"):
        assert ops.get_backend() == "torch"
        with pytest.raises(RuntimeError):
            with ops.use_backend("auto"):
                assert ops.get_backend() == "auto"
                raise RuntimeError("inside")
        assert ops.get_backend() == "torch"
    assert ops.get_backend() == before


def test_auto_prefers_cpp_on_cpu_when_its_kernel_is_built():
    with ops.use_backend("auto"):
        chosen = _kernels.pick(CPU, "gaussian_logprob", "gaussian_logprob", "gaussian_logprob_fwd")
    has_cpp = "cpp" in ops.available_backends() and _kernels.find("cpp", "gaussian_logprob", "gaussian_logprob_fwd")
    assert chosen == ("cpp" if has_cpp else "torch")


def test_auto_skips_a_backend_without_the_kernel():
    only_oracle = lambda name: name == "torch"  # noqa: E731
    with ops.use_backend("auto"):
        assert _backend.resolve(CPU, "some_op", only_oracle) == "torch"
    if "cpp" in ops.available_backends():
        with ops.use_backend("cpp"), pytest.raises(RuntimeError, match="some_op: backend 'cpp' has no kernel"):
            _backend.resolve(CPU, "some_op", only_oracle)


def test_explicit_backend_that_cannot_run_here_is_an_error():
    x = torch.zeros(2, 3)
    with ops.use_backend("cuda"), pytest.raises(RuntimeError, match="gaussian_logprob: backend 'cuda' cannot run on cpu"):
        ops.gaussian_logprob(x, x, 1.0)


def test_missing_kernel_lookup_names_the_kernel():
    pytest.importorskip("triton")
    assert _kernels.find("triton", "no_such_module", "no_such_fwd") is None
    with pytest.raises(RuntimeError, match=r"backend 'triton': kernel margrpo.kernels.no_such_module.no_such_fwd"):
        _kernels.get("triton", "no_such_module", "no_such_fwd")
    with pytest.raises(RuntimeError, match=r"backend 'torch': kernel margrpo.ops.oracle.no_such_fwd"):
        _kernels.get("torch", "oracle", "no_such_fwd")


def test_import_without_extension_or_triton():
    """`import margrpo.ops` works with neither margrpo._C nor triton, and the ops run on the oracle."""
    script = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["triton"] = None  # both imports now fail as if not installed
        sys.modules["margrpo._C"] = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, margrpo.ops as ops
        assert any("margrpo._C is not available" in str(w.message) for w in caught), caught
        assert ops.available_backends() == ["torch"], ops.available_backends()
        x = torch.zeros(2, 3)
        assert ops.gaussian_logprob(x, x, 1.0).shape == (2,)
        assert ops.topk_mask(torch.randn(2, 5), k=2).sum() == 4
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]

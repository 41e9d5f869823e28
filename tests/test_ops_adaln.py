"""The adaLN ops (margrpo.ops.ln_modulate / gate_residual, margrpo/ops/adaln.py): each backend that
runs here (triton through the interpreter on CPU) on both routes (direct eager calls; the custom op,
as under torch.compile) against a float64 closed form, torch.compile, opcheck, and the selection
rules. The Triton launch helpers themselves are tested in tests/test_heads.py."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from margrpo import ops
from margrpo.ops import _kernels, _table, adaln, oracle

F64, F32 = torch.float64, torch.float32


@pytest.fixture(params=["torch", "triton"])
def selection(request, monkeypatch) -> str:
    """Each backend of the adaLN ops; triton runs natively on CUDA, else in the interpreter on CPU."""
    if request.param == "triton":
        pytest.importorskip("triton")
        if not torch.cuda.is_available():
            monkeypatch.setenv("TRITON_INTERPRET", "1")
            module = importlib.import_module("margrpo.kernels.adaln")
            if type(module._ln_modulate_kernel).__name__ != "InterpretedFunction":
                importlib.reload(module)
    return request.param


def _device(selection: str) -> torch.device:
    return torch.device("cuda" if selection == "triton" and torch.cuda.is_available() else "cpu")


@pytest.fixture(params=["direct", "custom_op"])
def route(request, monkeypatch) -> list[str]:
    """Each route in turn (the custom op forced as if under torch.compile); yields the custom ops called."""
    calls: list[str] = []
    for fused in (adaln._LN_MODULATE, adaln._GATE_RESIDUAL):
        monkeypatch.setattr(fused, "custom_op", lambda *a, _op=fused.custom_op, _n=fused.name: calls.append(_n) or _op(*a))
    if request.param == "custom_op":
        monkeypatch.setattr(_kernels, "direct_call_allowed", lambda: False)
    return calls


def _inputs(gen: torch.Generator, dtype: torch.dtype, device: torch.device, A=3, B=2, N=5, W=40):
    """x [A, 1, N, W] (one x for both CFG halves) and a [B, N, 3W] modulation's strided views."""
    x = torch.randn(A, 1, N, W, generator=gen, dtype=F64)
    h = torch.randn(A, B, N, W, generator=gen, dtype=F64)
    mod = torch.randn(B, N, 3 * W, generator=gen, dtype=F64) * 0.5
    weight, bias = torch.randn(W, generator=gen, dtype=F64), torch.randn(W, generator=gen, dtype=F64)
    cast = lambda t: t.to(dtype).to(device)  # noqa: E731
    return x, h, mod, weight, bias, cast


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("affine", [False, True])
def test_matches_closed_form(selection, route, dtype, affine):
    gen = torch.Generator().manual_seed(11)
    x, h, mod, weight, bias, cast = _inputs(gen, dtype, _device(selection))
    w, b = (weight, bias) if affine else (None, None)
    shift, scale, gate = mod.chunk(3, -1)
    want_ln = F.layer_norm(x, x.shape[-1:], w, b, 1e-6) * (1 + scale) + shift
    want_gate = x + gate * (F.layer_norm(h, h.shape[-1:], w, b, 1e-5) if affine else h)
    cw, cb = (cast(w), cast(b)) if affine else (None, None)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-5)
    cmod = cast(mod)
    with torch.no_grad():
        got = ops.ln_modulate(cast(x), *cmod.chunk(3, -1)[:2], cw, cb, 1e-6, backend=selection)
        torch.testing.assert_close(got.cpu().to(F64), want_ln, **tol)
        residual = cast(x.expand(h.shape).contiguous())  # the head's running hidden state: full shape
        before = residual.clone()
        got = ops.gate_residual(residual, cast(h), cmod.chunk(3, -1)[2], cw, cb, 1e-5, backend=selection)
    torch.testing.assert_close(got.cpu().to(F64), want_gate, **tol)
    # eager calls overwrite the dead hidden state; a custom op must leave its input alone
    if route:
        assert route == ["ln_modulate", "gate_residual"] or selection == "torch"
        assert torch.equal(residual, before) or selection == "torch"
    else:
        assert got.data_ptr() == residual.data_ptr()


def test_custom_op_route_takes_the_oracle_inline_for_torch(route, monkeypatch):
    """Under the custom-op route the torch backend runs the oracle inline (torch.compile traces its
    PyTorch ops), not through the custom op."""
    monkeypatch.setattr(_kernels, "direct_call_allowed", lambda: False)
    x = torch.randn(2, 1, 3, 8, dtype=F64)
    mod = torch.randn(2, 3, 8, dtype=F64)
    with torch.no_grad():
        ops.ln_modulate(x, mod, mod, backend="torch")
        ops.gate_residual(x, x, mod, backend="torch")
    assert route == []


def test_compiles_fullgraph_and_matches_eager(selection):
    gen = torch.Generator().manual_seed(12)
    x, h, mod, weight, bias, cast = _inputs(gen, F32, _device(selection))
    x, h, mod, weight, bias = map(cast, (x, h, mod, weight, bias))

    def block(x, h, mod):
        shift, scale, gate = mod.chunk(3, -1)
        u = ops.ln_modulate(x, shift, scale, weight, bias, 1e-6, backend=selection)
        return ops.gate_residual(u, h, gate, weight, bias, 1e-5, backend=selection)

    with torch.no_grad():
        want = block(x, h, mod)
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x, h, mod)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_opcheck(selection):
    gen = torch.Generator().manual_seed(13)
    x, h, mod, weight, bias, cast = _inputs(gen, F32, _device(selection))
    x, h, mod, weight, bias = map(cast, (x, h, mod, weight, bias))
    shift, scale, gate = mod.chunk(3, -1)
    torch.library.opcheck(torch.ops.margrpo.ln_modulate.default, (x, shift, scale, weight, bias, 1e-6, selection))
    torch.library.opcheck(torch.ops.margrpo.gate_residual.default, (x, h, gate, None, None, 1e-5, selection))


def test_selection(monkeypatch):
    """torch, auto and None (the global choice) run the oracle on CPU, and so do cpp and cuda (the
    adaLN ops have no such kernels: auto's choice); with grad mode on the differentiable oracle runs
    whatever the selection; a bad name is an error even then."""
    calls = []
    original = oracle.ln_modulate_fwd
    monkeypatch.setattr(oracle, "ln_modulate_fwd", lambda *a: calls.append(1) or original(*a))
    _kernels.find.cache_clear()
    _kernels._eager_picks.clear()
    try:
        x, mod = torch.randn(2, 1, 3, 8, dtype=F64), torch.randn(2, 3, 8, dtype=F64)
        for choice in ("torch", "auto", "cpp", "cuda", None):
            with torch.no_grad():
                out = ops.ln_modulate(x, mod, mod, backend=choice)
            torch.testing.assert_close(out, original(x, mod, mod, None, None, 1e-6))
        assert len(calls) == 5
        xg = x.clone().requires_grad_()
        ops.ln_modulate(xg, mod, mod, backend="triton").sum().backward()  # triton has no backward: the oracle
        assert xg.grad is not None and len(calls) == 6
        with pytest.raises(ValueError, match="backend: got 'fast'"):
            ops.ln_modulate(xg, mod, mod, backend="fast")
    finally:
        _kernels.find.cache_clear()
        _kernels._eager_picks.clear()
    assert {"ln_modulate", "gate_residual"} <= set(_table.OPS)
    assert adaln._LN_MODULATE.backends == adaln._GATE_RESIDUAL.backends == ("torch", "triton")


def test_deep_leading_dims_take_the_oracle(monkeypatch):
    """More than two leading dims would make the Triton row view copy a broadcast operand: the oracle."""
    picked = []
    resolve = _kernels._backend.resolve
    monkeypatch.setattr(_kernels._backend, "resolve", lambda *a: picked.append(a[4]) or resolve(*a))
    _kernels._eager_picks.clear()
    x, mod = torch.randn(2, 2, 1, 3, 8, dtype=F64), torch.randn(2, 3, 8, dtype=F64)
    with torch.no_grad():
        ops.ln_modulate(x, mod, mod, backend="triton")
    assert picked == ["torch"]
    _kernels._eager_picks.clear()

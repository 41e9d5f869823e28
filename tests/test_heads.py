"""Diffusion heads: official math and names, the condition/denoise split, and the Triton adaLN kernels."""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch
import torch.nn.functional as F

from margrpo.heads import (
    DiffusionMLP,
    Modulation,
    SimpleMLPAdaLN,
    head_from_state_dict,
    load_head_state_dict,
    mar_head,
    nova_head,
    patchify,
    reinit_zero_layers_,
    unpatchify,
)
from margrpo import ops

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny shapes: intra-op threads only add synchronisation (costly on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _randomize_(head, seed: int = 0, std: float = 0.3):
    """Random adaLN-Zero layers and non-trivial LayerNorm affines, so every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    reinit_zero_layers_(head, std=std, generator=g)
    with torch.no_grad():
        for m in head.modules():
            if isinstance(m, torch.nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g, dtype=m.weight.dtype))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g, dtype=m.bias.dtype))
    return head


def _tiny_mar(learn_sigma=True, seed=0):
    torch.manual_seed(seed)
    return _randomize_(SimpleMLPAdaLN(4, 24, 8 if learn_sigma else 4, 12, 2).to(F64), seed)


def _tiny_nova(seed=0):
    torch.manual_seed(seed)
    return _randomize_(DiffusionMLP(depth=2, embed_dim=24, cond_dim=12, patch_size=2, image_dim=3).to(F64), seed)


# ------------------------------------------------------------------ official math, written from the sources
def _sincos(t, dim=256):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=F64) / half)
    args = t.to(F64)[..., None] * freqs
    return torch.cat([args.cos(), args.sin()], -1)


def _lin(sd, name, x):
    return x @ sd[name + ".weight"].T + sd[name + ".bias"]


def _mar_formula(sd, depth, x, t, z):
    """LTH14/mar SimpleMLPAdaLN.forward from the raw state dict: adaLN chunks are (shift, scale, gate)."""
    y = _lin(sd, "time_embed.mlp.2", F.silu(_lin(sd, "time_embed.mlp.0", _sincos(t)))) + _lin(sd, "cond_embed", z)
    h = _lin(sd, "input_proj", x)
    for i in range(depth):
        p = f"res_blocks.{i}."
        shift, scale, gate = _lin(sd, p + "adaLN_modulation.1", F.silu(y)).chunk(3, -1)
        u = F.layer_norm(h, h.shape[-1:], sd[p + "in_ln.weight"], sd[p + "in_ln.bias"], 1e-6) * (1 + scale) + shift
        h = h + gate * _lin(sd, p + "mlp.2", F.silu(_lin(sd, p + "mlp.0", u)))
    shift, scale = _lin(sd, "final_layer.adaLN_modulation.1", F.silu(y)).chunk(2, -1)
    return _lin(sd, "final_layer.linear", F.layer_norm(h, h.shape[-1:], eps=1e-6) * (1 + scale) + shift)


def _nova_formula(sd, depth, image, t, z, patch):
    """baaivision/NOVA DiffusionMLP.forward on an image batch: conv patch embed, (scale, shift, gate)."""
    h = F.conv2d(image, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch)
    h = h.flatten(2).transpose(1, 2)  # [B, N, W]
    proj = lambda name, v: _lin(sd, name + ".fc2", F.silu(_lin(sd, name + ".fc1", v)))  # noqa: E731
    cond = proj("time_cond_embed.condition_proj", z) + proj("time_cond_embed.timestep_proj", _sincos(t))[:, None]
    for i in range(depth):
        p = f"blocks.{i}."
        scale, shift, gate = _lin(sd, p + "norm1.proj", F.silu(cond)).chunk(3, -1)
        u = F.layer_norm(h, h.shape[-1:], eps=1e-6) * (1 + scale) + shift
        u = proj(p + "proj", u)
        h = h + gate * F.layer_norm(u, u.shape[-1:], sd[p + "norm2.weight"], sd[p + "norm2.bias"], 1e-5)
    scale, shift = _lin(sd, "norm.proj", F.silu(cond)).chunk(2, -1)
    return _lin(sd, "head", F.layer_norm(h, h.shape[-1:], eps=1e-6) * (1 + scale) + shift)


def test_mar_forward_matches_official_math():
    head = _tiny_mar()
    x, z, t = torch.randn(7, 4, dtype=F64), torch.randn(7, 12, dtype=F64), torch.randint(0, 1000, (7,))
    expected = _mar_formula(head.state_dict(), 2, x, t, z)
    torch.testing.assert_close(head(x, t, z), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.denoise(x, head.condition(z, t)), expected, rtol=1e-12, atol=1e-12)


def test_nova_forward_on_tokens_matches_official_image_forward():
    head, patch = _tiny_nova(), 2
    image = torch.randn(2, 3, 6, 4, dtype=F64)  # 3x2 patches of 2x2x3 = 12 channels
    z, t = torch.randn(2, 6, 12, dtype=F64), torch.tensor([3.0, 950.0], dtype=F64)
    expected = _nova_formula(head.state_dict(), 2, image, t, z, patch)
    tokens = patchify(image, patch)
    torch.testing.assert_close(head(tokens, t[:, None], z), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.denoise(tokens, head.condition(z, t[:, None])), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(unpatchify(tokens, 6, 4, patch), image)


@pytest.mark.parametrize("make", [_tiny_mar, _tiny_nova], ids=["mar", "nova"])
def test_denoise_broadcasts_seeds_and_cfg_halves(make):
    """x [K, 1, N, C] against a modulation [2, N, W] equals per-(seed, half) official calls."""
    head = make()
    K, N = 3, 5
    x = torch.randn(K, 1, N, head.in_channels, dtype=F64)
    z = torch.randn(2, N, head.z_channels, dtype=F64)
    modulation = head.condition(z, 421)
    assert modulation.shape == (2, N, head.model_channels if hasattr(head, "model_channels") else head.embed_dim)
    out = head.denoise(x, modulation)
    assert out.shape == (K, 2, N, head.out_channels)
    for k in range(K):
        for half in range(2):
            ref = head(x[k, 0], torch.full((N,), 421.0, dtype=F64), z[half])
            torch.testing.assert_close(out[k, half], ref, rtol=1e-12, atol=1e-12)


def test_modulation_is_a_function_of_z_and_t_only():
    head = _tiny_mar()
    z = torch.randn(4, 12, dtype=F64)
    a, b = head.condition(z, 10), head.condition(z, 10)
    c = head.condition(z, 11)
    assert isinstance(a, Modulation) and len(a.blocks) == head.num_res_blocks
    torch.testing.assert_close(a.blocks[1][2], b.blocks[1][2])
    assert not torch.allclose(a.blocks[1][2], c.blocks[1][2])


def test_reinit_zero_layers_changes_only_zero_init_layers():
    torch.manual_seed(0)
    head = SimpleMLPAdaLN(4, 16, 8, 6, 2)
    x, z = torch.randn(3, 4), torch.randn(3, 6)
    assert torch.count_nonzero(head(x, 5, z)) == 0  # adaLN-Zero: the official init outputs zeros
    before = {k: v.clone() for k, v in head.state_dict().items()}
    reinit_zero_layers_(head, std=0.1, generator=torch.Generator().manual_seed(1))
    zero_names = {n for n, m in head.named_modules() if m in head.zero_init_layers()}
    for key, value in head.state_dict().items():
        changed = not torch.equal(value, before[key])
        assert changed == (key.rsplit(".", 1)[0] in zero_names), key
    assert torch.count_nonzero(head(x, 5, z)) > 0


def test_registered_sizes():
    with torch.device("meta"):  # shapes only: no time spent initialising 150 M parameters
        h, b, n = mar_head("mar_h"), mar_head("mar_b", learn_sigma=False), nova_head("d3w1280", cond_dim=1024)
    assert (h.num_res_blocks, h.model_channels, h.z_channels, h.out_channels) == (12, 1536, 1280, 32)
    assert 140e6 < sum(p.numel() for p in h.parameters()) < 160e6  # the Harmon-1.5B head: about 151 M
    assert b.out_channels == 16
    assert (n.depth, n.embed_dim, n.in_channels) == (3, 1280, 16)
    with pytest.raises(ValueError, match="size"):
        nova_head("d9w9")
    with pytest.raises(ValueError, match="size"):
        mar_head("mar_xl")


def test_bad_shapes_name_the_argument():
    head = _tiny_mar()
    with pytest.raises(ValueError, match="z: got shape"):
        head.condition(torch.randn(3, 5, dtype=F64), 1)
    with pytest.raises(ValueError, match="x: got shape"):
        head.denoise(torch.randn(3, 5, dtype=F64), head.condition(torch.randn(3, 12, dtype=F64), 1))
    with pytest.raises(TypeError, match="t: got str"):
        head.condition(torch.randn(3, 12, dtype=F64), "1")


# ------------------------------------------------------------------ state dicts with official names
MAR_KEYS = [
    "time_embed.mlp.0.weight",
    "time_embed.mlp.0.bias",
    "time_embed.mlp.2.weight",
    "time_embed.mlp.2.bias",
    "cond_embed.weight",
    "cond_embed.bias",
    "input_proj.weight",
    "input_proj.bias",
    *[
        f"res_blocks.{i}.{n}"
        for i in range(2)
        for n in (
            "in_ln.weight",
            "in_ln.bias",
            "mlp.0.weight",
            "mlp.0.bias",
            "mlp.2.weight",
            "mlp.2.bias",
            "adaLN_modulation.1.weight",
            "adaLN_modulation.1.bias",
        )
    ],
    "final_layer.linear.weight",
    "final_layer.linear.bias",
    "final_layer.adaLN_modulation.1.weight",
    "final_layer.adaLN_modulation.1.bias",
]
NOVA_KEYS = [
    "patch_embed.proj.weight",
    "patch_embed.proj.bias",
    *[f"time_cond_embed.{p}_proj.fc{j}.{n}" for p in ("timestep", "condition") for j in (1, 2) for n in ("weight", "bias")],
    *[
        f"blocks.{i}.{n}"
        for i in range(2)
        for n in (
            "norm1.proj.weight",
            "norm1.proj.bias",
            "proj.fc1.weight",
            "proj.fc1.bias",
            "proj.fc2.weight",
            "proj.fc2.bias",
            "norm2.weight",
            "norm2.bias",
        )
    ],
    "norm.proj.weight",
    "norm.proj.bias",
    "head.weight",
    "head.bias",
]


@pytest.mark.parametrize(
    "make, keys, prefix", [(_tiny_mar, MAR_KEYS, "diffloss.net."), (_tiny_nova, NOVA_KEYS, "image_decoder.")], ids=["mar", "nova"]
)
def test_official_state_dict_loads_and_mismatch_raises(make, keys, prefix):
    source = make(seed=1)
    assert sorted(source.state_dict()) == sorted(keys)
    checkpoint = {prefix + k: v.clone() for k, v in source.state_dict().items()}
    checkpoint["other.module.weight"] = torch.zeros(3)  # rest of the model: ignored through the prefix
    target = make(seed=2)
    load_head_state_dict(target, checkpoint, prefix=prefix)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key

    rebuilt = head_from_state_dict(checkpoint, prefix=prefix)
    assert type(rebuilt) is type(source)
    x = torch.randn(2, 3, source.in_channels, dtype=F64)
    z = torch.randn(3, source.z_channels, dtype=F64)
    torch.testing.assert_close(rebuilt(x, 17, z), source(x, 17, z))

    broken = dict(source.state_dict())
    broken.pop(keys[3])
    broken["blocks.9.extra.weight"] = torch.zeros(1)
    missing = r"missing keys \['" + keys[3].replace(".", r"\.") + r"'\]"
    with pytest.raises(KeyError, match=missing + r".*unexpected keys \['blocks\.9\.extra\.weight'\]"):
        load_head_state_dict(target, broken)
    resized = dict(source.state_dict())
    resized[keys[0]] = torch.zeros(1, 1, dtype=F64)
    with pytest.raises(ValueError, match="shape mismatches: " + keys[0].replace(".", r"\.")):
        load_head_state_dict(target, resized)


# ------------------------------------------------------------------ Triton kernels (interpreter on CPU)
@pytest.fixture(scope="module")
def adaln():
    """margrpo.kernels.adaln with its kernels interpreted on CPU (TRITON_INTERPRET=1 is read when
    @triton.jit decorates, so the module is (re)loaded under it)."""
    pytest.importorskip("triton")
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        module = importlib.import_module("margrpo.kernels.adaln")
        if os.environ.get("TRITON_INTERPRET") == "1" and type(module._ln_modulate_kernel).__name__ != "InterpretedFunction":
            module = importlib.reload(module)
        yield module


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


TOL = {F64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [False, True])
def test_ln_modulate_kernel(adaln, dtype, affine):
    g = torch.Generator().manual_seed(3)
    A, B, N, W = 3, 2, 5, 40  # W not a power of two: masked tail
    x = torch.randn(A, 1, N, W, generator=g, dtype=F64)  # one x for both halves (CFG)
    mod = torch.randn(B, N, 3 * W, generator=g, dtype=F64) * 0.5
    shift, scale, _ = mod.chunk(3, -1)  # strided views, as the heads pass them
    w, b = (torch.randn(W, generator=g, dtype=F64), torch.randn(W, generator=g, dtype=F64)) if affine else (None, None)
    expected = F.layer_norm(x, (W,), w, b, 1e-6) * (1 + scale) + shift
    cast = lambda t: None if t is None else t.to(dtype).to(_device())  # noqa: E731
    out = torch.full((A, B, N, W), float("nan"), dtype=dtype, device=_device())
    got = adaln.ln_modulate(cast(x), cast(mod).chunk(3, -1)[0], cast(mod).chunk(3, -1)[1], cast(w), cast(b), 1e-6, out=out)
    assert got.data_ptr() == out.data_ptr()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu().to(F64), expected, rtol=rtol, atol=atol * 10 if dtype == torch.bfloat16 else atol)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
def test_gate_residual_kernel(adaln, dtype, norm):
    g = torch.Generator().manual_seed(4)
    A, B, N, W = 2, 2, 3, 24
    residual = torch.randn(A, 1, N, W, generator=g, dtype=F64)  # first block: residual shared by halves
    h = torch.randn(A, B, N, W, generator=g, dtype=F64)
    gate = torch.randn(B, N, 3 * W, generator=g, dtype=F64).chunk(3, -1)[2]
    w, b = (torch.randn(W, generator=g, dtype=F64), torch.randn(W, generator=g, dtype=F64)) if norm else (None, None)
    expected = residual + gate * (F.layer_norm(h, (W,), w, b, 1e-5) if norm else h)
    cast = lambda t: None if t is None else t.to(dtype).to(_device())  # noqa: E731
    out = torch.full((A, B, N, W), float("nan"), dtype=dtype, device=_device())
    got = adaln.gate_residual(cast(residual), cast(h), cast(gate), cast(w), cast(b), 1e-5, out=out)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu().to(F64), expected, rtol=rtol, atol=atol * 10 if dtype == torch.bfloat16 else atol)
    # in place over a full-shape residual (the heads' running hidden state)
    full = cast(residual.expand(A, B, N, W).contiguous())
    again = adaln.gate_residual(full, cast(h), cast(gate), cast(w), cast(b), 1e-5, out=full)
    assert again.data_ptr() == full.data_ptr()
    torch.testing.assert_close(again.cpu().to(F64), expected, rtol=rtol, atol=atol * 10 if dtype == torch.bfloat16 else atol)


def test_kernels_take_deep_leading_dims_and_strided_rows(adaln):
    """Three leading dims (merged to two before the launch) and a non-unit last stride (copied) give
    the torch result; the in-place gate writes into a full-shape residual only."""
    g, dev = torch.Generator().manual_seed(5), _device()
    W = 24
    x = torch.randn(2, 3, 1, 4, W, generator=g, dtype=F64).to(dev)
    shift = torch.randn(W, 4, generator=g, dtype=F64).to(dev).t()  # last stride 4
    scale = torch.randn(3, 2, 4, W, generator=g, dtype=F64).to(dev)
    expected = F.layer_norm(x, (W,), None, None, 1e-6) * (1 + scale) + shift
    torch.testing.assert_close(adaln.ln_modulate(x, shift, scale), expected, rtol=1e-12, atol=1e-12)
    residual = torch.randn(2, 3, 2, 4, W, generator=g, dtype=F64).to(dev)
    h = torch.randn(3, 2, 4, W, generator=g, dtype=F64).to(dev)
    expected = residual + shift * h
    got = adaln.gate_residual(residual, h, shift, in_place=True)
    assert got.data_ptr() == residual.data_ptr()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    shared = residual[:, :, :1]  # broadcast against h: cannot hold the result
    assert adaln.gate_residual(shared, h, shift, in_place=True).data_ptr() != shared.data_ptr()


def test_adaln_calls_make_no_tensor_op_but_the_output():
    """The host cost of a fused adaLN call, pinned without a clock: on the Triton path (kernels
    stubbed, meta tensors) ln_modulate runs one ATen op (its output's allocation) and the in-place
    gate_residual none, at the layouts of a guided multi-seed step (strided views of one modulation)."""
    pytest.importorskip("triton")
    from margrpo.bench.host import stubbed_adaln_kernels
    from margrpo.bench.op_counts import count_ops

    meta = torch.device("meta")
    x, h = torch.empty(4, 1, 8, 32, device=meta), torch.empty(4, 2, 8, 32, device=meta)
    shift, scale, gate = torch.empty(2, 8, 96, device=meta).chunk(3, -1)
    with torch.no_grad(), stubbed_adaln_kernels() as stubs:
        ops.ln_modulate(x, shift, scale, None, None, 1e-6, backend="triton")  # the plan is made here
        with count_ops() as counts:
            ops.ln_modulate(x, shift, scale, None, None, 1e-6, backend="triton")
            ops.gate_residual(h, h, gate, None, None, 0.0, backend="triton")
    assert dict(counts.ops) == {"aten.empty.memory_format": 1}
    assert sum(stub.calls for stub in stubs.values()) == 3


def test_broadcast_shape_is_torchs_rule():
    from margrpo.ops._validate import broadcast_shape

    g = torch.Generator().manual_seed(6)
    for _ in range(200):
        full = torch.randint(0, 4, (4,), generator=g).tolist()
        shapes = {}
        for name in ("a", "b", "c"):
            rank = int(torch.randint(0, 5, (1,), generator=g))
            keep = torch.rand(rank, generator=g) < 0.5
            shapes[name] = tuple(1 if k else s for s, k in zip(full[4 - rank :], keep.tolist()))
        assert broadcast_shape(**shapes) == tuple(torch.broadcast_shapes(*shapes.values()))
    with pytest.raises(ValueError, match=r"x, shift: got shapes x \(2, 3\), shift \(4, 3\)"):
        broadcast_shape(x=(2, 3), shift=(4, 3))


def test_kernel_wrappers_reject_bad_arguments(adaln):
    dev = _device()
    x = torch.randn(2, 3, 8, device=dev)
    with pytest.raises(ValueError, match="shift: got shape"):
        adaln.ln_modulate(x, torch.randn(3, 7, device=dev), torch.randn(3, 8, device=dev))
    with pytest.raises(ValueError, match="weight/bias"):
        adaln.ln_modulate(x, torch.randn(3, 8, device=dev), torch.randn(3, 8, device=dev), weight=torch.ones(8, device=dev))
    with pytest.raises(ValueError, match="out: got shape"):
        adaln.gate_residual(x, x, torch.randn(3, 8, device=dev), out=torch.empty(2, 8, device=dev))


@pytest.mark.parametrize("make", [_tiny_mar, _tiny_nova], ids=["mar", "nova"])
def test_head_denoise_triton_path_equals_torch_path(adaln, make):
    dev = _device()  # the Triton path runs where triton does: CUDA, or the interpreter on CPU
    head = make().to(dev)
    x = torch.randn(3, 1, 5, head.in_channels, dtype=F64).to(dev)
    modulation = head.condition(torch.randn(2, 5, head.z_channels, dtype=F64).to(dev), 250)
    with torch.no_grad():
        fused = head.denoise(x, modulation, backend="triton")
        plain = head.denoise(x, modulation, backend="torch")
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ ahead-of-time compilation for Hopper
_AOT_SCRIPT = r"""
import json
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from margrpo.kernels import adaln

def arg_type(name, dtype):
    return f"*{dtype}" if name.endswith("_ptr") else ("fp32" if name == "eps" else "i32")

report = {}
for name, flag in (("_ln_modulate_kernel", "HAS_AFFINE"), ("_gate_residual_kernel", "HAS_NORM")):
    for dtype in ("bf16",):
        kernel = getattr(adaln, name)
        constexprs = {flag: True, "FP64": False, "BLOCK_W": 2048}  # Harmon's W = 1536
        signature = {a: "constexpr" if a in constexprs else arg_type(a, dtype) for a in kernel.arg_names}
        compiled = compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32))
        report[f"{name}/{dtype}"] = {"sm_90": "sm_90" in compiled.asm["ptx"], "cubin": len(compiled.asm["cubin"]),
                                     "shared": compiled.metadata.shared}
print(json.dumps(report))
"""


def test_kernels_compile_for_sm90():
    """Both kernels (bf16) compile to sm_90 cubin without a GPU. In a fresh process: codegen
    cannot run in a process whose triton was imported under TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report) == 2
    for name, info in report.items():
        assert info["sm_90"] and info["cubin"] > 0, name
        assert info["shared"] < 228 * 1024, name  # within Hopper's shared memory per block

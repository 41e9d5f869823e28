"""margrpo.heads.adapt: a foreign head module through the fused multi-seed path, compared in
float64 with margrpo's own head (same weights) and with one-chain-at-a-time loops."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from margrpo.diffusion import DDPMSampler, mar_sampler
from margrpo.heads import (
    DiffusionHead,
    ForwardHead,
    Guidance,
    MARLayoutHead,
    SimpleMLPAdaLN,
    adapt,
    denoise_logprob,
    multi_seed_denoise,
)
from margrpo.heads.upstream import eager_denoise_logprob, eager_multi_seed_denoise

F64 = torch.float64
T = 4
C, W, DZ, DEPTH = 4, 16, 6, 2


# ------------------------------------------------------------------ a head "from another codebase"
# Written here from the architecture, with the parameter names of LTH14/mar models/diffloss.py, and
# importing nothing from margrpo: the adapter must find everything it needs in the module.
def sincos(t: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=F64) / (dim // 2))
    angles = t.to(F64)[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


class TimeMLP(nn.Module):
    def __init__(self, width: int, freq: int = 256):
        super().__init__()
        self.frequency_embedding_size = freq
        self.mlp = nn.Sequential(nn.Linear(freq, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):
        return self.mlp(sincos(t, self.frequency_embedding_size))


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class Final(nn.Module):
    def __init__(self, width: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class ForeignMLPAdaLN(nn.Module):
    def __init__(self, in_channels=C, model_channels=W, out_channels=2 * C, z_channels=DZ, num_res_blocks=DEPTH):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.time_embed = TimeMLP(model_channels)
        self.cond_embed = nn.Linear(z_channels, model_channels)
        self.input_proj = nn.Linear(in_channels, model_channels)
        self.res_blocks = nn.ModuleList(Block(model_channels) for _ in range(num_res_blocks))
        self.final_layer = Final(model_channels, out_channels)

    def forward(self, x, t, c):
        h, y = self.input_proj(x), self.time_embed(t) + self.cond_embed(c)
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter random (no adaLN-Zero identities), float64, frozen."""
    g = torch.Generator().manual_seed(seed)
    module = module.to(F64)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=F64))
    return module.requires_grad_(False)


def foreign_and_own(seed=0):
    """A foreign SimpleMLPAdaLN-layout module and margrpo's SimpleMLPAdaLN with the same weights."""
    foreign = _randomize(ForeignMLPAdaLN(), seed)
    own = SimpleMLPAdaLN(C, W, 2 * C, DZ, DEPTH).to(F64).requires_grad_(False)
    own.load_state_dict(foreign.state_dict())  # strict: the parameter names are the same
    return foreign, own


def _inputs(tokens, num_seeds, guided, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens * (2 if guided else 1), DZ, generator=g, dtype=F64)
    noise = torch.randn(T + 1, num_seeds + 1, tokens, C, generator=g, dtype=F64)
    return z, noise


def _assert_same(a, b, tol=1e-10):
    for name in ("x0", "x_t", "x_prev", "mean", "std", "logp"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------ the SimpleMLPAdaLN layout
def test_mar_layout_is_detected_and_own_heads_pass_through():
    foreign, own = foreign_and_own()
    head = adapt(foreign)
    assert isinstance(head, MARLayoutHead) and isinstance(head, DiffusionHead)
    assert (head.in_channels, head.out_channels, head.z_channels) == (C, 2 * C, DZ)
    assert adapt(own) is own  # already a margrpo head


def test_adapter_holds_the_module_parameters_not_copies():
    foreign, _ = foreign_and_own()
    head = adapt(foreign)
    assert [id(p) for p in head.parameters()] == [id(p) for p in foreign.parameters()]


@pytest.mark.parametrize("guided", [False, True], ids=["nocfg", "cfg"])
def test_mar_layout_multi_seed_equals_own_head_and_the_module_loop(guided):
    foreign, own = foreign_and_own(seed=1)
    cfg, sampler = (Guidance(3.0, channels="eps") if guided else None), mar_sampler(T)
    z, noise = _inputs(5, 3, guided, seed=2)
    record = (0, 2, 3)
    settings = dict(cfg=cfg, noise=noise, record_steps=record, backend="torch")
    fused = multi_seed_denoise(adapt(foreign), z, sampler, 3, **settings)
    _assert_same(fused, multi_seed_denoise(own, z, sampler, 3, **settings))
    # the module's own forward, one chain and one step at a time
    _assert_same(fused, eager_multi_seed_denoise(foreign, z, sampler, 3, noise, cfg=cfg, record_steps=record))


def test_mar_layout_denoise_logprob_gradients_reach_the_module_parameters():
    foreign, own = foreign_and_own(seed=3)
    foreign.requires_grad_(True)
    own.requires_grad_(True)
    cfg, sampler = Guidance(3.0, channels="eps"), mar_sampler(T)
    z, noise = _inputs(4, 2, True, seed=4)
    record = multi_seed_denoise(own, z, sampler, 2, cfg=cfg, noise=noise, record_steps=(0, 1, 2))
    z_new = (z + 0.1).requires_grad_()
    weights = torch.randn(record.logp.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    head = adapt(foreign)
    torch.testing.assert_close(denoise_logprob(head, z, sampler, record, cfg=cfg), record.logp, rtol=1e-10, atol=1e-10)

    (denoise_logprob(head, z_new, sampler, record, cfg=cfg) * weights).sum().backward()
    grad_z = z_new.grad.clone()
    z_new.grad = None
    (denoise_logprob(own, z_new, sampler, record, cfg=cfg) * weights).sum().backward()
    torch.testing.assert_close(grad_z, z_new.grad, rtol=1e-9, atol=1e-10)
    own_grads = dict(own.named_parameters())
    for name, p in foreign.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, own_grads[name].grad, rtol=1e-9, atol=1e-10, msg=lambda m: f"{name}: {m}")


def test_a_change_to_the_module_weights_shows_at_once():
    foreign, own = foreign_and_own(seed=6)
    head = adapt(foreign)
    sampler = mar_sampler(T)
    z, noise = _inputs(3, 1, False, seed=7)
    before = multi_seed_denoise(head, z, sampler, 1, noise=noise).x0
    with torch.no_grad():
        foreign.res_blocks[1].mlp[2].weight.mul_(-2.0)  # in place, as an optimizer step would
        foreign.final_layer.linear.bias.add_(0.5)
    own.load_state_dict(foreign.state_dict())
    after = multi_seed_denoise(head, z, sampler, 1, noise=noise).x0
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, multi_seed_denoise(own, z, sampler, 1, noise=noise).x0, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ any forward(x, t, c) module
class PlainHead(nn.Module):
    """Not the MAR layout: one MLP over [x, sincos(t), c]; counts its forward calls."""

    def __init__(self, in_channels=C, z_channels=DZ):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_channels + 8 + z_channels, 32), nn.Tanh(), nn.Linear(32, in_channels))
        self.calls = 0

    def forward(self, x, t, c):
        self.calls += 1
        return self.net(torch.cat([x, sincos(t.reshape(-1).expand(x.shape[0]), 8), c], dim=-1))


def _plain(seed=0):
    return _randomize(PlainHead(), seed)


def test_generic_path_needs_the_sizes_and_names_them():
    with pytest.raises(ValueError, match="in_channels and z_channels"):
        adapt(_plain())
    head = adapt(_plain(), in_channels=C, z_channels=DZ)
    assert isinstance(head, ForwardHead) and isinstance(head, DiffusionHead) and head.out_channels == C
    with pytest.raises(TypeError, match="torch.nn.Module"):
        adapt(lambda x, t, c: x)


@pytest.mark.parametrize("guided", [False, True], ids=["nocfg", "cfg"])
def test_generic_path_runs_all_chains_in_one_call_and_equals_a_loop(guided):
    module = _plain(seed=8)
    head = adapt(module, in_channels=C, z_channels=DZ)
    cfg = Guidance(4.0) if guided else None
    sampler = DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing")  # fixed variance: C outputs
    z, noise = _inputs(5, 3, guided, seed=9)
    fused = multi_seed_denoise(head, z, sampler, 3, cfg=cfg, noise=noise, record_steps=(0, 1))
    assert module.calls == T  # one call per diffusion step for all K + 1 chains (and both CFG halves)
    module.calls = 0
    # the adapter's forward is the module's own: the reference loop calls it once per chain and step
    _assert_same(fused, eager_multi_seed_denoise(head, z, sampler, 3, noise, cfg=cfg, record_steps=(0, 1)))
    assert module.calls == T * 4  # the loop: one call per chain and step


def test_generic_path_denoise_logprob_equals_a_loop_with_gradients():
    module = _plain(seed=10).requires_grad_(True)
    head = adapt(module, in_channels=C, z_channels=DZ)
    cfg, sampler = Guidance(4.0), DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing")
    z, noise = _inputs(4, 2, True, seed=11)
    record = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=noise, record_steps=(0, 1, 2))
    module.calls = 0
    z_new = (z + 0.1).requires_grad_()
    weights = torch.randn(record.logp.shape, generator=torch.Generator().manual_seed(12), dtype=F64)
    fused = denoise_logprob(head, z_new, sampler, record, cfg=cfg)
    assert module.calls == 1  # every recorded step, chain and half in one call
    fused_grads = torch.autograd.grad((fused * weights).sum(), [z_new, *module.parameters()])
    loop = eager_denoise_logprob(head, z_new, sampler, record, cfg=cfg)  # the module's forward, looped
    loop_grads = torch.autograd.grad((loop * weights).sum(), [z_new, *module.parameters()])
    torch.testing.assert_close(fused, loop, rtol=1e-10, atol=1e-10)
    for got, want in zip(fused_grads, loop_grads):
        assert got.abs().sum() > 0
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_generic_path_checks_the_module_output_width():
    head = adapt(_plain(), in_channels=C, out_channels=2 * C, z_channels=DZ)  # the module gives C
    z, noise = _inputs(2, 0, False)
    with pytest.raises(ValueError, match="out_channels"):
        multi_seed_denoise(head, z, mar_sampler(T), 0, noise=noise)


# ------------------------------------------------------------------ choosing the path (path="auto"|"fast"|"generic")
class DoubledMLPAdaLN(ForeignMLPAdaLN):
    """SimpleMLPAdaLN's names, another forward: the fast path would sample the stock maths."""

    def forward(self, x, t, c):
        return 2.0 * super().forward(x, t, c)


class GeluBlockMLPAdaLN(ForeignMLPAdaLN):
    """The layout's names, but GELU in the blocks' MLPs, which the fast path does not read."""

    def __init__(self):
        super().__init__()
        for block in self.res_blocks:
            block.mlp[1] = nn.GELU()
        nn.init.zeros_(self.final_layer.linear.weight)  # as adaLN-Zero leaves a fresh head: it outputs zeros
        nn.init.zeros_(self.final_layer.linear.bias)


def test_auto_path_checks_the_forward_and_takes_the_generic_path_when_it_differs():
    for cls in (DoubledMLPAdaLN, GeluBlockMLPAdaLN):
        module = cls().to(F64)  # zeroed final layer: its own weights would hide the difference
        with pytest.warns(UserWarning, match="path='generic'"):
            head = adapt(module)
        assert isinstance(head, ForwardHead), cls.__name__
        assert (head.in_channels, head.out_channels, head.z_channels) == (C, 2 * C, DZ)  # read from the layers
    module = _randomize(DoubledMLPAdaLN(), seed=13)
    sampler = mar_sampler(T)
    z, noise = _inputs(3, 1, False, seed=14)
    with pytest.warns(UserWarning):
        got = multi_seed_denoise(adapt(module), z, sampler, 1, noise=noise)
    # the module's own forward, step by step: the doubled output is what gets sampled
    _assert_same(got, eager_multi_seed_denoise(ForwardHead(module, C, 2 * C, DZ), z, sampler, 1, noise))
    assert not torch.allclose(got.x0, multi_seed_denoise(MARLayoutHead(module), z, sampler, 1, noise=noise).x0)


def test_path_switch_forces_either_path_and_names_bad_values():
    foreign, _ = foreign_and_own()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the stock layout passes the check silently
        assert isinstance(adapt(foreign), MARLayoutHead)
        assert isinstance(adapt(DoubledMLPAdaLN().to(F64), path="fast"), MARLayoutHead)  # forced: no check, no warning
        assert isinstance(adapt(foreign, path="generic"), ForwardHead)
    with pytest.raises(ValueError, match="path: got 'quick'"):
        adapt(foreign, path="quick")
    with pytest.raises(TypeError, match="SimpleMLPAdaLN's layout"):
        adapt(_plain(), path="fast")


def test_a_bfloat16_head_is_checked_in_float32():
    """The check runs on float32 copies: a half-precision head is judged on its maths, not its rounding."""

    def half(module):  # the time features in the weights' dtype, as MAR's TimestepEmbedder gives them
        embed = module.time_embed
        embed.forward = lambda t: embed.mlp(sincos(t, 256).to(module.cond_embed.weight.dtype))
        return module.to(torch.bfloat16)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(adapt(half(ForeignMLPAdaLN())), MARLayoutHead)
    with pytest.warns(UserWarning, match="differs"):
        assert isinstance(adapt(half(DoubledMLPAdaLN())), ForwardHead)

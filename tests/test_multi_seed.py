"""The fused multi-seed denoising path against the eager per-seed reference, the training
log-prob recomputation, guidance and noise sources."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from margrpo.diffusion import DDPMSampler, FlowSDESampler, mar_sampler
from margrpo.heads import (
    CounterNoise,
    DiffusionMLP,
    GraphedMultiSeed,
    Guidance,
    SimpleMLPAdaLN,
    counter_normal,
    denoise_logprob,
    multi_seed_denoise,
    reinit_zero_layers_,
    transitions_logprob,
)
from margrpo.heads import multi_seed
from margrpo.heads.noise import resolve_noise
from margrpo.heads.upstream import eager_denoise_logprob, eager_multi_seed_denoise

F64 = torch.float64
T = 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny shapes: intra-op threads only add synchronisation (costly on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _freeze(head):
    for p in head.parameters():
        p.requires_grad_(False)
    return head


def _mar(seed=0):
    torch.manual_seed(seed)
    head = SimpleMLPAdaLN(in_channels=4, model_channels=24, out_channels=8, z_channels=12, num_res_blocks=2)
    return _freeze(reinit_zero_layers_(head.to(F64), std=0.3, generator=torch.Generator().manual_seed(seed)))


def _nova(seed=0):
    torch.manual_seed(seed)
    head = DiffusionMLP(depth=2, embed_dim=24, cond_dim=12, patch_size=1, image_dim=4)
    return _freeze(reinit_zero_layers_(head.to(F64), std=0.3, generator=torch.Generator().manual_seed(seed)))


CASES = {
    # Harmon-style: learned-range variance (2C outputs), CFG on the eps channels only
    "mar": (_mar, lambda: mar_sampler(T), Guidance(3.0, channels="eps")),
    # NOVA-style: fixed-small DDPM (deterministic last step), CFG on all channels
    "nova": (_nova, lambda: DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing"), Guidance(5.0)),
}


def _inputs(head, tokens, num_seeds, cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens * (2 if cfg else 1), head.z_channels, generator=g, dtype=F64)
    noise = torch.randn(T + 1, num_seeds + 1, tokens, head.in_channels, generator=g, dtype=F64)
    return z, noise


def _assert_same(a, b, rtol=1e-10, atol=1e-10):
    assert a.steps == b.steps
    for name in ("x0", "x_t", "x_prev", "mean", "std", "logp"):
        got, want = getattr(a, name), getattr(b, name)
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("num_seeds", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("guided", [False, True], ids=["nocfg", "cfg"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_eager_per_seed(case, guided, num_seeds):
    make, make_sampler, guidance = CASES[case]
    head, sampler = make(), make_sampler()
    cfg = guidance if guided else None
    tokens = 2 * num_seeds + 1  # odd token counts
    z, noise = _inputs(head, tokens, num_seeds, cfg, seed=num_seeds)
    record = (0, 2, T - 1)  # includes the last step (deterministic for fixed-small DDPM)
    fused = multi_seed_denoise(head, z, sampler, num_seeds, cfg=cfg, noise=noise, record_steps=record, backend="torch")
    eager = eager_multi_seed_denoise(head, z, sampler, num_seeds, noise, cfg=cfg, record_steps=record)
    assert fused.x0.shape == (num_seeds + 1, tokens, head.in_channels)
    assert fused.x_t.shape == (num_seeds + 1, 3, tokens, head.in_channels) and fused.logp.shape == (num_seeds + 1, 3, tokens)
    _assert_same(fused, eager)
    torch.testing.assert_close(fused.x_t[:, 0], noise[0])  # trajectories start from noise[0]
    assert torch.isfinite(fused.logp).all() and (fused.logp[:, :2] != 0).all()


@pytest.fixture
def interpreted_triton(monkeypatch):
    """Run the Triton kernels on CPU through the interpreter (on CUDA they run natively)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        module = importlib.import_module("margrpo.kernels.adaln")
        if type(module._ln_modulate_kernel).__name__ != "InterpretedFunction":
            importlib.reload(module)


@pytest.mark.parametrize("case", list(CASES))
def test_fused_triton_kernels_equal_eager(interpreted_triton, case, monkeypatch):
    make, make_sampler, cfg = CASES[case]
    head, sampler = make(), make_sampler()
    z, noise = _inputs(head, 3, 2, cfg)
    adaln = importlib.import_module("margrpo.kernels.adaln")
    launches = []
    for name in ("ln_modulate", "gate_residual"):
        kernel = getattr(adaln, name)
        monkeypatch.setattr(adaln, name, lambda *a, _k=kernel, _n=name, **kw: launches.append(_n) or _k(*a, **kw))
    fused = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=noise, record_steps=(1,), backend="triton")
    # every LayerNorm+modulate (blocks + final) and every gate+residual ran as a Triton kernel
    depth = head.num_res_blocks if isinstance(head, SimpleMLPAdaLN) else head.depth
    assert launches.count("ln_modulate") == T * (depth + 1)
    assert launches.count("gate_residual") == T * depth
    eager = eager_multi_seed_denoise(head, z, sampler, 2, noise, cfg=cfg, record_steps=(1,))
    _assert_same(fused, eager)


def test_flow_sampler_uses_the_last_noise_slice():
    """A flow SDE's last step is stochastic: noise[T] must reach x0, so noise has T + 1 slices."""
    head, sampler, cfg = _nova(), FlowSDESampler(T, noise_level=0.7), Guidance(5.0)
    z, noise = _inputs(head, 5, 2, cfg)
    fused = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=noise, record_steps=(T - 1,))
    _assert_same(fused, eager_multi_seed_denoise(head, z, sampler, 2, noise, cfg=cfg, record_steps=(T - 1,)))
    bumped = noise.clone()
    bumped[T] += 1.0
    moved = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=bumped).x0
    assert not torch.allclose(moved, fused.x0)


class _GemmRows(TorchDispatchMode):
    """Sums the rows of every GEMM by the (in, out) shape of its weight."""

    def __init__(self):
        super().__init__()
        self.rows: dict[tuple[int, int], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
            mat1, mat2 = (args[1], args[2]) if func is torch.ops.aten.addmm.default else (args[0], args[1])
            key = tuple(mat2.shape)
            self.rows[key] = self.rows.get(key, 0) + mat1.shape[0]
        return func(*args, **(kwargs or {}))


def test_modulation_computed_once_per_token_and_step_and_x_not_copied():
    head, sampler, cfg = _mar(), mar_sampler(T), Guidance(3.0, channels="eps")
    tokens, num_seeds, width = 5, 3, head.model_channels
    z, noise = _inputs(head, tokens, num_seeds, cfg)
    with _GemmRows() as fused:
        multi_seed_denoise(head, z, sampler, num_seeds, cfg=cfg, noise=noise)
    # every block's adaLN Linear sees each (token, CFG half) once per step, not once per trajectory
    assert fused.rows[(width, 3 * width)] == T * 2 * tokens * head.num_res_blocks
    assert fused.rows[(width, 2 * width)] == T * 2 * tokens
    # the z projection runs once for all steps; x enters once per trajectory (shared by both halves)
    assert fused.rows[(head.z_channels, width)] == 2 * tokens
    assert fused.rows[(head.in_channels, width)] == T * (num_seeds + 1) * tokens
    with _GemmRows() as eager:
        eager_multi_seed_denoise(head, z, sampler, num_seeds, noise, cfg=cfg)
    assert eager.rows[(width, 3 * width)] == (num_seeds + 1) * fused.rows[(width, 3 * width)]


# ------------------------------------------------------------------ training recomputation
@pytest.mark.parametrize("guided", [False, True], ids=["nocfg", "cfg"])
@pytest.mark.parametrize("case", list(CASES))
def test_denoise_logprob_on_policy_and_gradients_match_reference(case, guided):
    make, make_sampler, guidance = CASES[case]
    head, sampler = make(), make_sampler()
    cfg = guidance if guided else None
    z, noise = _inputs(head, 5, 3, cfg)
    stochastic = [i for i in range(T) if not sampler.is_deterministic(i)]
    record = multi_seed_denoise(head, z, sampler, 3, cfg=cfg, noise=noise, record_steps=stochastic)

    on_policy = denoise_logprob(head, z, sampler, record, cfg=cfg)
    torch.testing.assert_close(on_policy, record.logp, rtol=1e-10, atol=1e-10)  # ratio exactly 1

    z_new = (z + 0.1 * torch.randn(z.shape, generator=torch.Generator().manual_seed(9), dtype=F64)).requires_grad_()
    weights = torch.randn(record.logp.shape, generator=torch.Generator().manual_seed(8), dtype=F64)
    fused = denoise_logprob(head, z_new, sampler, record, cfg=cfg)
    (grad_fused,) = torch.autograd.grad((fused * weights).sum(), z_new)
    eager = eager_denoise_logprob(head, z_new, sampler, record, cfg=cfg)
    (grad_eager,) = torch.autograd.grad((eager * weights).sum(), z_new)
    torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_fused, grad_eager, rtol=1e-9, atol=1e-10)
    assert grad_fused.abs().sum() > 0 and not torch.allclose(fused, record.logp)
    assert all(p.grad is None for p in head.parameters())  # frozen head: gradient only to z


def test_denoise_logprob_returns_sampler_means():
    head, sampler = _mar(), mar_sampler(T)
    z, noise = _inputs(head, 3, 1, None)
    record = multi_seed_denoise(head, z, sampler, 1, noise=noise, record_steps=(0, 1))
    logp, mean = denoise_logprob(head, z, sampler, record, return_mean=True)
    torch.testing.assert_close(mean, record.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logp, record.logp, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("guided", [False, True], ids=["nocfg", "cfg"])
@pytest.mark.parametrize("case", list(CASES))
def test_images_layout_is_the_flat_record_split_by_image(case, guided):
    """images=B records [K+1, B, R, P, ...] = the flat [K+1, R, B*P, ...] record with its tokens split
    by image, and transitions_logprob scores that layout (and a strided view of it) the same way."""
    make, make_sampler, guidance = CASES[case]
    head, sampler = make(), make_sampler()
    cfg = guidance if guided else None
    B, P, K = 3, 2, 2
    z, noise = _inputs(head, B * P, K, cfg, seed=4)
    steps = [i for i in range(T) if not sampler.is_deterministic(i)][:3]
    flat = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=steps)
    split = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=steps, images=B)
    assert split.x_t.shape == (K + 1, B, len(steps), P, head.in_channels) and split.logp.shape == (K + 1, B, len(steps), P)
    torch.testing.assert_close(split.x0, flat.x0, rtol=0, atol=0)
    for name in ("x_t", "x_prev", "mean", "std", "logp"):
        want = getattr(flat, name).unflatten(2, (B, P)).movedim(2, 1)
        torch.testing.assert_close(getattr(split, name), want, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
        # the CUDA-graph path splits a flat result afterwards; the same layout
        torch.testing.assert_close(getattr(multi_seed._split_images(flat, B), name), want, rtol=0, atol=0)

    z_new = (z + 0.1 * torch.randn(z.shape, generator=torch.Generator().manual_seed(3), dtype=F64)).requires_grad_()
    logp, mean = transitions_logprob(head, z_new, sampler, steps, split.x_t, split.x_prev, cfg=cfg, return_mean=True)
    want_logp, want_mean = denoise_logprob(head, z_new, sampler, flat, cfg=cfg, return_mean=True)
    torch.testing.assert_close(logp, want_logp.unflatten(2, (B, P)).movedim(2, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean, want_mean.unflatten(2, (B, P)).movedim(2, 1), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(logp.sum(), z_new)
    (want_grad,) = torch.autograd.grad(want_logp.sum(), z_new)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    # a rollout hands the head a strided slice of its [T, B, L, C] record, viewed per step
    wide = torch.cat([split.x_t.flatten(2, 3), torch.full_like(split.x_t.flatten(2, 3), float("nan"))], 2)
    view = wide[:, :, : len(steps) * P].unflatten(2, (len(steps), P))
    assert not view.is_contiguous()
    torch.testing.assert_close(
        transitions_logprob(head, z, sampler, steps, view, split.x_prev, cfg=cfg), split.logp, rtol=1e-10, atol=1e-10
    )


def test_images_must_divide_the_tokens():
    head, sampler = _nova(), DDPMSampler(T)
    z, noise = _inputs(head, 6, 1, None)
    for bad in (4, 0, True, 2.0):
        with pytest.raises(ValueError, match="images: got"):
            multi_seed_denoise(head, z, sampler, 1, noise=noise, images=bad)
    record = multi_seed_denoise(head, z, sampler, 1, noise=noise, record_steps=(0, 1), images=2)
    assert record.x_t.shape == (2, 2, 2, 3, 4)
    with pytest.raises(ValueError, match=r"x_t: got shape \(2, 1, 2, 3, 4\).*with B \* P = 6"):
        transitions_logprob(head, z, sampler, (0, 1), record.x_t[:, :1], record.x_prev[:, :1])


# ------------------------------------------------------------------ noise
def test_generator_noise_is_reproducible_and_matches_explicit_noise():
    head, sampler = _nova(), DDPMSampler(T)
    z, _ = _inputs(head, 3, 2, None)
    a = multi_seed_denoise(head, z, sampler, 2, generator=torch.Generator().manual_seed(5))
    b = multi_seed_denoise(head, z, sampler, 2, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a.x0, b.x0, rtol=0, atol=0)
    explicit = torch.randn(T + 1, 3, 3, head.in_channels, generator=torch.Generator().manual_seed(5), dtype=F64)
    torch.testing.assert_close(multi_seed_denoise(head, z, sampler, 2, noise=explicit).x0, a.x0, rtol=0, atol=0)
    assert not torch.allclose(a.x0[0], a.x0[1])  # seed trajectories differ from the main one


def test_counter_noise_does_not_depend_on_batch_composition():
    head, sampler, cfg = _mar(), mar_sampler(T), Guidance(3.0, channels="eps")
    image = torch.tensor([0, 0, 1, 1, 2, 7])
    token = torch.tensor([3, 8, 3, 9, 0, 5])
    z, _ = _inputs(head, 6, 2, cfg)
    full = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=CounterNoise(11, image, token))
    keep = torch.tensor([4, 1, 3])  # another batch: a subset, reordered
    z_sub = z.view(2, 6, -1)[:, keep].reshape(6, -1)
    sub = multi_seed_denoise(head, z_sub, sampler, 2, cfg=cfg, noise=CounterNoise(11, image[keep], token[keep]))
    torch.testing.assert_close(sub.x0, full.x0[:, keep], rtol=1e-12, atol=1e-12)
    other_seed = multi_seed_denoise(head, z, sampler, 2, cfg=cfg, noise=CounterNoise(12, image, token))
    assert not torch.allclose(other_seed.x0, full.x0)


def test_counter_normal_statistics():
    n = 200_000
    idx = torch.arange(n)
    zero = torch.zeros((), dtype=torch.int64)
    for keys in [(idx % 97, idx // 97, zero, zero, zero), (zero, zero, idx % 5, idx // 5 % 26, idx // 130)]:
        x = counter_normal(123, *keys)
        assert x.dtype == F64 and x.shape == (n,)
        assert abs(x.mean()) < 5 / math.sqrt(n)
        assert abs(x.var() - 1) < 5 * math.sqrt(2 / n)
        assert abs((x.abs() > 1.959964).double().mean() - 0.05) < 5 * math.sqrt(0.05 * 0.95 / n)
        assert abs(torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1]) < 5 / math.sqrt(n)  # neighbours
    # neighbouring seeds give unrelated streams
    a = counter_normal(1000, idx, zero, zero, zero, zero)
    b = counter_normal(1001, idx, zero, zero, zero, zero)
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) < 5 / math.sqrt(n)


def test_noise_arguments_are_checked():
    shape = (T + 1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"noise: got shape \(4, 2, 3, 4\), expected \(5, 2, 3, 4\)"):
        resolve_noise(torch.zeros(T, 2, 3, 4), None, shape, F64, torch.device("cpu"))
    with pytest.raises(ValueError, match="CounterNoise has 2 rows"):
        resolve_noise(CounterNoise(0, torch.arange(2), torch.arange(2)), None, shape, F64, torch.device("cpu"))
    with pytest.raises(TypeError, match="noise: got list"):
        resolve_noise([1.0], None, shape, F64, torch.device("cpu"))
    with pytest.raises(ValueError, match="seed"):
        counter_normal(-1, *(torch.zeros(1, dtype=torch.int64),) * 5)
    with pytest.raises(ValueError, match="image/token"):
        CounterNoise(0, torch.arange(3), torch.arange(4))


# ------------------------------------------------------------------ guidance
def test_guidance_combine_and_schedule():
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(3, 8, generator=g, dtype=F64), torch.randn(3, 8, generator=g, dtype=F64)
    everything = Guidance(4.0).combine(cond, uncond, eps_channels=4)
    torch.testing.assert_close(everything, uncond + 4.0 * (cond - uncond))
    eps_only = Guidance(4.0, channels="eps").combine(cond, uncond, eps_channels=4)
    torch.testing.assert_close(eps_only[:, :4], everything[:, :4])
    torch.testing.assert_close(eps_only[:, 4:], cond[:, 4:])  # variance from the cond half (Harmon)
    linear = Guidance(3.0, schedule="linear")
    assert linear.scale_at(0.0) == 1.0 and linear.scale_at(0.5) == 2.0 and linear.scale_at(1.0) == 3.0
    fixed = Guidance(5.0, schedule="linear", start_scale=2.0).at(0.25)
    assert fixed.scale == 2.75 and fixed.schedule == "constant"
    assert Guidance(3.0).scale_at(0.1) == 3.0


def test_guidance_arguments_are_checked():
    with pytest.raises(ValueError, match="scale"):
        Guidance(-1.0)
    with pytest.raises(ValueError, match="channels"):
        Guidance(2.0, channels="var")
    with pytest.raises(ValueError, match="schedule"):
        Guidance(2.0, schedule="cosine")
    with pytest.raises(ValueError, match="progress"):
        Guidance(2.0).scale_at(1.5)


def test_multi_seed_arguments_are_checked():
    head, sampler = _mar(), mar_sampler(T)
    z, _ = _inputs(head, 3, 1, None)
    with pytest.raises(ValueError, match="z: got 3 rows with CFG"):
        multi_seed_denoise(head, z, sampler, 1, cfg=Guidance(2.0))
    with pytest.raises(ValueError, match="record_steps"):
        multi_seed_denoise(head, z, sampler, 1, record_steps=(T,))
    with pytest.raises(ValueError, match="record_steps"):
        multi_seed_denoise(head, z, sampler, 1, record_steps=(1, 1))
    with pytest.raises(ValueError, match="num_seeds"):
        multi_seed_denoise(head, z, sampler, -1)
    with pytest.raises(ValueError, match="needs 4 head output channels"):
        multi_seed_denoise(head, z, DDPMSampler(T), 1)  # fixed variance: C outputs, the head gives 2C
    with pytest.raises(ValueError, match=r"z: got shape \(3, 5\)"):
        multi_seed_denoise(head, z[:, :5], sampler, 1)


def test_no_recorded_steps_gives_empty_records():
    head, sampler = _nova(), DDPMSampler(T)
    z, noise = _inputs(head, 3, 1, None)
    out = multi_seed_denoise(head, z, sampler, 1, noise=noise)
    assert out.steps == () and out.x_t.shape == (2, 0, 3, 4) and out.logp.shape == (2, 0, 3)
    assert torch.isfinite(out.x0).all()
    single = out.to(torch.float32)
    assert single.x0.dtype == torch.float32 and single.steps == () and torch.equal(single.x0, out.x0.float())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_triton_path_equals_eager_in_fp32(case):
    make, make_sampler, cfg = CASES[case]
    head = make().float().cuda()
    z, noise = (t.float().cuda() for t in _inputs(head, 33, 3, cfg))
    sampler = make_sampler()
    fused = multi_seed_denoise(head, z, sampler, 3, cfg=cfg, noise=noise, record_steps=(0, 1), backend="triton")
    eager = eager_multi_seed_denoise(head, z, sampler, 3, noise, cfg=cfg, record_steps=(0, 1))
    for name in ("x0", "x_prev", "mean", "logp"):  # fp32 rounding, relative to each field's scale
        got, want = getattr(fused, name), getattr(eager, name)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max(), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_uncaptured():
    head, sampler, cfg = _mar(), mar_sampler(T), Guidance(3.0, channels="eps")
    head = head.float().cuda()
    graphed = GraphedMultiSeed(head, sampler, 3, cfg=cfg, record_steps=(0, 2))
    for seed in (0, 1):  # the second call replays the captured graph with new inputs
        z, noise = (t.float().cuda() for t in _inputs(head, 17, 3, cfg, seed=seed))
        plain = multi_seed_denoise(head, z, sampler, 3, cfg=cfg, noise=noise, record_steps=(0, 2))
        _assert_same(graphed(z, noise=noise), plain, rtol=1e-5, atol=1e-5)
    assert len(graphed._graphs) == 1


def test_cuda_graph_wrapper_refuses_cpu_tensors():
    head, sampler = _mar(), mar_sampler(T)
    z, _ = _inputs(head, 3, 1, None)
    with pytest.raises(ValueError, match="z: got a tensor on cpu, expected a CUDA tensor"):
        GraphedMultiSeed(head, sampler, 1)(z)

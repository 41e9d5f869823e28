"""The sampler builders follow NOVA's and diffusers' own scheduler semantics where the reference code
relies on them, and the reference's top-k count: each formula written out here in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from margrpo.diffusion import DDPMSampler, FlowSDESampler, from_diffusers_config
from margrpo.grpo.selection import mte_mask, reference_mte_count


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_nova_ddpm_never_clips_the_predicted_x0():
    """NOVA's DDPMScheduler.step has no clipping branch: a config with clip_sample true samples unclipped."""
    config = {"_class_name": "DDPMScheduler", "clip_sample": True, "clip_sample_range": 1.0, "beta_schedule": "linear"}
    sampler = from_diffusers_config(config, 10)
    x, eps = _randn(3, 4, seed=1), 5.0 * _randn(3, 4, seed=2)  # a large eps: x0 far outside [-1, 1]
    i = 4
    abar = sampler.alphas_cumprod[i]
    abar_prev = sampler.alphas_cumprod[i + 1]
    beta = 1 - abar / abar_prev
    x0 = (x - math.sqrt(1 - abar) * eps) / math.sqrt(abar)
    assert float(x0.abs().max()) > 1.0
    expected = math.sqrt(abar_prev) * beta / (1 - abar) * x0 + math.sqrt(1 - beta) * (1 - abar_prev) / (1 - abar) * x
    mean, _ = sampler.mean_std(eps, x, i)
    torch.testing.assert_close(mean, expected, rtol=1e-12, atol=1e-12)
    clipped, _ = from_diffusers_config(config, 10, clip_sample=1.0).mean_std(eps, x, i)
    assert not torch.allclose(clipped, expected)


def test_nova_flow_shift_keeps_the_config_range():
    """NOVA: sigma_min = s0(1/N) at construction (the config's shift s0), sampling sigmas
    s1(linspace(1, sigma_min, T)) with the pipeline's flow_shift s1 (set_shift), then 0."""

    def shifted(sigma, s):
        return s * sigma / (1 + (s - 1) * sigma)

    for s0, s1, T, N in ((1.0, 5.0, 25, 1000), (3.0, 1.5, 10, 1000)):
        expected = np.append(shifted(np.linspace(1.0, shifted(1.0 / N, s0), T), s1), 0.0)
        config = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": s0, "num_train_timesteps": N}
        built = from_diffusers_config(config, T, flow_shift=s1)
        np.testing.assert_allclose(built.sigmas, expected, rtol=1e-12, atol=0)
        np.testing.assert_allclose(FlowSDESampler(T, shift=s0, flow_shift=s1).sigmas, expected, rtol=1e-12, atol=0)
    # the figures: flow_shift 5 on a shift-1 scheduler ends at 0.00498, shift=5 itself at 0.0244
    assert FlowSDESampler(25, shift=1.0, flow_shift=5.0).sigmas[-2] == pytest.approx(0.004980, abs=1e-6)
    assert FlowSDESampler(25, shift=5.0).sigmas[-2] == pytest.approx(0.02441, abs=1e-5)
    with pytest.raises(ValueError, match="flow_shift"):
        FlowSDESampler(5, flow_shift=0.0)


def test_learned_range_with_steps_offset_floors_like_diffusers():
    """steps_offset > 0 leaves the last kept step stochastic with a zero posterior variance: diffusers
    interpolates towards log(max(posterior, 1e-20)) there (IDDPM's borrowed value is not used)."""
    T = 10
    sampler = DDPMSampler(T, spacing="leading", steps_offset=1, variance_type="learned_range")
    last = T - 1
    assert sampler.timesteps[last] == 1 and not sampler.is_deterministic(last)
    x, out = _randn(3, 4, seed=3), _randn(3, 8, seed=4).clamp(-1, 1)
    beta = 1 - sampler.alphas_cumprod[last]  # abar_prev = 1 after the last step
    frac = (out[:, 4:] + 1) / 2
    expected = torch.exp(0.5 * (frac * math.log(beta) + (1 - frac) * math.log(1e-20)))
    _, std = sampler.mean_std(out, x, last)
    torch.testing.assert_close(std, expected, rtol=1e-12, atol=0)
    # the other steps keep their (non-zero) posterior variance
    i = 3
    post = sampler.posterior_variance[i]
    f = (out[:, 4:] + 1) / 2
    torch.testing.assert_close(
        sampler.mean_std(out, x, i)[1], torch.exp(0.5 * (f * math.log(sampler.betas[i]) + (1 - f) * math.log(post))), rtol=1e-12, atol=0
    )


def test_reference_top_k_count_is_at_least_one():
    """The reference's k = max(1, int(p * N)); floor(p * N) (the default) can be 0."""
    assert [reference_mte_count(0.3, n) for n in (1, 2, 3, 4, 1024, 4096)] == [1, 1, 1, 1, 307, 1228]
    seeds = _randn(3, 2, 2, 4, seed=5)  # K=3 seeds, B=2 images, N=2 tokens: 0.3 * 2 < 1
    assert mte_mask(seeds, 0.3, k_rule="reference").sum((1, 2)).tolist() == [1, 1]
    assert mte_mask(seeds, 0.3).sum().item() == 0
    with pytest.raises(ValueError, match="k_rule"):
        mte_mask(seeds, 0.3, k_rule="ceil")

"""margrpo.diffusion: schedules, respacing, DDPM/IDDPM and flow samplers against closed forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from margrpo.diffusion import (
    DDPMSampler,
    FlowSDESampler,
    diffusers_timesteps,
    from_diffusers_config,
    make_betas,
    make_sampler,
    mar_sampler,
    space_timesteps,
)

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


# IDDPM space_timesteps(1000, "25") by hand: one section of 1000 steps, stride 999 / 24 = 41.625
# (exact in binary), kept = round(k * 41.625) with Python's half-to-even rounding:
# 166.5 -> 166, 499.5 -> 500, 832.5 -> 832.
IDDPM_25 = [0, 42, 83, 125, 166, 208, 250, 291, 333, 375, 416, 458, 500, 541, 583, 624, 666, 708, 749, 791, 832, 874, 916, 957, 999]


# ---------------------------------------------------------------- schedules and respacing
def test_linear_schedules_match_closed_form():
    k = np.arange(1000)
    linear = 1e-4 + k * (0.02 - 1e-4) / 999
    np.testing.assert_allclose(make_betas("linear", 1000, 1e-4, 0.02), linear, rtol=1e-12)
    a, b = math.sqrt(0.00085), math.sqrt(0.012)
    scaled = (a + k * (b - a) / 999) ** 2
    np.testing.assert_allclose(make_betas("scaled_linear", 1000, 0.00085, 0.012), scaled, rtol=1e-12)


def test_cosine_schedule_alpha_bar_is_the_cosine_ratio():
    betas = make_betas("squaredcos_cap_v2", 1000)
    np.testing.assert_array_equal(betas, make_betas("cosine", 1000))
    f = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    abar = np.cumprod(1.0 - betas)
    first_capped = int(np.argmax(betas == 0.999))
    assert first_capped > 990 and bool((betas[first_capped:] == 0.999).all())  # the cap bites at the end only
    expected = np.array([f((k + 1) / 1000) / f(0.0) for k in range(first_capped)])
    np.testing.assert_allclose(abar[:first_capped], expected, rtol=1e-9)


def test_iddpm_space_timesteps_by_hand():
    assert space_timesteps(1000, "25") == IDDPM_25[::-1]
    assert space_timesteps(1000, [25]) == IDDPM_25[::-1]
    # ddim25: the smallest stride s with len(range(0, 1000, s)) == 25 is 40
    assert space_timesteps(1000, "ddim25") == list(range(960, -1, -40))
    # three sections of 100 steps: 10 steps with stride 99 / 9 = 11 in the first one
    kept = space_timesteps(300, "10,15,20")
    assert len(kept) == 45
    assert sorted(t for t in kept if t < 100) == list(range(0, 100, 11))
    assert sum(100 <= t < 200 for t in kept) == 15 and max(kept) == 299


def test_diffusers_spacings_1000_to_25():
    assert diffusers_timesteps(1000, 25, "leading", steps_offset=1) == list(range(961, 0, -40))
    assert diffusers_timesteps(1000, 25, "leading") == list(range(960, -1, -40))
    assert diffusers_timesteps(1000, 25, "trailing") == list(range(999, 0, -40))
    assert diffusers_timesteps(1000, 25, "linspace") == IDDPM_25[::-1]  # round(linspace(0, 999, 25))


def test_respaced_betas_keep_alpha_bar_at_kept_steps():
    sampler = mar_sampler(25)
    abar_train = np.cumprod(1.0 - make_betas("cosine", 1000))
    kept = IDDPM_25[::-1]
    assert sampler.timesteps == kept
    # beta_i = 1 - abar_i / abar_prev, by hand for the noisiest and the least noisy steps
    assert sampler.betas[0] == pytest.approx(1 - abar_train[999] / abar_train[957], rel=1e-12)
    assert sampler.betas[-1] == pytest.approx(1 - abar_train[0], rel=1e-12)
    # the respaced chain's own cumulative product reproduces the kept alpha_bar values
    abar_chain = np.cumprod((1.0 - sampler.betas)[::-1])[::-1]
    np.testing.assert_allclose(abar_chain, abar_train[kept], rtol=1e-9)


def test_flow_sigmas_by_hand_and_model_times():
    # N=10, T=3, shift=2: s(x) = 2x / (1 + x); sigma_min = s(0.1) = 2/11 (= 0.1818...),
    # linspace(1, 2/11, 3) = [1, 13/22, 2/11] -> shifted [1, 26/35, 4/13], then 0
    sampler = FlowSDESampler(3, shift=2.0, num_train_timesteps=10)
    np.testing.assert_allclose(sampler.sigmas, [1.0, 26 / 35, 4 / 13, 0.0], rtol=1e-12)
    assert sampler.model_time(1) == pytest.approx(10 * 26 / 35)
    assert sampler.out_channels(16) == 16
    np.testing.assert_allclose(FlowSDESampler(4).sigmas, [1.0, 2 / 3 + 1 / 3000, 1 / 3 + 2 / 3000, 0.001, 0.0])


# ---------------------------------------------------------------- DDPM transitions
def _posterior_by_conditioning(x0, x_t, abar, abar_prev):
    """q(x_prev | x_t, x0) from the joint Gaussian of (x_prev, x_t) given x0 (independent derivation)."""
    alpha = abar / abar_prev
    var_prev, var_t = 1 - abar_prev, 1 - abar
    cov = math.sqrt(alpha) * var_prev
    mean = math.sqrt(abar_prev) * x0 + cov / var_t * (x_t - math.sqrt(abar) * x0)
    return mean, var_prev - cov * cov / var_t


@pytest.mark.parametrize("prediction_type", ["epsilon", "sample", "v_prediction"])
def test_ddpm_posterior_mean_and_variance_closed_form(prediction_type):
    sampler = DDPMSampler(
        10,
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        spacing="leading",
        steps_offset=1,
        prediction_type=prediction_type,
    )
    abar_train = np.cumprod(1.0 - make_betas("scaled_linear", 1000, 0.00085, 0.012))
    x0, eps = _randn(3, 4, 5, seed=1), _randn(3, 4, 5, seed=2)
    for i in range(sampler.num_steps):
        t = sampler.timesteps[i]
        abar = abar_train[t]
        abar_prev = abar_train[sampler.timesteps[i + 1]] if i + 1 < sampler.num_steps else 1.0
        x_t = math.sqrt(abar) * x0 + math.sqrt(1 - abar) * eps
        target = {"epsilon": eps, "sample": x0, "v_prediction": math.sqrt(abar) * eps - math.sqrt(1 - abar) * x0}[prediction_type]
        mean, std = sampler.mean_std(target, x_t, i)
        expected_mean, expected_var = _posterior_by_conditioning(x0, x_t, abar, abar_prev)
        torch.testing.assert_close(sampler.predict_x0(target, x_t, i), x0, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(mean, expected_mean, rtol=1e-9, atol=1e-9)
        assert std.shape == (1, 1, 1)
        assert float(std) ** 2 == pytest.approx(expected_var, rel=1e-9, abs=1e-15)
    # the least noisy step's posterior variance is exactly 0: a deterministic step
    assert sampler.is_deterministic(sampler.num_steps - 1) and sampler.timesteps[-1] == 1


def test_fixed_large_std_is_the_respaced_beta():
    sampler = DDPMSampler(8, variance_type="fixed_large", spacing="leading", steps_offset=1)
    x = _randn(2, 3, seed=3)
    for i in range(sampler.num_steps):
        _, std = sampler.mean_std(torch.zeros_like(x), x, i)
        assert float(std) == pytest.approx(math.sqrt(sampler.betas[i]), rel=1e-12)
    # diffusers adds noise at every step whose training step is > 0: the last step here is t=1
    assert sampler.stochastic_steps() == list(range(8))


def test_learned_range_std_lies_between_fixed_small_and_fixed_large():
    learned = mar_sampler(12)
    small = DDPMSampler(12, beta_schedule="cosine", spacing="iddpm", variance_type="fixed_small")
    large = DDPMSampler(12, beta_schedule="cosine", spacing="iddpm", variance_type="fixed_large")
    x, eps = _randn(4, 6, 3, seed=4), _randn(4, 6, 3, seed=5)
    assert learned.out_channels(3) == 6
    assert learned.stochastic_steps() == list(range(11)) and learned.is_deterministic(11)
    for i in learned.stochastic_steps():

        def learned_std(v):
            return learned.mean_std(torch.cat([eps, v], -1), x, i)[1]

        lo, hi = small.mean_std(eps, x, i)[1], large.mean_std(eps, x, i)[1]
        torch.testing.assert_close(learned_std(torch.full_like(x, -1.0)), lo.expand_as(x), rtol=1e-12, atol=0)
        torch.testing.assert_close(learned_std(torch.ones_like(x)), hi.expand_as(x), rtol=1e-12, atol=0)
        middle = learned_std(torch.rand(x.shape, generator=_gen(i), dtype=F64) * 1.8 - 0.9)
        assert bool((middle > lo).all() and (middle < hi).all())
        # the variance channels do not move the mean
        torch.testing.assert_close(
            learned.mean_std(torch.cat([eps, torch.ones_like(x)], -1), x, i)[0], small.mean_std(eps, x, i)[0], rtol=1e-12, atol=1e-12
        )


def test_deterministic_step_has_zero_std_and_zero_logp():
    for sampler in (DDPMSampler(10), mar_sampler(10), DDPMSampler(10, steps_offset=1)):
        last = sampler.num_steps - 1
        assert sampler.is_deterministic(last) and last not in sampler.stochastic_steps()
        x = _randn(2, 5, 4, seed=6)
        out = _randn(2, 5, sampler.out_channels(4), seed=7)
        step = sampler.step(out, x, last, _randn(2, 5, 4, seed=8))
        assert bool((step.std == 0).all())
        torch.testing.assert_close(step.logp, torch.zeros(2, 5, dtype=F64), rtol=0, atol=0)
        torch.testing.assert_close(step.x_prev, step.mean, rtol=0, atol=0)
        torch.testing.assert_close(sampler.logprob(step.x_prev, out, x, last), torch.zeros(2, 5, dtype=F64), rtol=0, atol=0)


def test_noise_none_is_the_deterministic_chain():
    sampler = mar_sampler(10)
    x, out = _randn(3, 4, seed=9), _randn(3, 8, seed=10)
    step = sampler.step(out, x, 2, None)
    mean, _ = sampler.mean_std(out, x, 2)
    torch.testing.assert_close(step.x_prev, mean, rtol=0, atol=0)
    torch.testing.assert_close(step.x_prev, sampler.step(out, x, 2, torch.zeros_like(x)).x_prev, rtol=0, atol=0)
    assert bool((step.std == 0).all()) and bool((step.logp == 0).all())
    # an x0-predicting head that always answers x*: the noise-free chain lands exactly on x*
    target = _randn(5, 3, seed=11)
    chain = DDPMSampler(25, prediction_type="sample", spacing="trailing")
    x = _randn(5, 3, seed=12)
    for i in range(chain.num_steps):
        x = chain.step(target, x, i, None).x_prev
    torch.testing.assert_close(x, target, rtol=1e-9, atol=1e-9)


def test_temperature_scales_std_and_zero_temperature_is_deterministic():
    sampler = mar_sampler(10)
    x, out = _randn(3, 4, seed=13), _randn(3, 8, seed=14)
    std1 = sampler.mean_std(out, x, 1)[1]
    torch.testing.assert_close(sampler.mean_std(out, x, 1, temperature=0.5)[1], 0.5 * std1, rtol=1e-12, atol=0)
    cold = sampler.step(out, x, 1, _randn(3, 4, seed=15), temperature=0.0)
    assert bool((cold.std == 0).all()) and bool((cold.logp == 0).all())
    torch.testing.assert_close(cold.x_prev, cold.mean, rtol=0, atol=0)


def test_clip_sample_bounds_the_predicted_x0():
    sampler = DDPMSampler(10, prediction_type="sample", clip_sample=1.5)
    x, out = _randn(50, 4, seed=16), 3 * _randn(50, 4, seed=17)
    torch.testing.assert_close(sampler.predict_x0(out, x, 3), out.clamp(-1.5, 1.5), rtol=0, atol=0)


# ---------------------------------------------------------------- log-probabilities
def _samplers():
    return {
        "ddpm_fixed_small": DDPMSampler(10, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012),
        "mar_learned_range": mar_sampler(10),
        "ddpm_v_fixed_large": DDPMSampler(10, prediction_type="v", variance_type="fixed_large"),
        "flow_sde": FlowSDESampler(10, shift=3.0),
    }


@pytest.mark.parametrize("name", list(_samplers()))
def test_step_logp_is_the_analytic_gaussian_density(name):
    sampler = _samplers()[name]
    x = _randn(2, 6, 4, seed=18)
    out = _randn(2, 6, sampler.out_channels(4), seed=19)
    noise = _randn(2, 6, 4, seed=20)
    for i in sampler.stochastic_steps():
        step = sampler.step(out, x, i, noise)
        assert step.logp.shape == (2, 6) and step.logp.dtype == F64
        std = step.std.expand_as(x)
        assert bool((std > 0).all())
        torch.testing.assert_close((step.x_prev - step.mean) / std, noise, rtol=1e-9, atol=1e-9)
        density = torch.distributions.Normal(step.mean, std).log_prob(step.x_prev).sum(-1)
        torch.testing.assert_close(step.logp, density, rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(sampler.logprob(step.x_prev, out, x, i), step.logp, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(_samplers()))
def test_logprob_matches_step_in_bf16_and_computes_in_fp32(name):
    sampler = _samplers()[name]
    x = _randn(3, 5, 4, seed=21, dtype=torch.float32).to(torch.bfloat16)
    out = _randn(3, 5, sampler.out_channels(4), seed=22, dtype=torch.float32).to(torch.bfloat16)
    noise = _randn(3, 5, 4, seed=23, dtype=torch.float32)
    i = sampler.stochastic_steps()[3]
    step = sampler.step(out, x, i, noise)
    assert step.x_prev.dtype == torch.bfloat16
    assert step.logp.dtype == torch.float32 and step.mean.dtype == torch.float32
    assert bool(torch.isfinite(step.logp).all())
    torch.testing.assert_close(sampler.logprob(step.x_prev, out, x, i), step.logp, rtol=0, atol=0)
    # the same transition evaluated in float64 agrees to float32 accuracy
    reference = sampler.logprob(step.x_prev.double(), out.double(), x.double(), i)
    torch.testing.assert_close(step.logp.double(), reference, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["mar_learned_range", "ddpm_v_fixed_large", "flow_sde"])
def test_logprob_gradcheck_in_model_output(name):
    sampler = _samplers()[name]
    x = _randn(2, 3, 2, seed=24)
    x_prev = _randn(2, 3, 2, seed=25)
    out = (0.5 * _randn(2, 3, sampler.out_channels(2), seed=26)).requires_grad_(True)
    i = sampler.stochastic_steps()[2]
    assert torch.autograd.gradcheck(lambda o: sampler.logprob(x_prev, o, x, i), (out,))
    sampler.logprob(x_prev, out, x, i).sum().backward()
    assert out.grad is not None and bool((out.grad != 0).any())


# ---------------------------------------------------------------- training-time forward process
@pytest.mark.parametrize("prediction_type", ["epsilon", "sample", "v_prediction"])
def test_add_noise_and_training_target_invert_through_predict_x0(prediction_type):
    sampler = DDPMSampler(20, spacing="trailing", prediction_type=prediction_type)
    x0, noise = _randn(4, 3, 5, seed=27), _randn(4, 3, 5, seed=28)
    i = 7
    t_train = torch.full((4,), sampler.timesteps[i], dtype=torch.long)
    x_t = sampler.add_noise(x0, noise, t_train)
    abar = float(np.cumprod(1.0 - make_betas("linear", 1000))[sampler.timesteps[i]])
    torch.testing.assert_close(x_t, math.sqrt(abar) * x0 + math.sqrt(1 - abar) * noise, rtol=1e-12, atol=1e-12)
    target = sampler.training_target(x0, noise, t_train)
    torch.testing.assert_close(sampler.predict_x0(target, x_t, i), x0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(sampler.train_model_time(t_train), torch.full((4,), float(sampler.model_time(i))))


def test_flow_add_noise_and_velocity_target():
    sampler = FlowSDESampler(10, shift=3.0)
    x0, noise = _randn(4, 3, 5, seed=29), _randn(4, 3, 5, seed=30)
    i = 4
    sigma = torch.full((4, 3), float(sampler.sigmas[i]), dtype=F64)
    x_t = sampler.add_noise(x0, noise, sigma)
    torch.testing.assert_close(x_t, sampler.sigmas[i] * noise + (1 - sampler.sigmas[i]) * x0)
    velocity = sampler.training_target(x0, noise, sigma)
    torch.testing.assert_close(sampler.predict_x0(velocity, x_t, i), x0, rtol=1e-12, atol=1e-12)
    assert float(sampler.train_model_time(sigma)[0, 0]) == pytest.approx(sampler.model_time(i), rel=1e-6)


# ---------------------------------------------------------------- flow SDE / ODE
def test_flow_sde_step_matches_the_reference_formulas():
    a = 0.7
    sampler = FlowSDESampler(6, noise_level=a, shift=2.0)
    sig = sampler.sigmas
    x, v = _randn(3, 4, seed=31), _randn(3, 4, seed=32)
    for i in (0, 3, 5):
        s, dt = sig[i], sig[i + 1] - sig[i]
        ratio = s / (1 - (sig[1] if i == 0 else s))  # sigma = 1 uses the second sigma (Flow-GRPO)
        sh = a * math.sqrt(ratio)
        mean = x * (1 + sh**2 * dt / (2 * s)) + v * (1 + sh**2 * (1 - s) / (2 * s)) * dt
        got_mean, got_std = sampler.mean_std(v, x, i, temperature=0.8)
        torch.testing.assert_close(got_mean, mean, rtol=1e-12, atol=1e-12)
        assert float(got_std) == pytest.approx(0.8 * sh * math.sqrt(-dt), rel=1e-12)
    ode = FlowSDESampler(6, shift=2.0, mode="ode")
    torch.testing.assert_close(ode.mean_std(v, x, 3)[0], x + v * (sig[4] - sig[3]), rtol=1e-12, atol=1e-12)
    assert ode.stochastic_steps() == [] and FlowSDESampler(6, noise_level=0.0).stochastic_steps() == []


def test_flow_ode_maps_noise_to_a_point_mass_target():
    # data = x*: the exact velocity is (x - x*) / sigma, Euler is exact, and sigma_T = 0 lands on x*
    target = _randn(1, 3, seed=33)
    sampler = FlowSDESampler(7, shift=3.0, mode="ode")
    x = _randn(500, 3, seed=34)
    for i in range(sampler.num_steps):
        velocity = (x - target) / sampler.sigmas[i]
        x = sampler.step(velocity, x, i, _randn(500, 3, seed=100 + i)).x_prev
    torch.testing.assert_close(x, target.expand_as(x), rtol=1e-10, atol=1e-10)


def _gaussian_velocity(x, sigma, m0, s0):
    """E[noise - x0 | x_sigma] for x0 ~ N(m0, s0^2), x_sigma = sigma noise + (1 - sigma) x0."""
    var = (1 - sigma) ** 2 * s0**2 + sigma**2
    gain = (sigma - (1 - sigma) * s0**2) / var
    return -m0 + gain * (x - (1 - sigma) * m0)


@pytest.fixture
def one_thread():
    """The 40k-element chains run ~20x faster on one intra-op thread on the shared 2-core CI box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("mode", ["sde", "ode"])
def test_flow_samples_match_the_gaussian_marginals(mode, one_thread):
    # per-channel Gaussian data; samples of the chain driven by the exact velocity must follow
    # N((1 - sigma) m0, (1 - sigma)^2 s0^2 + sigma^2) at every sigma (continuous-time marginals)
    m0 = torch.tensor([0.8, -1.5], dtype=F64)
    s0 = torch.tensor([0.5, 1.2], dtype=F64)
    n = 20000
    sampler = FlowSDESampler(50, noise_level=0.7, mode=mode)
    gen = _gen(35)
    x = torch.randn(n, 2, generator=gen, dtype=F64)
    late = sampler.num_steps // 2  # the first steps carry most of the discretisation error
    for i in range(sampler.num_steps):
        velocity = _gaussian_velocity(x, float(sampler.sigmas[i]), m0, s0)
        x = sampler.step(velocity, x, i, torch.randn(n, 2, generator=gen, dtype=F64)).x_prev
        sigma = float(sampler.sigmas[i + 1])
        if i >= late:
            mean = (1 - sigma) * m0
            std = ((1 - sigma) ** 2 * s0**2 + sigma**2).sqrt()
            # 5 standard errors of the estimates plus a 2% allowance for the 50-step discretisation
            torch.testing.assert_close(x.mean(0), mean, rtol=0, atol=(5 / math.sqrt(n) + 0.02) * float(std.max()))
            torch.testing.assert_close(x.std(0), std, rtol=5 * math.sqrt(0.5 / n) + 0.02, atol=0)


# ---------------------------------------------------------------- builders
def test_from_diffusers_config_dict_and_path(tmp_path):
    config = {
        "_class_name": "DDPMScheduler",
        "_diffusers_version": "0.30.0",
        "beta_schedule": "scaled_linear",
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "clip_sample": False,
        "num_train_timesteps": 1000,
        "prediction_type": "epsilon",
        "steps_offset": 1,
        "timestep_spacing": "leading",
        "variance_type": "fixed_small",
        "thresholding": False,
    }
    direct = DDPMSampler(25, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    x, out = _randn(2, 4, seed=36), _randn(2, 4, seed=37)
    for built in (
        from_diffusers_config(config, 25),
        from_diffusers_config(tmp_path, 25),
        make_sampler("diffusers", config=str(tmp_path / "scheduler"), num_steps=25),
    ):
        assert isinstance(built, DDPMSampler) and built.timesteps == direct.timesteps
        assert built.clip_sample is None
        for i in (0, 12, 24):
            torch.testing.assert_close(built.mean_std(out, x, i), direct.mean_std(out, x, i), rtol=0, atol=0)
    # NOVA's scheduler never clips (diffusers' default clip_sample=True is ignored) unless asked
    assert from_diffusers_config({"_class_name": "DDPMScheduler"}, 10).clip_sample is None
    assert from_diffusers_config({"_class_name": "DDPMScheduler"}, 10, clip_sample=1.0).clip_sample == 1.0
    flow = from_diffusers_config(
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "use_dynamic_shifting": False}, 25, noise_level=0.5
    )
    assert isinstance(flow, FlowSDESampler) and flow.noise_level == 0.5
    np.testing.assert_array_equal(flow.sigmas, FlowSDESampler(25, shift=3.0).sigmas)


def test_make_sampler_kinds():
    assert make_sampler("ddpm", num_steps=5, variance_type="fixed_large").variance_type == "fixed_large"
    assert make_sampler("flow", num_steps=5, mode="ode").stochastic_steps() == []
    assert make_sampler("mar", num_steps="ddim25").timesteps == list(range(960, -1, -40))
    harmon = mar_sampler(100, learn_sigma=False)
    assert harmon.variance_type == "fixed_large" and harmon.out_channels(16) == 16 and harmon.model_time(0) == 999


@pytest.mark.parametrize(
    "build, argument",
    [
        (lambda: DDPMSampler(10, beta_schedule="quadratic"), "beta_schedule"),
        (lambda: DDPMSampler(10, spacing="uniform"), "spacing"),
        (lambda: DDPMSampler(10, prediction_type="score"), "prediction_type"),
        (lambda: DDPMSampler(10, variance_type="learned"), "variance_type"),
        (lambda: DDPMSampler(0), "num_steps"),
        (lambda: DDPMSampler(1001), "num_steps"),
        (lambda: DDPMSampler(25, steps_offset=40), "steps_offset"),
        (lambda: DDPMSampler(3, spacing=[5, 5, 1]), "spacing"),
        (lambda: DDPMSampler(10, clip_sample=-1.0), "clip_sample"),
        (lambda: space_timesteps(1000, "ddim999"), "section_counts"),
        (lambda: space_timesteps(10, "20"), "section_counts"),
        (lambda: FlowSDESampler(10, noise_level=-0.1), "noise_level"),
        (lambda: FlowSDESampler(10, shift=0.0), "shift"),
        (lambda: FlowSDESampler(10, mode="heun"), "mode"),
        (lambda: mar_sampler(25, noise_schedule="sigmoid"), "noise_schedule"),
        (lambda: make_sampler("ddim", num_steps=10), "kind"),
        (lambda: make_sampler("ddpm", num_steps=10, sigma_small=True), "sigma_small"),
        (lambda: from_diffusers_config({"thresholding": True}, 10), "thresholding"),
        (lambda: from_diffusers_config({"beta_shedule": "linear"}, 10), "beta_shedule"),
        (lambda: from_diffusers_config({"_class_name": "DDIMScheduler"}, 10), "DDIMScheduler"),
        (
            lambda: from_diffusers_config({"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True}, 10),
            "use_dynamic_shifting",
        ),
    ],
)
def test_bad_constructor_arguments_raise(build, argument):
    with pytest.raises(ValueError, match=argument):
        build()


def test_missing_config_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="scheduler_config.json"):
        from_diffusers_config(tmp_path, 10)


def test_bad_step_arguments_raise():
    sampler = mar_sampler(10)
    x, out = torch.zeros(2, 4), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="i: got 10"):
        sampler.step(out, x, 10, None)
    with pytest.raises(ValueError, match="i: got"):
        sampler.step(out, x, torch.tensor(1), None)
    with pytest.raises(ValueError, match="model_output"):
        sampler.step(torch.zeros(2, 4), x, 0, None)
    with pytest.raises(ValueError, match="noise"):
        sampler.step(out, x, 0, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        sampler.step(out, x, 0, None, temperature=-1.0)
    with pytest.raises(ValueError, match="x_prev"):
        sampler.logprob(torch.zeros(3, 4), out, x, 0)
    with pytest.raises(ValueError, match="t_train"):
        sampler.add_noise(x, x, torch.full((2,), 1000))
    with pytest.raises(ValueError, match="t_train"):
        FlowSDESampler(4).add_noise(x, x, torch.full((2,), 1.5))

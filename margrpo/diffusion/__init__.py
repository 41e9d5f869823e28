"""Noise schedules and samplers for the per-token diffusion head: pure math, no model code.

Samplers follow docs/CONTRACTS.md ("Diffusion samplers"): step(model_output, x_t, i, noise) ->
StepOutput(x_prev, mean, std, logp), logprob(...) for training recomputation, is_deterministic(i)
and stochastic_steps() for the steps that carry a likelihood.
"""

from .ddpm import DDPMSampler
from .factory import from_diffusers_config, make_sampler, mar_sampler
from .flow import FlowSDESampler, flow_sigmas
from .sampler import Sampler, StepOutput, transition_logprob
from .schedules import diffusers_timesteps, make_betas, respaced_betas, space_timesteps

__all__ = [
    "DDPMSampler",
    "FlowSDESampler",
    "Sampler",
    "StepOutput",
    "diffusers_timesteps",
    "flow_sigmas",
    "from_diffusers_config",
    "make_betas",
    "make_sampler",
    "mar_sampler",
    "respaced_betas",
    "space_timesteps",
    "transition_logprob",
]

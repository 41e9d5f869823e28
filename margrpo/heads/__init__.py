"""Diffusion heads of MAR models and the fused multi-seed denoising path.

Every head implements DiffusionHead (margrpo.heads.protocol): embed_condition(z), modulation(cond, t),
denoise(x, modulation, backend), in_channels / out_channels / z_channels.
Heads (official parameter names):
  SimpleMLPAdaLN / mar_head(size)   MAR-B/L/H and Harmon (learned variance: 2C outputs)
  DiffusionMLP / nova_head(size)    NOVA (d3w1280, d6w768, d6w1024, d6w1536)
  adapt(module)                     another codebase's head module, wrapped without copying it
Sampling and training:
  multi_seed_denoise(head, z, sampler, num_seeds, cfg, ...) -> MultiSeedSamples
  denoise_logprob(head, z, sampler, record, cfg)            -> [K+1, R, N] with grad to z
  transitions_logprob(head, z, sampler, steps, x_t, x_prev)  the same from the recorded tensors alone
  Guidance (CFG), CounterNoise (batch-independent noise)
  GraphedMultiSeed                                          the same, T-step loop in a CUDA graph
Weights: load_head_state_dict, head_from_state_dict, reinit_zero_layers_ (tests).
"""

from .adapt import ForwardHead, MARLayoutHead, adapt, has_mar_layout
from .cfg import Guidance
from .cuda_graph import GraphedMultiSeed
from .layers import Modulation
from .mar_head import MAR_SIZES, SimpleMLPAdaLN, mar_head
from .multi_seed import (
    MultiSeedSamples,
    denoise_logprob,
    guided_output,
    multi_seed_denoise,
    run_chains,
    transitions_logprob,
)
from .noise import CounterNoise, counter_normal
from .protocol import DiffusionHead
from .nova_head import NOVA_SIZES, DiffusionMLP, nova_head, patchify, unpatchify
from .weights import head_from_state_dict, load_head_state_dict, reinit_zero_layers_, strip_prefix

__all__ = [
    "transitions_logprob",
    "DiffusionHead",
    "ForwardHead",
    "MARLayoutHead",
    "adapt",
    "has_mar_layout",
    "Guidance",
    "GraphedMultiSeed",
    "Modulation",
    "MAR_SIZES",
    "SimpleMLPAdaLN",
    "mar_head",
    "MultiSeedSamples",
    "denoise_logprob",
    "guided_output",
    "multi_seed_denoise",
    "run_chains",
    "CounterNoise",
    "counter_normal",
    "NOVA_SIZES",
    "DiffusionMLP",
    "nova_head",
    "patchify",
    "unpatchify",
    "head_from_state_dict",
    "load_head_state_dict",
    "reinit_zero_layers_",
    "strip_prefix",
]

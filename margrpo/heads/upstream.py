"""The upstream way of sampling, as eager loops: how the paper's public code (and the MAR, NOVA and
Harmon code it builds on) runs the diffusion head, for the fused multi-seed path to match.

One chain per trajectory, one official head call per (trajectory, step) with the modulation
recomputed inside it, CFG by duplicating x over the [cond; uncond] rows, a plain sampler loop.
Slow by design: tests compare the fused path with it, benchmarks time against it.
"""

from __future__ import annotations

import torch

from . import layers
from .cfg import Guidance
from .multi_seed import MultiSeedSamples, _acc_dtype, _check_steps


def _official_output(head, x: torch.Tensor, t, z: torch.Tensor, cfg: Guidance | None) -> torch.Tensor:
    """head(x, t, z) for one trajectory x [N, C]; with CFG x is duplicated over z's 2N rows."""
    times = layers.as_time_tensor(t, z.device).expand(z.shape[0])
    if cfg is None:
        return head(x, times, z)
    out = head(torch.cat([x, x]), times, z)
    tokens = x.shape[0]
    return cfg.combine(out[:tokens], out[tokens:], head.in_channels)


def eager_multi_seed_denoise(
    head,
    z: torch.Tensor,
    sampler,
    num_seeds: int,
    noise: torch.Tensor,
    cfg: Guidance | None = None,
    record_steps=(),
    temperature: float = 1.0,
) -> MultiSeedSamples:
    """Same contract as multi_seed_denoise with an explicit noise [T+1, K+1, N, C]."""
    acc = _acc_dtype(z)
    steps = _check_steps(record_steps, sampler.num_steps)
    finals, per_traj = [], []
    with torch.no_grad():
        for k in range(num_seeds + 1):
            x = noise[0, k].to(acc)
            kept = []
            for i in range(sampler.num_steps):
                out = _official_output(head, x, sampler.model_time(i), z, cfg).to(acc)
                step = sampler.step(out, x, i, noise[i + 1, k].to(acc), temperature)
                if i in steps:
                    std = torch.as_tensor(step.std, dtype=acc, device=x.device).expand_as(x)
                    kept.append((x, step.x_prev, step.mean, std, step.logp))
                x = step.x_prev
            finals.append(x)
            per_traj.append(kept)
    fields = []
    for j in range(5):  # x_t, x_prev, mean, std, logp: [K+1, R, ...]
        if steps:
            fields.append(torch.stack([torch.stack([step[j] for step in kept]) for kept in per_traj]))
        else:
            shape = (num_seeds + 1, 0, *finals[0].shape[: 1 if j == 4 else 2])
            fields.append(torch.empty(shape, dtype=acc, device=z.device))
    return MultiSeedSamples(torch.stack(finals), steps, *fields)


def eager_denoise_logprob(
    head, z: torch.Tensor, sampler, record: MultiSeedSamples, cfg: Guidance | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Same contract as denoise_logprob on a [K+1, R, N, C] record: a loop over trajectories and
    recorded steps, with grad to z."""
    acc = _acc_dtype(z)
    trajectories = []
    for k in range(record.x_t.shape[0]):
        per_step = []
        for r, i in enumerate(record.steps):
            x_t = record.x_t[k, r].detach().to(acc)
            out = _official_output(head, x_t, sampler.model_time(i), z, cfg).to(acc)
            per_step.append(sampler.logprob(record.x_prev[k, r].detach().to(acc), out, x_t, i, temperature))
        trajectories.append(torch.stack(per_step))
    return torch.stack(trajectories)

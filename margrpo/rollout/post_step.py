"""The post-step known mask (RolloutConfig.known_mask = "post_step"): what generate records for it.

The reference Harmon code trains a recorded mask step with the step's own tokens already known, and
scores only the positions still unknown after the step: the transitions the head drew for them at
the step (under the pre-step canvas; their samples never enter the image), evaluated under the
post-step canvas. The post-step canvas is exactly what the next effective mask step's forward sees,
so generate scores them there, with no extra backbone pass: it drops the step's committed positions
from the record, keeps x_t and x_prev as drawn, and replaces mean, std and logp
with the policy's Gaussian under the next step's z (`score_transitions`), the same quantity
rollout_logprob recomputes with gradient. The std trajectory 0 was drawn with (under the pre-step
canvas) stays in the rollout as `sampled_std`: the reference trains with that one as a constant
(grpo.likelihood_std: recorded_main).
"""

from __future__ import annotations

import torch

from margrpo.heads import Guidance
from margrpo.heads.multi_seed import from_step_first, step_first, transition_outputs


@torch.no_grad()
def score_transitions(
    head,
    z: torch.Tensor,
    sampler,
    steps: tuple[int, ...],
    x_t: torch.Tensor,
    x_prev: torch.Tensor,
    cfg: Guidance | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's Gaussian for recorded transitions x_t -> x_prev [T, B, R, P, C] (R = len(steps)
    diffusion steps, T trajectories, B images) under condition rows z [B * P, Dz] ([2 B P, Dz] =
    [cond; uncond] with guidance `cfg`) -> (logp [T, B, R, P], mean and std [T, B, R, P, C]) in
    x_t's dtype.

    The head evaluation of margrpo.heads.transitions_logprob, plus the std, which a learned-range
    variance takes from the head output."""
    rows = z if cfg is None else z.reshape(2, z.shape[0] // 2, z.shape[1])
    images = tuple(x_t.shape[1:-3])
    x_t, x_prev = step_first(x_t), step_first(x_prev)
    out = transition_outputs(head, rows, sampler, steps, x_t, cfg)
    logps, means, stds = [], [], []
    for r, i in enumerate(steps):
        mean, std = sampler.mean_std(out[r], x_t[r], i, temperature)
        logps.append(sampler.logprob(x_prev[r], out[r], x_t[r], i, temperature))
        means.append(mean.to(x_t.dtype))
        stds.append(torch.as_tensor(std, dtype=x_t.dtype, device=x_t.device).expand_as(x_t[r]))
    logp = torch.stack(logps).to(x_t.dtype)
    return from_step_first(logp, images), from_step_first(torch.stack(means), images), from_step_first(torch.stack(stds), images)

"""The post-step known mask (RolloutConfig.known_mask = "post_step"): what generate records for it.

The reference Harmon code trains a recorded mask step with the step's own tokens already known, and
scores only the positions still unknown after the step: the transitions the head drew for them at
the step (under the pre-step canvas; their samples never enter the image), evaluated under the
post-step canvas. The post-step canvas is exactly what the next effective mask step's forward sees,
so generate scores them there, with no extra backbone pass: it drops the step's committed positions
from the record (`drop_committed`), keeps x_t and x_prev as drawn, and replaces mean, std and logp
with the policy's Gaussian under the next step's z (`score_transitions`), the same quantity
rollout_logprob recomputes with gradient. The std trajectory 0 was drawn with (under the pre-step
canvas) stays in the rollout as `sampled_std`: the reference trains with that one as a constant
(grpo.likelihood_std: recorded_main).
"""

from __future__ import annotations

import torch

from margrpo.heads import Guidance, guided_output
from margrpo.heads.multi_seed import step_times


def drop_committed(values: torch.Tensor, B: int, committed: int) -> torch.Tensor:
    """A head-layout record [R, T, B * P, ...] without the first `committed` positions of every image
    -> [R, T, B * (P - committed), ...]."""
    R, T, rows, tail = values.shape[0], values.shape[1], values.shape[2], values.shape[3:]
    per_image = values.reshape(R, T, B, rows // B, *tail)[:, :, :, committed:]
    return per_image.reshape(R, T, -1, *tail)


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
    """The policy's Gaussian for recorded transitions x_t -> x_prev [R, T, P, C] (R = len(steps)
    diffusion steps, T trajectories) under condition rows z [P, Dz] ([2P, Dz] = [cond; uncond] with
    guidance `cfg`) -> (logp [R, T, P], mean [R, T, P, C], std [R, T, P, C]) in x_t's dtype.

    The same head evaluation as margrpo.heads.denoise_logprob (all R steps in one head call), plus
    the std, which a learned-range variance takes from the head output."""
    acc = x_t.dtype
    rows = z if cfg is None else z.reshape(2, z.shape[0] // 2, z.shape[1])
    cond = head.embed_condition(rows)
    times = step_times(sampler, steps, z.device).reshape(len(steps), *([1] * cond.dim()))
    out = guided_output(head, head.modulation(cond, times), x_t, cfg)
    out = out.to(acc)
    logps, means, stds = [], [], []
    for r, i in enumerate(steps):
        mean, std = sampler.mean_std(out[r], x_t[r], i, temperature)
        logps.append(sampler.logprob(x_prev[r], out[r], x_t[r], i, temperature))
        means.append(mean.to(acc))
        stds.append(torch.as_tensor(std, dtype=acc, device=x_t.device).expand_as(x_t[r]))
    return torch.stack(logps).to(acc), torch.stack(means), torch.stack(stds)

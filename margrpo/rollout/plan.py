"""Which transitions a rollout records, chosen BEFORE it runs.

GRPO's likelihood uses a random subset of mask steps (e.g. 12 of 64) and, inside each, a random subset
of diffusion steps (e.g. 10 of T). Choosing them up front means the rollout stores only those
transitions (the reference code records everything and subsamples afterwards). Only effective mask
steps (that reveal tokens) and stochastic diffusion steps (std > 0) can be chosen: a deterministic
step has no density, and flooring its variance makes its gradient explode (docs/METHOD.md section 3).
With the post-step known mask the final effective step is not chosen either: it leaves no position
unknown, so it would record nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .schedule import effective_steps


@dataclass(frozen=True)
class RecordPlan:
    """mask_steps: sorted mask-step indices (into the S-step schedule); diffusion_steps[j]: sorted
    diffusion-step indices (0 = noisiest) recorded at mask_steps[j], the same count R for every j."""

    mask_steps: tuple[int, ...]
    diffusion_steps: tuple[tuple[int, ...], ...]

    @property
    def num_mask_steps(self) -> int:
        return len(self.mask_steps)

    @property
    def num_diffusion_steps(self) -> int:
        return len(self.diffusion_steps[0]) if self.diffusion_steps else 0

    def mask_steps_only(self) -> RecordPlan:
        """The same mask steps, no diffusion transitions (the matching estimator scores the committed
        tokens of these steps, not recorded transitions; the rollout then keeps the whole denoising
        chain of those tokens private under common random numbers)."""
        return RecordPlan(self.mask_steps, tuple(() for _ in self.mask_steps))


def stochastic_steps(sampler) -> list[int]:
    """Diffusion steps of `sampler` with a non-degenerate Gaussian transition (usable in a likelihood)."""
    return [i for i in range(sampler.num_steps) if not sampler.is_deterministic(i)]


def choose_plan(
    reveal_counts: list[int],
    sampler,
    num_mask_steps: int,
    num_diffusion_steps: int,
    generator: torch.Generator,
    known_mask: str = "pre_step",
    diffusion_range: tuple[int, int | None] | None = None,
) -> RecordPlan:
    """Draw `num_mask_steps` distinct effective mask steps and, for each, `num_diffusion_steps`
    distinct stochastic diffusion steps, uniformly without replacement (CPU `generator`).
    known_mask: the RolloutConfig setting; "post_step" leaves out the final effective step.
    diffusion_range: (start, stop) limits the diffusion steps to start <= i < stop (stop None: to the
    end); None: every stochastic step."""
    if known_mask not in ("pre_step", "post_step"):
        raise ValueError(f"known_mask: got {known_mask!r}, expected 'pre_step' or 'post_step'")
    candidates_mask = effective_steps(reveal_counts)
    if known_mask == "post_step":
        candidates_mask = candidates_mask[:-1]
    candidates_diff = stochastic_steps(sampler)
    if diffusion_range is not None:
        start, stop = diffusion_range
        stop = sampler.num_steps if stop is None else stop
        candidates_diff = [i for i in candidates_diff if start <= i < stop]
    if not 0 <= num_mask_steps <= len(candidates_mask):
        what = "reveal tokens and leave some unknown" if known_mask == "post_step" else "reveal tokens"
        raise ValueError(
            f"record_mask_steps: got {num_mask_steps}, expected 0..{len(candidates_mask)} "
            f"(the schedule has {len(candidates_mask)} steps that {what})"
        )
    if not 1 <= num_diffusion_steps <= len(candidates_diff):
        raise ValueError(
            f"record_diffusion_steps: got {num_diffusion_steps}, expected 1..{len(candidates_diff)} "
            f"(the sampler has {len(candidates_diff)} stochastic steps of {sampler.num_steps}"
            + (f" in record_diffusion_range {list(diffusion_range)}" if diffusion_range is not None else "")
            + ")"
        )
    picked = torch.randperm(len(candidates_mask), generator=generator)[:num_mask_steps]
    mask_steps = tuple(sorted(candidates_mask[i] for i in picked.tolist()))
    diffusion_steps = []
    for _ in mask_steps:
        picked = torch.randperm(len(candidates_diff), generator=generator)[:num_diffusion_steps]
        diffusion_steps.append(tuple(sorted(candidates_diff[i] for i in picked.tolist())))
    return RecordPlan(mask_steps, tuple(diffusion_steps))

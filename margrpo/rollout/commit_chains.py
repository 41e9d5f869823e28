"""rollout.seed_chains: commit, the reference code's multi-trajectory expectation as it really runs.

By default ("step") the K seed chains of a recorded transition are drawn at the recorded mask step,
under that step's z: fresh samples of the distribution the likelihood scores them with, so their
score term has zero expectation given z. The reference code instead samples every token's seed
chains once after the rollout, from the token's commit-time condition z_c, and scores them under the
recorded step's z_j. For a position committed at a later step than j (likelihood_positions
"unknown") z_c != z_j: the chains are not draws of the scored distribution, so the term is not
zero-mean; in expectation it pulls p(. | z_j) towards p(. | z_c), the distribution the token was
finally drawn from. For tokens committed at step j, z_c = z_j and both modes give the same chains
(the same noise bank entries, the same z).

`CommitChains` remembers z_c of every token as generate() commits it and z_j of every recorded step,
then `resample` replaces trajectories 1..K of each recorded step's record. Memory: the z rows of
every token, (1 or 2) B N Dz floats, plus those of every recorded step's positions.
"""

from __future__ import annotations

import torch

from margrpo.heads import multi_seed_denoise

from .guidance import PromptRows, head_condition
from .post_step import score_transitions


class CommitChains:
    """The condition rows generate() needs to resample seed chains at commit time."""

    def __init__(self) -> None:
        self.commit_z: torch.Tensor | None = None  # [rows_per_image * B, N, Dz]: z at each token's commit step
        self.step_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # j -> (positions [B, P], z_j rows)

    def remember_commit(self, z: torch.Tensor, committed: torch.Tensor) -> None:
        """z [rows_per_image * B, N, Dz] of this mask step; committed [B, n]: its committed positions."""
        if self.commit_z is None:
            self.commit_z = torch.zeros_like(z)
        index = committed.repeat(z.shape[0] // committed.shape[0], 1)[..., None].expand(-1, -1, z.shape[-1])
        self.commit_z.scatter_(1, index, z.gather(1, index))

    def remember_step(self, j: int, positions: torch.Tensor, z_rows: torch.Tensor) -> None:
        """Recorded mask step j's likelihood positions [B, P] and their head condition rows under z_j."""
        self.step_rows[j] = (positions, z_rows)

    def resample(
        self,
        records: list[dict],
        backbone,
        cond: PromptRows,
        sampler,
        noise_bank: torch.Tensor,
        plan,
        guidance_of,
        temperature: float,
        num_seeds: int,
        compiled: bool = False,
    ) -> None:
        """Replace trajectories 1..K of every recorded step's record (rollout layout) by chains drawn
        under z_c with the same noise-bank entries, scored under z_j (compiled: the head's step
        output compiled, rollout.compile_head)."""
        from .generate import _gather_rows  # the loop's noise layout, kept in one place

        for j, (positions, z_rows) in self.step_rows.items():
            B, P = positions.shape
            noise = _gather_rows(noise_bank, positions).reshape(B * P, *noise_bank.shape[2:]).permute(1, 2, 0, 3)
            guidance = guidance_of(j)
            out = multi_seed_denoise(
                backbone.head,
                head_condition(self.commit_z, cond, positions),
                sampler,
                num_seeds=num_seeds,
                cfg=guidance,
                record_steps=plan.diffusion_steps[j],
                temperature=temperature,
                noise=noise,
                images=B,
                compiled=compiled,
            )
            dtype = records[j]["x_t"].dtype
            x_t, x_prev = out.x_t[1:].to(dtype), out.x_prev[1:].to(dtype)
            logp, mean, std = score_transitions(backbone.head, z_rows, sampler, plan.diffusion_steps[j], x_t, x_prev, guidance, temperature)
            for name, value in zip(("x_t", "x_prev", "logp", "mean", "std"), (x_t, x_prev, logp, mean, std)):
                records[j][name][1:] = value.to(dtype).flatten(2, 3)

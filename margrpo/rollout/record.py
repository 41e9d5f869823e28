"""Rollout: what one MAR generation batch leaves for GRPO training.

The recorded transitions have ONE layout, used by the Rollout, the training likelihood
(margrpo.rollout.likelihood) and the loss (margrpo.grpo, margrpo.ops.grpo_surrogate) alike:

    [T, B, L, ...]   trajectory, image, transition

T = 1 + K trajectories (0 = the rollout's own trajectory, 1..K the extra seed trajectories sampled
under the same z), B images, L recorded transitions per image. A rollout records M mask steps
(plan.mask_steps) and R diffusion steps inside each (plan.diffusion_steps[j]). At recorded mask step
j the likelihood covers P_j token positions: the n_j tokens revealed at that step ("revealed" mode),
the u_j positions still unknown before it ("unknown" mode; the first n_j of them are the ones
committed at that step), or, with the post-step known mask, the u_j - n_j positions still unknown
after it. The flat index over (j, r, p) is

    l = offset_j + r * P_j + p,    offset_j = R * (P_0 + ... + P_{j-1}),    L = R * sum_j P_j.

Every image of a rollout shares the schedule and the plan, so P_j and L are the same for all images
and no padding is needed. Per-transition masks and weights (selection, MTE) are [B, L]; the seed
trajectories' final tokens are trajectory-first too, [K, B, N, C]. The diffusion head records and
scores one mask step's transitions as [T, B, R, P_j, ...] (margrpo.heads.multi_seed_denoise with
`images=B`, transitions_logprob): the same layout with the step's part of L unflattened, so the
rollout hands the head a view of its record and flattens what comes back. (Inside, the head still
evaluates step-first, [R, T, B * P_j]: the row order that fixes its float rounding; see
margrpo.heads.multi_seed.step_first.)

The canvas and known mask of a recorded step's training forward are not stored: committed tokens
never change, so they are exactly `where(known, tokens, 0)` with known = a prefix of the image's order
(`canvas_known`). With the pre-step known mask (default) the prefix is the sum(n_<step) tokens
revealed before the step: the state the step was sampled from, so the step's own tokens get gradient.
With the post-step known mask (the reference Harmon code) it also holds the step's n_j tokens: the
state after the step, which the next mask step's forward sees; the step's tokens get no gradient.
In both, the likelihood positions are the next P_j entries of the order, right after the prefix.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .config import RolloutConfig
from .plan import RecordPlan

RECORDED = ("x_t", "x_prev", "mean", "std", "logp")  # the per-transition fields, in the head's names
# the trajectory-first fields (transitions [T, B, L, ...], seed tokens [K, B, N, C]): their image
# axis is 1; every other tensor field's is 0
TRAJECTORY_FIRST = (*RECORDED, "sampled_std", "old_logp", "old_mean", "ref_logp", "ref_mean", "seed_tokens")


class StepSlots(NamedTuple):
    """Where recorded mask step j sits (the symbols of the module docstring)."""

    start: int  # tokens known before the step: order[:, :start]
    revealed: int  # n_j, committed at the step: order[:, start : start + n_j]
    known: int  # tokens known in the step's training forward (start, plus n_j with the post-step known mask)
    count: int  # P_j likelihood positions: order[:, known : known + P_j]
    columns: slice  # its R x P_j transitions on the L axis: offset_j ... offset_j + R P_j


@dataclass
class Rollout:
    """One generated batch of B images and the transitions GRPO needs.

    Per image:
      prompts            list[str] (B)
      seeds              int64 [B]             the per-sample seeds that reproduce the rollout
      order              int64 [B, N]          generation order (a permutation of 0..N-1)
      tokens             fp32  [B, N, C]       final tokens (= trajectory 0 of each token's commit step)
      seed_tokens        fp32  [K, B, N, C]    final clean latents of the K seed trajectories of every
                                               token at its commit step (uncertainty for MTE top-k)
      images             fp32  [B, 3, H, W]    backbone.decode(tokens), in [0, 1]
    Recorded transitions (the [T, B, L] layout of the module docstring), T = K + 1:
      x_t, x_prev, mean  fp32  [T, B, L, C]    input, output and policy mean of each transition
      std                fp32  [T, B, L, C]    its std (per channel, as the head records it)
      logp               fp32  [T, B, L]       log N(x_prev; mean, std^2) summed over channels
      With the post-step known mask, x_t and x_prev are the chain drawn at the step (under the
      pre-step canvas, as the reference code records them) while mean, std and logp are the
      policy's Gaussian under the post-step canvas, the one the likelihood scores them with.
      sampled_std        fp32  [1, B, L, C]    post-step known mask only (else None): the std
                                               trajectory 0 was drawn with at the step, under the
                                               pre-step canvas (a learned-range std depends on z;
                                               grpo.likelihood_std recorded_main uses it, as the
                                               reference code does). Trajectory 0 only: nothing
                                               reads the seeds' sampling-time std.
      seed_recorded      bool  [B, L]          generate(seed_selection=...) only (else None: every
                                               entry drawn): True where the seed trajectories'
                                               entries were drawn (the tokens committed at the step
                                               and those the selection chose); elsewhere they hold
                                               trajectory 0's record as a stand-in
    Predicted clean latents for consistency-aware selection ("unknown" mode, unless generate() was told
    that no consistency test reads them; None in "revealed" mode, where every transition belongs to a
    token committed at its step, which the selection keeps):
      pred_clean         fp32  [B, M, N, C]    at recorded mask step j, the clean latent the head
                                               sampled (trajectory 0) for every position unknown
                                               before the step; known positions hold their tokens
      pred_clean_prev    fp32  [B, M, N, C]    the same at the effective mask step before it (zeros
                                               when step j is the first effective step)
      Both use the same per-(image, position, trajectory, diffusion step) noise, so their difference
      reflects the change of z between the two steps, not fresh noise.
    Shared by the batch (plain Python): reveal_counts (S ints), plan, cfg_scales (the guidance scale
    used at each recorded step), config, sampler.
    Set by a GRPO update before its loss (None until then; `with_update_values`), [T, B, L(, C)]:
      old_logp, old_mean the log-probs the update's ratio divides by, and their means, when they
                         are not `logp` and `mean` (an update whose likelihood differs from the
                         rollout's, in guidance or numerics, rescores them)
      ref_logp, ref_mean the frozen reference policy's log-probs and means of the transitions,
                         [T, B, L(, C)] or trajectory 0's alone, [1, B, L(, C)] (all the KL reads)

    Derived once per rollout: `slots`, per recorded mask step j its StepSlots (tokens known before
    it, n_j, tokens known in its training forward, P_j, its columns of L).

    Float tensors are fp32 (fp64 when the backbone is fp64, for exact tests).

    Memory in bytes, with f = 4 bytes per float (8 for fp64), int64 = 8, L = R * sum_j P_j:
        8 B (1 + N) + f B [N C (1 + K) + 3 H W + (K + 1) L (4 C + 1)]   [+ 2 f B M N C in unknown mode]
                                                                         [+ f B L C with post_step]
    e.g. NOVA-like B=16, N=1024, C=16, K=3, 512x512 images, M=12, R=10: revealed mode (L = 10 x ~195)
    87 MB, of which the images are 50 MB; unknown mode (L = 10 x ~7850) about 1.4 GB.
    `nbytes()` returns the actual count; `footprint(...)` evaluates this formula.
    """

    prompts: list[str]
    seeds: torch.Tensor
    order: torch.Tensor
    tokens: torch.Tensor
    seed_tokens: torch.Tensor
    images: torch.Tensor
    x_t: torch.Tensor
    x_prev: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    logp: torch.Tensor
    pred_clean: torch.Tensor | None
    pred_clean_prev: torch.Tensor | None
    reveal_counts: tuple[int, ...]
    plan: RecordPlan
    cfg_scales: tuple[float, ...]
    config: RolloutConfig
    sampler: Any
    sampled_std: torch.Tensor | None = None
    seed_recorded: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    old_mean: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    ref_mean: torch.Tensor | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def num_trajectories(self) -> int:
        return self.x_t.shape[0]

    @property
    def num_transitions(self) -> int:
        """L: recorded transitions per image and trajectory."""
        return self.logp.shape[2]

    @functools.cached_property
    def slots(self) -> tuple[StepSlots, ...]:
        """Where each recorded mask step sits in the images' order and on the L axis (the same for
        every image: computed once per rollout from the schedule and the plan)."""
        R, post_step = self.plan.num_diffusion_steps, self.config.known_mask == "post_step"
        revealed_mode, out, column = self.config.likelihood_positions == "revealed", [], 0
        for step in self.plan.mask_steps:
            start, n = sum(self.reveal_counts[:step]), self.reveal_counts[step]
            known = start + (n if post_step else 0)
            count = n if revealed_mode else self.num_tokens - known
            out.append(StepSlots(start, n, known, count, slice(column, column + R * count)))
            column += R * count
        return tuple(out)

    def effective_index(self, j: int) -> int:
        """The position of recorded mask step j among the schedule's effective (revealing) steps."""
        return sum(1 for n in self.reveal_counts[: self.plan.mask_steps[j]] if n > 0)

    def committed(self, j: int) -> torch.Tensor:
        """bool [B, N]: the tokens committed (revealed) at recorded mask step j."""
        slot = self.slots[j]
        mask = torch.zeros(self.order.shape, dtype=torch.bool, device=self.order.device)
        return mask.scatter_(1, self.order[:, slot.start : slot.start + slot.revealed], True)

    def l_slice(self, j: int) -> slice:
        """The slice of the L axis that holds recorded mask step j (its R x P_j transitions)."""
        return self.slots[j].columns

    # ------------------------------------------------------------------ derived per-step state
    def positions(self, j: int) -> torch.Tensor:
        """int64 [B, P_j]: the token positions of recorded step j, committed ones first."""
        slot = self.slots[j]
        return self.order[:, slot.known : slot.known + slot.count]

    def canvas_known(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(canvas [B, N, C], known bool [B, N]) of recorded mask step j's training forward: the state
        before the step (pre-step known mask) or after it (post-step)."""
        known = torch.zeros(self.order.shape, dtype=torch.bool, device=self.order.device)
        known.scatter_(1, self.order[:, : self.slots[j].known], True)
        canvas = torch.where(known[..., None], self.tokens, self.tokens.new_zeros(()))
        return canvas, known

    def columns(self, steps: Sequence[int] | None) -> torch.Tensor | slice:
        """The L-axis columns of the recorded mask steps `steps` (all when None), in their order."""
        if steps is None:
            return slice(None)
        parts = [torch.arange(self.slots[j].columns.start, self.slots[j].columns.stop) for j in steps]
        return torch.cat(parts).to(self.order.device) if parts else self.order.new_zeros(0)

    def l_positions(self) -> torch.Tensor:
        """int64 [B, L]: the token position of every recorded transition."""
        R = self.plan.num_diffusion_steps
        parts = [self.positions(j).repeat(1, R) for j in range(len(self.slots))]
        return torch.cat(parts, 1) if parts else self.order.new_zeros(self.batch_size, 0)

    def l_step(self) -> torch.Tensor:
        """int64 [L]: the recorded mask-step index j of every transition."""
        sizes = [slot.columns.stop - slot.columns.start for slot in self.slots]
        steps = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
        return steps.to(self.order.device)

    def l_committed(self) -> torch.Tensor:
        """bool [L]: True where the transition's token was committed at its mask step (all True in
        "revealed" mode, all False with the post-step known mask)."""
        parts = []
        post_step, R = self.config.known_mask == "post_step", self.plan.num_diffusion_steps
        for slot in self.slots:
            # the first n_j of step j's positions were committed at it (none with the post-step known mask)
            committed = 0 if post_step else slot.revealed
            parts.append((torch.arange(slot.count, device=self.order.device) < committed).repeat(R))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool, device=self.order.device)

    def expand_to_l(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position values [B, N, ...] or per-recorded-step values [B, M, N, ...] -> [B, L, ...]
        (e.g. an MTE top-k mask [B, N] or a consistency mask [B, M, N] as token weights of logp)."""
        B, N, M = self.batch_size, self.num_tokens, len(self.slots)
        if values.shape[:2] == (B, N):
            per_step = [values] * M
        elif values.dim() >= 3 and values.shape[:3] == (B, M, N):
            per_step = list(values.unbind(1))
        else:
            raise ValueError(f"values: got shape {tuple(values.shape)}, expected [B={B}, N={N}, ...] or [B, M={M}, N, ...]")
        parts = []
        for j, per_position in enumerate(per_step):
            index = self.positions(j).reshape(B, -1, *([1] * (per_position.dim() - 2)))
            picked = per_position.gather(1, index.expand(-1, -1, *per_position.shape[2:]))
            parts.append(picked.repeat(1, self.plan.num_diffusion_steps, *([1] * (per_position.dim() - 2))))
        return torch.cat(parts, 1) if parts else values.new_zeros(B, 0, *values.shape[2:])

    # ------------------------------------------------------------------ moving and slicing
    def _tensor_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    def to(self, device: torch.device | str) -> Rollout:
        """A copy with every tensor on `device`."""
        return dataclasses.replace(self, **{name: getattr(self, name).to(device) for name in self._tensor_fields()})

    def select(self, index) -> Rollout:
        """The images `index` (a slice, a list/tensor of indices or a bool mask over B): minibatching."""
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            if index.shape != (self.batch_size,):
                raise ValueError(f"index: got a bool mask of shape {tuple(index.shape)}, expected ({self.batch_size},)")
            index = index.nonzero().flatten()
        if isinstance(index, slice):
            rows = list(range(self.batch_size))[index]
        else:
            rows = [int(i) for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
        for i in rows:
            if not 0 <= i < self.batch_size:
                raise IndexError(f"index: got {i}, expected indices in [0, {self.batch_size})")
        rows_t = torch.tensor(rows, dtype=torch.long)
        fields = {}
        for name in self._tensor_fields():
            tensor = getattr(self, name)
            fields[name] = tensor.index_select(1 if name in TRAJECTORY_FIRST else 0, rows_t.to(tensor.device))
        return dataclasses.replace(self, prompts=[self.prompts[i] for i in rows], **fields)

    def with_update_values(
        self,
        *,
        old_logp: torch.Tensor | None = None,
        old_mean: torch.Tensor | None = None,
        ref_logp: torch.Tensor | None = None,
        ref_mean: torch.Tensor | None = None,
    ) -> Rollout:
        """A copy carrying the values a GRPO update scores against (see the class docstring); the
        ones given must have the shape of logp (old_mean, ref_mean: of mean), the ref values may
        have one trajectory (trajectory 0's: all the KL reads)."""
        given = {"old_logp": old_logp, "old_mean": old_mean, "ref_logp": ref_logp, "ref_mean": ref_mean}
        for name, value in given.items():
            like = self.mean if name.endswith("_mean") else self.logp
            if value is None or value.shape == like.shape or (name.startswith("ref_") and value.shape == (1, *like.shape[1:])):
                continue
            trajectories = "[T, B, L...] or [1, B, L...]" if name.startswith("ref_") else "[T, B, L...]"
            raise ValueError(f"{name}: got shape {tuple(value.shape)}, expected {tuple(like.shape)} {trajectories}")
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})

    def main_trajectory(self) -> Rollout:
        """The rollout with its own trajectory alone (T = 1): what scores a term that reads
        trajectory 0 only (the KL's ref policy; the whole loss without MTE), without the K seed
        trajectories' work."""
        per_transition = (*RECORDED, "old_logp", "old_mean", "ref_logp", "ref_mean")
        return dataclasses.replace(self, **{n: getattr(self, n)[:1] for n in per_transition if getattr(self, n) is not None})

    def chunk(self, images: Sequence[int], steps: Sequence[int] | None = None) -> RolloutChunk:
        """Images x recorded mask steps (all when None) of this rollout: a piece of a GRPO update."""
        return RolloutChunk(self, list(images), None if steps is None else list(steps))

    # ------------------------------------------------------------------ memory
    def nbytes(self) -> int:
        """Bytes held by this rollout's tensors."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, n) for n in self._tensor_fields()))

    @staticmethod
    def footprint(
        B: int, N: int, C: int, K: int, H: int, W: int, L: int, M: int, unknown_mode: bool, float_bytes: int = 4, post_step: bool = False
    ) -> int:
        """The memory formula of the class docstring, in bytes."""
        floats = N * C * (1 + K) + 3 * H * W + (K + 1) * L * (4 * C + 1) + (2 * M * N * C if unknown_mode else 0)
        floats += L * C if post_step else 0
        return 8 * B * (1 + N) + float_bytes * B * floats


@dataclass
class RolloutChunk:
    """Some images and some recorded mask steps of a rollout, with what the loss of that piece reads:
    the recorded (old) log-probs, std and reference values of its transitions, [T, b, l(, C)]."""

    source: Rollout
    images: list[int]
    steps: list[int] | None  # recorded mask-step indices j; None: all

    @functools.cached_property
    def rollout(self) -> Rollout:
        """The chunk's images (every recorded step): what the likelihood of the chunk evaluates."""
        return self.source.select(self.images)

    @functools.cached_property
    def _columns(self) -> torch.Tensor | slice:
        return self.source.columns(self.steps)

    def take(self, values: torch.Tensor) -> torch.Tensor:
        """Per-transition values of the whole rollout, [B, L] (masks, weights) or [T, B, L, ...]
        (log-probs, means), cut to this chunk's images and columns."""
        B, L = self.source.batch_size, self.source.num_transitions
        rows = torch.tensor(self.images, dtype=torch.long, device=values.device)
        if values.dim() == 2 and values.shape == (B, L):
            return values.index_select(0, rows)[:, self._columns]
        if values.dim() >= 3 and values.shape[1:3] == (B, L):
            return values.index_select(1, rows)[:, :, self._columns]
        raise ValueError(f"values: got shape {tuple(values.shape)}, expected [B={B}, L={L}] or [T, B, L, ...]")

    @property
    def old_logp(self) -> torch.Tensor:
        """[T, b, l]: the log-probs the ratio divides by (the recorded logp unless an update set old_logp)."""
        source = self.source
        return self.take(source.logp if source.old_logp is None else source.old_logp)

    @property
    def old_mean(self) -> torch.Tensor:
        """[T, b, l, C]: the means of the old policy's transitions (the recorded mean unless an update set old_mean)."""
        source = self.source
        return self.take(source.mean if source.old_mean is None else source.old_mean)

    @property
    def std(self) -> torch.Tensor:
        return self.take(self.source.std)

    @property
    def sampled_std(self) -> torch.Tensor | None:
        """[1, b, l, C]: trajectory 0's sampling-time std (post-step known mask only, else None)."""
        return None if self.source.sampled_std is None else self.take(self.source.sampled_std)

    @property
    def ref_logp(self) -> torch.Tensor | None:
        return None if self.source.ref_logp is None else self.take(self.source.ref_logp)

    @property
    def ref_mean(self) -> torch.Tensor | None:
        return None if self.source.ref_mean is None else self.take(self.source.ref_mean)

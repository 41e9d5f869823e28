"""RolloutConfig: every knob of the MAR generation loop and of what it records (typed, validated)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .schedule import SCHEDULES


@dataclass
class RolloutConfig:
    """Generation and recording settings.

    Generation: `num_mask_steps` S with the `schedule` variant; `num_diffusion_steps` T of the head's
    sampler (None: the model's default, backbone.make_sampler()); classifier-free guidance with
    `cfg_scale` (1.0 = off; 0 = unconditional), `cfg_schedule` "constant" or "linear" (MUSE/MAR:
    1 + (scale - 1) * revealed_after_step / N), `cfg_channels` "all" (NOVA) or "eps" (Harmon: guide
    only the first C output channels, variance from the conditional half), `negative_prompt`
    (None = the backbone's); `temperature` multiplies every diffusion step's std.

    Multi-trajectory expectation: `num_seeds` K extra diffusion trajectories per denoised token,
    sampled under the same z as the main one (trajectory 0) in one batched head pass.

    Recording for the likelihood: `record_mask_steps` effective mask steps and, in each,
    `record_diffusion_steps` stochastic diffusion steps, drawn before the rollout, among the steps
    start <= i < stop of `record_diffusion_range` (None: all; stop None: to the end; 0 = noisiest).
    Skipping step 0 matters for epsilon-prediction DDPM with a cosine schedule: its beta is clipped
    near 1, so the transition's mean is the eps prediction amplified about 30x, and its score
    dominates the gradient's variance while its sample barely shapes the image (docs/METHOD.md).
    `likelihood_positions` says which tokens of a recorded mask step enter the likelihood:
    "revealed" (default: the tokens actually sampled into the image at that step, an exact policy
    gradient) or "unknown" (the paper / reference code: every position still masked before the
    step; the head also samples the positions that stay masked, their samples are discarded from the
    image but their transitions are recorded, and the per-step predicted clean latents needed by
    consistency-aware selection are recorded; costs roughly N / n_i more head work at those steps).
    `known_mask` says which tokens a recorded step's likelihood treats as known (the canvas of its
    training forward): "pre_step" (default: those revealed at earlier steps, the state the step was
    sampled from, so the step's own tokens get gradient) or "post_step" (the reference Harmon code,
    for the parity preset: the step's own tokens are known too and get no gradient; the likelihood
    keeps only the positions still unknown after the step, their transitions sampled at the step and
    scored under the post-step canvas, the one the next mask step's forward sees). "post_step" needs
    likelihood_positions "unknown" whenever a likelihood is recorded: with "revealed" it would keep
    no position at all. A recorded final step leaves no position unknown and records nothing.
    """

    num_mask_steps: int = 64
    schedule: Literal["nova", "harmon"] = "nova"
    num_diffusion_steps: int | None = None
    cfg_scale: float = 1.0
    cfg_schedule: Literal["constant", "linear"] = "constant"
    cfg_channels: Literal["all", "eps"] = "all"
    negative_prompt: str | None = None
    temperature: float = 1.0
    num_seeds: int = 0
    record_mask_steps: int = 12
    record_diffusion_steps: int = 10
    record_diffusion_range: tuple[int | None, ...] | None = None  # (start, stop)
    likelihood_positions: Literal["revealed", "unknown"] = "revealed"
    known_mask: Literal["pre_step", "post_step"] = "pre_step"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"{name}: got {getattr(self, name)!r}, expected {expected}")

        need(isinstance(self.num_mask_steps, int) and self.num_mask_steps >= 1, "num_mask_steps", "an integer >= 1")
        need(self.schedule in SCHEDULES, "schedule", f"one of {', '.join(SCHEDULES)}")
        steps = self.num_diffusion_steps
        need(steps is None or (isinstance(steps, int) and steps >= 1), "num_diffusion_steps", "None or an integer >= 1")
        need(isinstance(self.cfg_scale, (int, float)) and self.cfg_scale >= 0, "cfg_scale", "a number >= 0")
        need(self.cfg_schedule in ("constant", "linear"), "cfg_schedule", "'constant' or 'linear'")
        need(self.cfg_channels in ("all", "eps"), "cfg_channels", "'all' or 'eps'")
        need(self.negative_prompt is None or isinstance(self.negative_prompt, str), "negative_prompt",
             "a string or None")
        need(isinstance(self.temperature, (int, float)) and self.temperature > 0, "temperature", "a number > 0")
        need(isinstance(self.num_seeds, int) and self.num_seeds >= 0, "num_seeds", "an integer >= 0")
        need(isinstance(self.record_mask_steps, int) and self.record_mask_steps >= 0, "record_mask_steps",
             "an integer >= 0")
        need(isinstance(self.record_diffusion_steps, int) and self.record_diffusion_steps >= 1,
             "record_diffusion_steps", "an integer >= 1")
        window = self.record_diffusion_range
        need(window is None or (isinstance(window, (tuple, list)) and len(window) == 2
                                and isinstance(window[0], int) and window[0] >= 0
                                and (window[1] is None or (isinstance(window[1], int) and window[1] > window[0]))),
             "record_diffusion_range", "null or [start, stop] with integers 0 <= start < stop (stop null: to the end)")
        if window is not None:
            self.record_diffusion_range = (window[0], window[1])
        need(self.likelihood_positions in ("revealed", "unknown"), "likelihood_positions", "'revealed' or 'unknown'")
        need(self.known_mask in ("pre_step", "post_step"), "known_mask", "'pre_step' or 'post_step'")
        if self.record_mask_steps > 0:
            self.check_recordable()

    def check_recordable(self) -> None:
        """Raise if these settings cannot form a likelihood for a recorded mask step. Checked when
        record_mask_steps > 0 (and by generate for an explicit plan): a config that records nothing,
        e.g. an evaluation copy with likelihood_positions "revealed", may keep known_mask "post_step"."""
        if self.known_mask == "post_step" and self.likelihood_positions != "unknown":
            raise ValueError(
                f"known_mask: got 'post_step' with likelihood_positions {self.likelihood_positions!r}, expected "
                "likelihood_positions 'unknown' (post_step keeps only the positions still unknown after a step, "
                "and 'revealed' has none of those) or known_mask 'pre_step'"
            )

    def generation_only(self) -> "RolloutConfig":
        """The same sampling policy recording nothing (no seed chains, no transitions): the cheapest
        rollout, for sampling and evaluation."""
        return dataclasses.replace(self, num_seeds=0, record_mask_steps=0, record_diffusion_steps=1,
                                   likelihood_positions="revealed")

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    def cfg_scale_at(self, revealed_after: int, num_tokens: int) -> float:
        """The guidance scale of a mask step after which `revealed_after` of `num_tokens` are known."""
        if self.cfg_schedule == "constant":
            return float(self.cfg_scale)
        return 1.0 + (self.cfg_scale - 1.0) * revealed_after / num_tokens

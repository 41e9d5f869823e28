"""Classifier-free guidance for the diffusion heads.

Convention (MAR): the condition z holds [cond; uncond] rows (2N); both halves see the same x_t.
guided = uncond + scale * (cond - uncond), on every output channel (NOVA) or on the first C "eps"
channels only, the remaining learned-variance channels taken from the cond half (Harmon / MAR).

The scale may follow a schedule over the mask steps; the caller evaluates it (`scale_at`) and
passes the scale for the current call (`at`), because the progress variable belongs to the rollout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

CHANNELS = ("all", "eps")
SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class Guidance:
    """CFG settings.

    scale: the guidance scale (at the end of the schedule for `linear`).
    channels: "all" (NOVA) or "eps" (Harmon: guide the first C channels, variance from cond).
    schedule: "constant", or "linear" from `start_scale` at progress 0 to `scale` at progress 1
        (MAR/Harmon: start 1, progress = known tokens after the step / N; NOVA: start = its
        min_guidance_scale, progress = (mask step + 1) / steps).
    """

    scale: float
    channels: str = "all"
    schedule: str = "constant"
    start_scale: float = 1.0

    def __post_init__(self):
        if not isinstance(self.scale, (int, float)) or self.scale < 0:
            raise ValueError(f"scale: got {self.scale!r}, expected a number >= 0")
        if self.channels not in CHANNELS:
            raise ValueError(f"channels: got {self.channels!r}, expected one of {', '.join(CHANNELS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {self.schedule!r}, expected one of {', '.join(SCHEDULES)}")

    def scale_at(self, progress: float) -> float:
        """The scheduled scale at `progress` in [0, 1]."""
        if not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress: got {progress}, expected a value in [0, 1]")
        if self.schedule == "constant":
            return float(self.scale)
        return float(self.start_scale + (self.scale - self.start_scale) * progress)

    def at(self, progress: float) -> "Guidance":
        """These settings with the scheduled scale at `progress` fixed as a constant (one head call)."""
        return dataclasses.replace(self, scale=self.scale_at(progress), schedule="constant")

    def combine(self, cond: torch.Tensor, uncond: torch.Tensor, eps_channels: int, scale: torch.Tensor | None = None) -> torch.Tensor:
        """Guided output from the cond/uncond head outputs [..., out]; eps_channels = C. scale: this
        scale as a 0-d tensor (a compiled caller's: a tensor is a graph input, a number a constant)."""
        if cond.shape != uncond.shape:
            raise ValueError(f"cond/uncond: got shapes {tuple(cond.shape)} and {tuple(uncond.shape)}, expected equal")
        weight = self.scale if scale is None else scale
        if self.channels == "all" or cond.shape[-1] == eps_channels:
            return uncond + weight * (cond - uncond)
        eps = uncond[..., :eps_channels] + weight * (cond[..., :eps_channels] - uncond[..., :eps_channels])
        return torch.cat([eps, cond[..., eps_channels:]], dim=-1)

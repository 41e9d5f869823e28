"""Classifier-free guidance plumbing shared by generation and the training likelihood.

With guidance the backbone runs on 2B rows, [cond; uncond], the uncond rows with the negative prompt
and the SAME canvas as their image (the reference Harmon code lets the uncond canvas lag one step
behind; here both halves always see the same state). The head receives z as [cond rows; uncond rows]
(MAR convention) and mixes its outputs with the step's scale on the configured channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.heads import Guidance
from margrpo.models.base import PromptBatch

from .config import RolloutConfig


@dataclass
class PromptRows:
    """Encoded prompts for the backbone: B rows, or 2B rows [cond; uncond] under guidance."""

    batch: PromptBatch
    rows_per_image: int  # 1 without guidance, 2 with it


def prompt_rows(backbone, prompts: list[str], config: RolloutConfig, guided: bool | None = None) -> PromptRows:
    """Encode `prompts` (and, when guided, the negative prompt once per image) for forward_z.
    guided=None follows config.uses_cfg."""
    guided = config.uses_cfg if guided is None else guided
    cond = backbone.encode_prompts(prompts)
    if not guided:
        return PromptRows(cond, 1)
    negative = backbone.negative_prompt() if config.negative_prompt is None else config.negative_prompt
    uncond = backbone.encode_prompts([negative]).repeat_interleave(len(prompts))
    return PromptRows(cond.cat(uncond), 2)


def forward_rows(backbone, rows: PromptRows, canvas: torch.Tensor, known: torch.Tensor, known_count: int) -> torch.Tensor:
    """backbone.forward_z for every prompt row, each image's canvas [B, N, C] / known [B, N] (known_count
    positions known in every row) repeated for its cond and uncond rows -> z [rows_per_image * B, N, Dz]."""
    repeat = rows.rows_per_image
    return backbone.forward_z(rows.batch, canvas.repeat(repeat, 1, 1), known.repeat(repeat, 1), known_count)


def head_condition(z: torch.Tensor, rows: PromptRows, positions: torch.Tensor) -> torch.Tensor:
    """forward_z output [rows_per_image * B, N, Dz] at positions [B, P] -> the head's condition rows
    [B * P, Dz], or [2 * B * P, Dz] = [cond; uncond] under guidance."""
    B, P = positions.shape
    index = positions[..., None].expand(-1, -1, z.shape[-1])
    return torch.cat([half.gather(1, index).reshape(B * P, z.shape[-1]) for half in z.chunk(rows.rows_per_image)])


def condition_at(condition: torch.Tensor, tokens: torch.Tensor, count: int) -> torch.Tensor:
    """head_condition's rows for `count` tokens ([count, Dz], or [2 * count, Dz] = [cond; uncond]) at
    token indices `tokens` [n] -> [n, Dz] (or [2n, Dz], still [cond; uncond])."""
    if condition.shape[0] == count:
        return condition[tokens]
    return torch.cat([condition[tokens], condition[count + tokens]])


def guidance_for(config: RolloutConfig, scale: float, guided: bool | None = None):
    """The head's guidance setting for one mask step (None when unguided)."""
    guided = config.uses_cfg if guided is None else guided
    if not guided:
        return None
    return Guidance(scale=scale, channels=config.cfg_channels)

"""The protocol every MAR backbone implements so the shared rollout loop and trainer can drive it.

A MAR backbone turns a prompt and a partially known token canvas into one condition vector z per
token position; its diffusion head (margrpo.heads) turns z into token values. The rollout loop owns
the mask schedule, order, CFG and recording; the backbone owns text encoding, the transformer and
decoding tokens to pixels.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from margrpo.conformance import protocol_mismatches
from margrpo.heads.protocol import DiffusionHead


@dataclass
class PromptBatch:
    """Encoded prompts: embeds [B, L, D] and a bool mask [B, L] (True = real token)."""

    embeds: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def cat(self, other: "PromptBatch") -> "PromptBatch":
        """Rows of self then rows of other (e.g. [cond; uncond] for CFG), padded to the longer L."""
        length = max(self.embeds.shape[1], other.embeds.shape[1])
        a, b = self.padded(length), other.padded(length)
        return PromptBatch(torch.cat([a.embeds, b.embeds]), torch.cat([a.mask, b.mask]))

    def padded(self, length: int) -> "PromptBatch":
        extra = length - self.embeds.shape[1]
        if extra <= 0:
            return self
        embeds = torch.nn.functional.pad(self.embeds, (0, 0, 0, extra))
        mask = torch.nn.functional.pad(self.mask, (0, extra), value=False)
        return PromptBatch(embeds, mask)

    def repeat_interleave(self, n: int) -> "PromptBatch":
        return PromptBatch(self.embeds.repeat_interleave(n, 0), self.mask.repeat_interleave(n, 0))


@runtime_checkable
class MARBackbone(Protocol):
    """What the rollout loop (margrpo.rollout) and the trainer need from a model. Implementations
    are nn.Modules (the trainer also uses train/eval, named_parameters and requires_grad_)."""

    num_tokens: int  # N: token positions per image
    token_channels: int  # C: channels per token (the head's data width)
    head: DiffusionHead  # the diffusion head (an nn.Module), frozen during GRPO by default

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The rollout reads the device and float dtype from the first parameter."""

    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        """Text -> PromptBatch. Unknown words / empty prompts raise ValueError naming them."""

    def negative_prompt(self) -> str:
        """The unconditional prompt used for CFG ("" for NOVA, "Generate an image." for Harmon)."""

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        """canvas [B, N, C] (values at known positions; anything elsewhere), known bool [B, N]
        -> z [B, N, Dz], the head's condition for every position.

        known is True where a token is already generated: the inverse of LTH14/mar's `mask` (True =
        still to predict), so MAR's forward_mae(tokens, mask) is forward_z(..., canvas, ~known).
        prompts holds 2B rows ([cond; uncond]) when the rollout guides, as MAR's CFG batch.

        known_count: the number of known positions, the same in every row, when the caller knows it
        on the host (the rollout and the likelihood do): a backbone whose shapes depend on it then
        needs no device-to-host read of `known` (a sync per mask step on a GPU). Trusted, not checked."""

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N, C] -> images float [B, 3, H, W] in [0, 1]."""

    def make_sampler(self, num_steps: int | None = None):
        """The head's diffusion sampler (margrpo.diffusion) with `num_steps` steps (None: the model's
        default), built from the checkpoint's own scheduler settings."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters GRPO updates by default (the head excluded: it is frozen)."""


_CONFORMING: weakref.WeakSet = weakref.WeakSet()  # backbones already checked (the rollout checks every call)


def check_backbone(backbone, argument: str = "backbone"):
    """`backbone` itself, after checking that it implements MARBackbone (every member, the methods'
    parameter names) and that its head implements DiffusionHead: a TypeError naming each missing or
    mismatched member, at the call that passes the backbone in, instead of an AttributeError in the
    middle of a rollout. Checked once per object."""
    try:
        if backbone in _CONFORMING:
            return backbone
    except TypeError:  # not weak-referenceable: checked every time
        pass
    problems = protocol_mismatches(backbone, MARBackbone)
    if not problems:
        problems = [f"head.{p}" for p in protocol_mismatches(backbone.head, DiffusionHead)]
    if problems:
        raise TypeError(
            f"{argument}: {type(backbone).__name__} does not implement margrpo.models.MARBackbone: "
            + "; ".join(problems)
            + " (docs/USING.md, 'Your transformer as a MARBackbone'; a head from "
            "another codebase: margrpo.heads.adapt)"
        )
    try:
        _CONFORMING.add(backbone)
    except TypeError:
        pass
    return backbone

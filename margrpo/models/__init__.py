"""MAR backbones behind one protocol (margrpo.models.base.MARBackbone), and the `model:` config section.

    TinyMAR / TinyMARConfig   the tiny ShapesWorld model (margrpo.models.tiny); TinyMAR.load(dir)
    ModelConfig, load_model   build the backbone a config's `model:` section names
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .base import MARBackbone, PromptBatch
from .tiny import TinyMAR, TinyMARConfig


@dataclass
class ModelConfig:
    """The `model:` section of a config.

    kind: the backbone family ("tiny" = the ShapesWorld TinyMAR).
    path: the checkpoint directory that sampling and training load (and that pretraining writes).
    arch: the architecture pretraining builds from scratch; a loaded checkpoint brings its own
        (its config.json), so `arch` is ignored when loading.
    """

    kind: Literal["tiny"] = "tiny"
    path: str = "checkpoints/shapes-tiny"
    arch: TinyMARConfig = field(default_factory=TinyMARConfig)


def load_model(config: ModelConfig, device: str = "cpu") -> MARBackbone:
    """The backbone stored at config.path, in eval mode on `device`."""
    if config.kind != "tiny":
        raise ValueError(f"model.kind: got {config.kind!r}, expected 'tiny'")
    return TinyMAR.load(config.path, map_location=device).eval()


__all__ = ["MARBackbone", "ModelConfig", "PromptBatch", "TinyMAR", "TinyMARConfig", "load_model"]

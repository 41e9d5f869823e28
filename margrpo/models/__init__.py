"""MAR backbones behind one protocol (margrpo.models.base.MARBackbone), the `backbone:` config
section and the registry that loads it.

    TinyMAR / TinyMARConfig            the tiny ShapesWorld model (margrpo.models.tiny)
    nova, harmon                       the NOVA and Harmon families (import margrpo.models.nova / .harmon)
    BackboneConfig, load_backbone      load the backbone a config's `backbone:` section names
    register_backbone, available_backbones   add a family of your own / list the registered names
"""

from __future__ import annotations

from .base import MARBackbone, PromptBatch
from .config import BackboneConfig, check_no_model_section
from .registry import available_backbones, backbone_loader, load_backbone, register_backbone, resolve_device
from .tiny import TinyMAR, TinyMARConfig

__all__ = [
    "BackboneConfig",
    "MARBackbone",
    "PromptBatch",
    "TinyMAR",
    "TinyMARConfig",
    "available_backbones",
    "backbone_loader",
    "check_no_model_section",
    "load_backbone",
    "register_backbone",
    "resolve_device",
]

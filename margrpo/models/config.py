"""The `backbone:` config section: which MAR model to load and from where. Training, sampling,
evaluation and pretraining all read it (margrpo.models.registry.load_backbone loads it).

An earlier layout had a second section, `model:` (kind, path, arch), for sampling and pretraining;
`check_no_model_section` turns it into an error that names the new keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from margrpo.config import ConfigError

from .registry import available_backbones

MOVED_MODEL_KEYS = {"kind": "backbone.name", "path": "backbone.checkpoint", "arch": "pretrain.arch"}


@dataclass
class BackboneConfig:
    """name: a registered backbone (margrpo.models.available_backbones(): tiny, nova, harmon, ...).
    checkpoint: a local directory in the model's official layout, or `builtin:NAME` for a checkpoint
    shipped inside the package (margrpo.checkpoints); pretraining writes here unless pretrain.out."""

    name: str = "tiny"
    checkpoint: str = "builtin:shapes-tiny"
    diffusion_steps: Optional[int] = None  # sampling steps of the head's chain (None: the model's default)
    dtype: Literal["float32", "bfloat16"] = "float32"
    options: dict[str, Any] = field(default_factory=dict)  # model-specific load() flags (e.g. parity forwards)

    def __post_init__(self) -> None:
        if self.name not in available_backbones():
            registered = ", ".join(available_backbones())
            raise ValueError(f"name: got {self.name!r}, expected a registered backbone: {registered}")


def check_no_model_section(data: dict) -> None:
    """Reject the retired `model:` section of a config mapping, naming where each key went."""
    if "model" not in data:
        return
    moved = "; ".join(f"model.{old} -> {new}" for old, new in MOVED_MODEL_KEYS.items())
    raise ConfigError(f"config section 'model' was folded into 'backbone' (and 'pretrain'): {moved}")

"""Per-image metadata of T2I-CompBench-style prompts, as the GIT VQA and GroundingDINO rewards read it.

One dict per image (the T2I-R1 / MAR-GRPO training files use these keys):
  task_type      'color' | 'shape' | 'texture' | 'spatial' | 'numeracy' | 'complex' | ... (default 'object')
  nouns          objects the prompt names, e.g. ["cat", "red car"]
  attr_nouns     attribute phrases to ask the VQA model about, e.g. ["a red car"] (optional)
  spatial_info   {"obj1": str, "obj2": str, "locality": str}: "obj1 <locality> obj2" (spatial tasks)
  numeracy_info  [{"obj_name": str, "num": int}, ...] (numeracy tasks)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SpatialInfo:
    obj1: str
    obj2: str
    locality: str


@dataclass(frozen=True)
class CompBenchItem:
    """The validated metadata of one image."""

    task_type: str = "object"
    nouns: tuple[str, ...] = ()
    attr_nouns: tuple[str, ...] | None = None
    spatial: SpatialInfo | None = None
    counts: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], index: int) -> "CompBenchItem":
        """Parse metadata[index]; a wrong type is an error naming the key and what was expected."""
        where = f"metadata[{index}]"

        def strings(key: str) -> tuple[str, ...] | None:
            value = meta.get(key)
            if value is None:
                return None
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{where}[{key!r}]: got {value!r}, expected a list of strings")
            return tuple(value)

        task = meta.get("task_type", "object")
        if not isinstance(task, str):
            raise TypeError(f"{where}['task_type']: got {task!r}, expected a string")
        spatial = None
        if meta.get("spatial_info") is not None:
            info = meta["spatial_info"]
            if not isinstance(info, dict) or not {"obj1", "obj2", "locality"} <= set(info):
                raise TypeError(f"{where}['spatial_info']: got {info!r}, expected a dict with obj1, obj2, locality")
            spatial = SpatialInfo(str(info["obj1"]), str(info["obj2"]), str(info["locality"]))
        counts = []
        for item in meta.get("numeracy_info") or []:
            if not isinstance(item, dict) or "obj_name" not in item or "num" not in item:
                raise TypeError(f"{where}['numeracy_info']: got entry {item!r}, expected a dict with obj_name, num")
            counts.append((str(item["obj_name"]), int(item["num"])))
        return cls(task_type=task, nouns=strings("nouns") or (), attr_nouns=strings("attr_nouns"), spatial=spatial, counts=tuple(counts))

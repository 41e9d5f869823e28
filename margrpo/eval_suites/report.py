"""A suite's result: a score per category plus "overall", the images behind each, a table and JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SuiteReport:
    """scores: {category: score in [0, 1], ..., "overall": ...}; images: {category: images scored};
    details: per image records (prompt, tag, correct, why) where the suite has them."""

    suite: str
    scores: dict[str, float]
    images: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        width = max(len("category"), *(len(k) for k in self.scores))
        lines = [f"{self.suite}: {'category':<{width}}  score  images"]
        indent = " " * (len(self.suite) + 2)
        for key, value in self.scores.items():
            lines.append(f"{indent}{key:<{width}}  {value:.3f}  {self.images.get(key, 0):>6}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "scores": self.scores, "images": self.images, "settings": self.settings, "details": self.details}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

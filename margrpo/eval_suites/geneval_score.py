"""GenEval-style correctness of one image from its detections, and the per-category summary.

An image is correct when every requirement of its prompt's metadata (margrpo.prompt_files) holds:
  objects   each class is detected; an object of count n > 1 exactly n times ("three cups": not two,
            not four), of count 1 at least once (an extra one is tolerated, as in GenEval);
  color     the colour found on the class's most confident box is the one asked;
  position  "subject <relation> object": the centre of the subject's most confident box lies on that
            side of the object's by more than `margin` (a fraction of the image side) along the
            relation's axis (x for left of / right of, y downwards for above / below).
The summary is GenEval's: the accuracy per category (tag), and overall = the mean of the categories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AXES = {"left of": (0, -1.0), "right of": (0, 1.0), "above": (1, -1.0), "below": (1, 1.0)}


@dataclass(frozen=True)
class Box:
    """A detection: corners in image-normalised coordinates (y down), its confidence, and the colour
    read from it (None where no colour was asked)."""

    x1: float
    y1: float
    x2: float
    y2: float
    score: float
    color: str | None = None

    @property
    def center(self) -> tuple[float, float]:
        return (self.x1 + self.x2) / 2, (self.y1 + self.y2) / 2


def relation_holds(relation: str, subject: Box, reference: Box, margin: float = 0.05) -> bool:
    """Whether subject's centre lies `relation` of reference's centre, by more than margin."""
    if relation not in AXES:
        raise ValueError(f"position['relation']: got {relation!r}, expected one of {', '.join(AXES)}")
    axis, sign = AXES[relation]
    offset = subject.center[axis] - reference.center[axis]
    return offset * sign > margin


def judge(meta: dict[str, Any], found: dict[str, list[Box]], margin: float = 0.05) -> tuple[bool, str]:
    """(correct, why) of one image; `found` maps each class to its detections (after suppression of
    duplicates), most confident first. `why` names the first requirement that failed ("" if none)."""
    for obj in meta.get("objects", []):
        name, count = obj["class"], obj.get("count", 1)
        boxes = found.get(name, [])
        if not boxes:
            return False, f"no {name}"
        if count > 1 and len(boxes) != count:
            return False, f"{len(boxes)} {name} (asked {count})"
        if "color" in obj and boxes[0].color != obj["color"]:
            return False, f"{name} is {boxes[0].color} (asked {obj['color']})"
    position = meta.get("position")
    if position is not None:
        subject, reference = found[position["subject"]][0], found[position["object"]][0]
        if not relation_holds(position["relation"], subject, reference, margin):
            return False, f"{position['subject']} not {position['relation']} {position['object']}"
    return True, ""


def summarize(tags: list[str], correct: list[bool]) -> tuple[dict[str, float], dict[str, int]]:
    """({category: accuracy, ..., "overall": mean of the categories}, {category: images, "overall": all})."""
    if len(tags) != len(correct):
        raise ValueError(f"tags: got {len(tags)} for {len(correct)} results, expected one per image")
    scores, counts = {}, {}
    for tag in dict.fromkeys(tags):
        hits = [c for t, c in zip(tags, correct) if t == tag]
        scores[tag], counts[tag] = sum(hits) / len(hits), len(hits)
    scores["overall"] = sum(scores.values()) / len(scores) if scores else float("nan")
    counts["overall"] = len(tags)
    return scores, counts

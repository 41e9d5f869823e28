"""T2I-CompBench's scoring rules, on answers, detections and depths already computed (no model here).

Facts from the benchmark's evaluation scripts (Karine-Huang/T2I-CompBench), restated:
  attribute binding (BLIP-VQA)  each noun phrase of the prompt is asked as "<phrase>?"; the image's
        score is the product of P(yes) over its first 8 phrases (1 with none).
  2D spatial (UniDet)  the locality is the first of LOCALITY_2D found in the prompt; each object's
        most confident box; score = 0.25 conf1 + 0.25 conf2 + position / 2 with both found, 0.25 conf
        with one, 0 with none, and any score below 0.5 set to 0. Position (box centres, y down):
        left / right / top / bottom need the offset mostly along that axis and score 1, or
        0.1 / IoU when the boxes overlap by IoU >= 0.1; near / next to / on side of score 1 when
        either offset is under 150 pixels, else 150 / the larger offset. Any other locality scores 0
        (the scripts' "on top of", used by some complex prompts, among them).
  3D spatial (UniDet + depth)  "in front of", "behind" or "hidden" (first found); the same 0.25 /
        0.25 / position / 2 sum without the 0.5 cut; position from the mean depth (inverse depth:
        larger is nearer) inside each box: in front of = box 1 nearer, behind / hidden = farther,
        scoring 1 when the boxes overlap by IoU > 0.5, IoU / 0.5 when they overlap less, 0 without
        overlap or on the wrong side.
  numeracy (UniDet)  objects are read from "<number word> <object>" with the object (one or two
        words) in new_objects.txt; detections of a class closer than IoU 0.9 (or one 90% inside the
        other) count once; per object (weight 1 / objects): 0.5 when detected, + 0.5 when detected
        exactly as many times as asked.
  non-spatial (CLIP ViT-B/32)  cosine similarity of the image and the prompt.
  complex (3-in-1)  the mean of attribute and spatial (for complex_val_spatial.txt prompts), of
        attribute and action = CLIP on the prompt without adjectives (complex_val_action.txt), or of
        all three; complex prompts' spatial objects are the nouns around the relation phrase.
Distances are in pixels of the benchmark's 512-pixel images; boxes here are image-normalised, so the
150-pixel threshold is 150 / 512 of the image side (identical at 512 pixels).
"""

from __future__ import annotations

from collections.abc import Sequence

from .geneval_score import Box

MAX_PHRASES = 8
LOCALITY_2D = ("on side of", "next to", "near", "on the left of", "on the right of", "on the bottom of", "on the top of", "on top of")
LOCALITY_3D = ("in front of", "behind", "hidden")
NEAR = ("next to", "on side of", "near")
NEAR_DISTANCE = 150 / 512
SPATIAL_CUT = 0.5
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
SINGLE = ("a", "an", "one")


def attribute_score(p_yes: Sequence[float]) -> float:
    """BLIP-VQA score of one image from P(yes) of its noun-phrase questions, in prompt order."""
    score = 1.0
    for p in list(p_yes)[:MAX_PHRASES]:
        score *= float(p)
    return score


def first_locality(prompt: str, vocabulary: Sequence[str]) -> str | None:
    """The first word of `vocabulary` (in its order) that the lowercased prompt contains."""
    text = prompt.lower()
    return next((word for word in vocabulary if word in text), None)


def box_iou(a: Box, b: Box) -> float:
    w = max(0.0, min(a.x2, b.x2) - max(a.x1, b.x1))
    h = max(0.0, min(a.y2, b.y2) - max(a.y1, b.y1))
    inter = w * h
    union = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter
    return inter / union if union > 0 else 0.0


def position_2d(locality: str | None, box1: Box, box2: Box, iou_threshold: float = 0.1, near_distance: float = NEAR_DISTANCE) -> float:
    """How well box1 stands `locality` of box2, in [0, 1] (the rule in the module docstring)."""
    dx = box2.center[0] - box1.center[0]
    dy = box2.center[1] - box1.center[1]
    if locality in NEAR:
        if abs(dx) < near_distance or abs(dy) < near_distance:
            return 1.0
        return near_distance / max(abs(dx), abs(dy))
    # (offset along the relation's axis, across it, the sign the offset must have)
    axes = {"on the left of": (dx, dy, 1), "on the right of": (dx, dy, -1), "on the top of": (dy, dx, 1), "on the bottom of": (dy, dx, -1)}
    if locality not in axes:
        return 0.0
    along, across, sign = axes[locality]
    if along * sign <= 0 or abs(along) <= abs(across):
        return 0.0
    iou = box_iou(box1, box2)
    return 1.0 if iou < iou_threshold else iou_threshold / iou


def position_3d(locality: str | None, box1: Box, box2: Box, depth1: float, depth2: float, iou_threshold: float = 0.5) -> float:
    """3D relation of box1 to box2 from their mean inverse depths (larger = nearer), in [0, 1]."""
    if locality == "in front of":
        right_side = depth1 - depth2 > 0
    elif locality in ("behind", "hidden"):
        right_side = depth1 - depth2 < 0
    else:
        return 0.0
    iou = box_iou(box1, box2)
    if not right_side or iou <= 0:
        return 0.0
    return 1.0 if iou > iou_threshold else iou / iou_threshold


def pair_score(box1: Box | None, box2: Box | None, position: float, cut: float = 0.0) -> float:
    """0.25 conf1 + 0.25 conf2 + position / 2 with both boxes, 0.25 conf of the one found, 0 with none;
    a score below `cut` counts 0 (2D spatial: 0.5; 3D: no cut)."""
    if box1 is not None and box2 is not None:
        score = 0.25 * box1.score + 0.25 * box2.score + position / 2
    elif box1 is not None or box2 is not None:
        score = 0.25 * (box1 or box2).score
    else:
        score = 0.0
    return 0.0 if score < cut else score


def numeracy_objects(prompt: str, objects: dict[str, str]) -> list[tuple[str, int]]:
    """(object, count) asked by a numeracy prompt. objects: new_objects.txt's singular and plural
    forms -> singular. Words are split on spaces and punctuation, where the scripts use spaCy's
    tokenizer (the same words on the benchmark's numeracy prompts)."""
    import re

    words = re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", prompt.lower())
    singulars = set(objects.values())
    found = []
    for i, word in enumerate(words):
        if word not in NUMBER_WORDS or i + 1 >= len(words):
            continue
        two = " ".join(words[i + 1 : i + 3]) if i + 2 < len(words) else None
        if two is not None and two in objects:
            plural_asked = two not in singulars and word not in SINGLE
            found.append((objects[two], NUMBER_WORDS[word] if plural_asked else 1))
        elif words[i + 1] in objects:
            one = words[i + 1]
            single = one in singulars and word in SINGLE
            found.append((objects[one], 1 if single else NUMBER_WORDS[word]))
    return found


def same_object(a: Box, b: Box, pixel: float) -> bool:
    """Whether two detections of a class are one object: IoU > 0.9 or either box 90% inside the other
    (areas measured with the scripts' +1 pixel; `pixel` is one pixel in normalised units)."""
    w = max(0.0, min(a.x2, b.x2) - max(a.x1, b.x1) + pixel)
    h = max(0.0, min(a.y2, b.y2) - max(a.y1, b.y1) + pixel)
    inter = w * h
    area_a = (a.x2 - a.x1 + pixel) * (a.y2 - a.y1 + pixel)
    area_b = (b.x2 - b.x1 + pixel) * (b.y2 - b.y1 + pixel)
    return inter / (area_a + area_b - inter) > 0.9 or inter / area_a > 0.9 or inter / area_b > 0.9


def distinct(boxes: Sequence[Box], pixel: float) -> list[Box]:
    """The boxes left when each is dropped that is the same object as an earlier kept one."""
    kept: list[Box] = []
    for box in boxes:
        if not any(same_object(box, k, pixel) for k in kept):
            kept.append(box)
    return kept


def numeracy_score(asked: Sequence[tuple[str, int]], found: dict[str, Sequence[Box]], pixel: float) -> float:
    """Numeracy score of one image: per asked object 0.5 when detected, + 0.5 when its distinct
    detections number the count asked; averaged over the objects (0 when none was parsed)."""
    if not asked:
        return 0.0
    score = 0.0
    for name, count in asked:
        boxes = distinct(found.get(name, []), pixel)
        if boxes:
            score += 0.5 + (0.5 if len(boxes) == count else 0.0)
    return score / len(asked)


def three_in_one(parts: Sequence[str], attribute: float, spatial: float, action: float) -> float:
    """The complex score: the mean of the named parts (attribute, spatial, action)."""
    values = {"attribute": attribute, "spatial": spatial, "action": action}
    return sum(values[p] for p in parts) / len(parts)

"""The exact ShapesWorld verifier: parse images into objects and score them against their prompts.

Parsing: every pixel takes the nearest of the palette colors or the black background; each color's
pixels are split into 8-connected components (label propagation by 3x3 max-pooling plus pointer
jumping, batched over images and colors; 64 images take 0.05-0.1 s on one core). A component is
an object only if it looks like one: at least MIN_AREA pixels (at 32x32, scaled with the image
area), a bounding box at least MIN_SIDE pixels wide and high with an aspect ratio within MAX_ASPECT,
and a fill ratio of at least MIN_FILL (rendered shapes fill 0.57 to 1 of their box; speckle and noise
blobs are thin or ragged). A component's shape is the nearest prototype in (fill ratio = area /
bounding-box area, vertical asymmetry = how far below the box middle its centroid lies): squares
fill their box, circles about 0.8 of it, upward triangles about 0.6 with a low centroid.

Scores, each a float tensor [B] in [0, 1]:
  color    mean over the colors the prompt names of min(#objects of that color, #asked) / #asked
  shape    mean over the shapes the prompt names of min(#objects of that shape, #asked) / #asked
  count    mean over the prompt's (color, shape) groups of [#objects with both == #asked], together
           with one more check: [#objects in the image == #objects asked] (so extra objects count)
  spatial  spatial prompts: 1 if some object matching the first phrase and some object matching the
           second satisfy the relation (centroids at least RELATION_MARGIN pixels apart along its
           axis), else 0. Prompts without a relation score 1 here (nothing to violate).
  overall  mean of the categories that apply: color, shape, count, and spatial for spatial prompts.
`applicable` says which categories a prompt exercises; `evaluate` averages each score only over the
prompts it applies to, plus "exact" = the fraction of images that satisfy their prompt completely.

Partial credit (`score(..., partial_credit=True)`, a training reward, never the evaluation): the
exact scores move only when a component crosses a threshold, so most small changes of an image leave
them unchanged. With partial credit every component carries a quality in [0, 1] instead of pass/fail:
1 where it passes the object tests, falling linearly to 0 over a margin below each threshold (area
from MIN_AREA to half of it, side from MIN_SIDE to 1 pixel, aspect from MAX_ASPECT to twice it, fill
from MIN_FILL to MIN_FILL - FILL_MARGIN), the product over the tests; and a shape distribution (a
softmax over the prototype distances, width SHAPE_SOFTNESS) instead of the nearest prototype. Counts
become sums of quality x shape probability, presence scores use them as they are, and a count check
scores 1 - |found - asked| (at least 0), which is the exact check on integer counts. Spatial stays
exact (objects of quality 1). On cleanly rendered scenes both modes agree (tests/test_testbed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .grammar import SceneSpec, parse_prompt
from .world import BACKGROUND_RGB, COLOR_NAMES, COLORS, IMAGE_SIZE, RELATIONS, SHAPES

MIN_AREA = 16  # pixels at 32x32 (the smallest rendered shape has 31)
MIN_SIDE = 3  # pixels: thinner components are noise, not objects
MAX_ASPECT = 2.0  # rendered shapes have square boxes; allow blurry ones up to 2:1
MIN_FILL = 0.45  # area / box area; rendered triangles fill about 0.57-0.67
RELATION_MARGIN = 1.0  # pixels at 32x32
ASYMMETRY_WEIGHT = 2.0  # weight of the vertical asymmetry against the fill ratio in shape matching
FILL_MARGIN = 0.15  # partial credit: the fill ratio's quality falls to 0 over this margin below MIN_FILL
SHAPE_SOFTNESS = 0.03  # partial credit: width of the shape softmax in (fill, weighted asymmetry) units
# (fill ratio, vertical asymmetry) per shape, in SHAPES order
SHAPE_PROTOTYPES = torch.tensor([[1.0, 0.0], [0.8, 0.0], [0.6, 0.12]], dtype=torch.float64)
CATEGORY_KEYS = ("color", "shape", "count", "spatial")

_PALETTE = torch.tensor([BACKGROUND_RGB, *COLORS.values()], dtype=torch.float32)  # index 0: background


@dataclass
class Detections:
    """Objects found in a batch of images: one row per object, `image` says which image it is in."""

    image: torch.Tensor  # int64 [M]
    color: torch.Tensor  # int64 [M], index into COLOR_NAMES
    shape: torch.Tensor  # int64 [M], index into SHAPES
    center: torch.Tensor  # float64 [M, 2]: (x, y) centroid in pixels
    area: torch.Tensor  # int64 [M]
    quality: torch.Tensor  # float64 [M]: 1 for an object; in (0, 1) for a near-object (partial credit)
    shape_probs: torch.Tensor  # float64 [M, shapes]: one-hot of `shape`, or its softmax (partial credit)

    def counts(self, batch: int) -> torch.Tensor:
        """float64 [B, colors, shapes]: per image and kind, the sum of quality x shape probability
        (for exact detections: how many objects of each kind the image holds)."""
        counts = torch.zeros(batch, len(COLOR_NAMES), len(SHAPES), dtype=torch.float64)
        counts.index_put_((self.image, self.color), self.quality[:, None] * self.shape_probs, accumulate=True)
        return counts

    def objects(self) -> "Detections":
        """Only the components that pass every object test (quality 1)."""
        keep = self.quality == 1
        return Detections(
            self.image[keep],
            self.color[keep],
            self.shape[keep],
            self.center[keep],
            self.area[keep],
            self.quality[keep],
            self.shape_probs[keep],
        )


def as_float_images(images: torch.Tensor) -> torch.Tensor:
    """float32 [B, 3, H, W] in [0, 1] from float [B, 3, H, W] or uint8 [B, H, W, 3]."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images: expected a torch.Tensor, got {type(images).__name__}")
    if images.dtype == torch.uint8:
        if images.dim() != 4 or images.shape[-1] != 3:
            raise ValueError(f"images: uint8 images must be [B, H, W, 3], got {list(images.shape)}")
        return images.permute(0, 3, 1, 2).float().div(255)
    if not images.is_floating_point():
        raise ValueError(f"images: expected float [B, 3, H, W] or uint8 [B, H, W, 3], got dtype {images.dtype}")
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images: float images must be [B, 3, H, W], got {list(images.shape)}")
    if torch.isnan(images).any():
        raise ValueError("images: contains NaN")
    return images.detach().float().cpu().clamp(0, 1)


def _ramp(value: torch.Tensor, zero_at: float, one_at: float) -> torch.Tensor:
    """0 at zero_at, 1 at one_at and beyond, linear between (either direction)."""
    return ((value - zero_at) / (one_at - zero_at)).clamp(0, 1)


def detect(images: torch.Tensor, partial_credit: bool = False) -> Detections:
    """Segment images (see the module docstring) into colored, shaped objects; with partial credit
    also the near-objects, each with its quality and shape distribution."""
    images = as_float_images(images)
    batch, _, height, width = images.shape
    pixel_scale = height * width / IMAGE_SIZE**2

    distance = (images[:, None] - _PALETTE[None, :, :, None, None]).square().sum(2)  # [B, 1+K, H, W]
    nearest = distance.argmin(1)
    masks = F.one_hot(nearest, len(_PALETTE))[..., 1:].permute(0, 3, 1, 2).float()  # [B, K, H, W]

    # connected components: every pixel ends with the largest pixel id (1-based) of its component.
    # Each round spreads labels to 8-neighbours, then jumps: a pixel takes the label of the pixel its
    # label names (same component, never smaller), which shortcuts long components.
    ids = torch.arange(1, height * width + 1, dtype=torch.float32).view(1, 1, height, width)
    labels = ids * masks
    while True:
        grown = F.max_pool2d(labels, 3, stride=1, padding=1) * masks
        pointer = (grown.flatten(2).long() - 1).clamp(min=0)
        grown = grown.flatten(2).gather(2, pointer).view_as(grown) * masks
        if torch.equal(grown, labels):
            break
        labels = grown

    image, color, row, col = labels.nonzero(as_tuple=True)
    key = (image * len(COLOR_NAMES) + color) * (height * width + 1) + labels[image, color, row, col].long()
    keys, component = torch.unique(key, return_inverse=True)
    count = len(keys)
    area = torch.bincount(component, minlength=count)
    rows, cols = row.double(), col.double()

    def reduce(values, how):
        return torch.zeros(count, dtype=values.dtype).scatter_reduce(0, component, values, how, include_self=False)

    top, bottom = reduce(row, "amin"), reduce(row, "amax")
    left, right = reduce(col, "amin"), reduce(col, "amax")
    center = torch.stack([reduce(cols, "sum"), reduce(rows, "sum")], 1) / area[:, None] + 0.5
    box_h, box_w = (bottom - top + 1).double(), (right - left + 1).double()

    fill = area / (box_h * box_w)
    asymmetry = (center[:, 1] - top) / box_h - 0.5
    features = torch.stack([fill, ASYMMETRY_WEIGHT * asymmetry], 1)
    prototypes = SHAPE_PROTOTYPES * torch.tensor([1.0, ASYMMETRY_WEIGHT], dtype=torch.float64)
    distance = torch.cdist(features, prototypes)
    shape = distance.argmin(1)

    aspect = torch.maximum(box_h / box_w, box_w / box_h)
    side = torch.minimum(box_h, box_w)
    min_area = MIN_AREA * pixel_scale
    if partial_credit:
        quality = (
            _ramp(area.double(), min_area / 2, min_area)
            * _ramp(side, 1, MIN_SIDE)
            * _ramp(aspect, 2 * MAX_ASPECT, MAX_ASPECT)
            * _ramp(fill, MIN_FILL - FILL_MARGIN, MIN_FILL)
        )
        shape_probs = torch.softmax(-distance.square() / (2 * SHAPE_SOFTNESS**2), 1)
    else:
        passes = (area >= min_area) & (side >= MIN_SIDE) & (aspect <= MAX_ASPECT) & (fill >= MIN_FILL)
        quality = passes.double()
        shape_probs = F.one_hot(shape, len(SHAPES)).double()
    keep = quality > 0
    per_image = len(COLOR_NAMES) * (height * width + 1)
    return Detections(
        image=(keys // per_image)[keep],
        color=((keys // (height * width + 1)) % len(COLOR_NAMES))[keep],
        shape=shape[keep],
        center=center[keep],
        area=area[keep],
        quality=quality[keep],
        shape_probs=shape_probs[keep],
    )


def _requested_counts(specs: list[SceneSpec]) -> torch.Tensor:
    """int64 [B, colors, shapes]: how many objects of each kind each prompt asks for."""
    counts = torch.zeros(len(specs), len(COLOR_NAMES), len(SHAPES), dtype=torch.int64)
    for b, spec in enumerate(specs):
        for group in spec.groups:
            counts[b, COLOR_NAMES.index(group.color), SHAPES.index(group.shape)] += group.count
    return counts


def _presence_score(found: torch.Tensor, asked: torch.Tensor) -> torch.Tensor:
    """Mean over the kinds a prompt names (asked > 0) of min(found, asked) / asked; [B, kinds] each."""
    named = asked > 0
    present = torch.minimum(found.double(), asked.double()) / asked.clamp(min=1)
    return (present * named).sum(1) / named.sum(1)


def _spatial_score(specs: list[SceneSpec], found: Detections, pixel_scale: float) -> torch.Tensor:
    """[B]: 1 where some (first, second) object pair satisfies the prompt's relation; 1 without one.

    Some pair has sign * (first - second) >= margin along the axis exactly when the largest
    sign * position among first-phrase objects minus the smallest among second-phrase objects does.
    """
    batch = len(specs)
    has_relation = torch.tensor([spec.relation is not None for spec in specs])
    first, second = torch.full((batch, 2), -1), torch.full((batch, 2), -1)  # (color, shape) per prompt
    axis, sign = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.float64)
    for b, spec in enumerate(specs):
        if spec.relation is not None:
            a, c = spec.groups
            first[b] = torch.tensor([COLOR_NAMES.index(a.color), SHAPES.index(a.shape)])
            second[b] = torch.tensor([COLOR_NAMES.index(c.color), SHAPES.index(c.shape)])
            axis[b], sign[b] = RELATIONS[spec.relation]

    kind = torch.stack([found.color, found.shape], 1)  # [M, 2]
    is_first = (kind == first[found.image]).all(1)
    is_second = (kind == second[found.image]).all(1)
    signed = sign[found.image] * found.center.gather(1, axis[found.image, None]).squeeze(1)  # [M]

    def extreme(candidates, how, empty):
        values = torch.full((batch,), empty, dtype=torch.float64)
        return values.scatter_reduce(0, found.image[candidates], signed[candidates], how, include_self=True)

    gap = extreme(is_first, "amax", -torch.inf) - extreme(is_second, "amin", torch.inf)
    satisfied = gap >= RELATION_MARGIN * pixel_scale**0.5  # -inf when either object is missing
    return torch.where(has_relation, satisfied.double(), torch.ones(batch, dtype=torch.float64))


def _match_score(found: torch.Tensor, asked: torch.Tensor) -> torch.Tensor:
    """1 - |found - asked|, at least 0: [found == asked] for integer counts, partial credit between."""
    return (1 - (found.double() - asked.double()).abs()).clamp(min=0)


def score(images: torch.Tensor, prompts: list[str], partial_credit: bool = False) -> dict[str, torch.Tensor]:
    """Verifier scores of images against prompts: keys color, shape, count, spatial, overall, each a
    float32 tensor [B] in [0, 1] (see the module docstring for the exact definitions).

    images: float [B, 3, H, W] in [0, 1] or uint8 [B, H, W, 3]; prompts: B ShapesWorld prompts
    (unknown words raise ValueError naming them). partial_credit: the training reward's variant
    (module docstring); False gives the exact verifier.
    """
    specs = [parse_prompt(p) for p in prompts]
    images = as_float_images(images)
    if len(specs) != images.shape[0]:
        raise ValueError(f"prompts: got {len(specs)} prompts for {images.shape[0]} images, expected one per image")
    batch = len(specs)
    if batch == 0:
        return {key: torch.zeros(0) for key in (*CATEGORY_KEYS, "overall")}
    found = detect(images, partial_credit)
    have, asked = found.counts(batch), _requested_counts(specs)

    scores = {
        "color": _presence_score(have.sum(2), asked.sum(2)),
        "shape": _presence_score(have.sum(1), asked.sum(1)),
    }
    named = asked > 0
    matched_groups = (_match_score(have, asked) * named).sum((1, 2))
    matched_total = _match_score(have.sum((1, 2)), asked.sum((1, 2)))
    scores["count"] = (matched_groups + matched_total) / (named.sum((1, 2)) + 1)
    pixel_scale = images.shape[2] * images.shape[3] / IMAGE_SIZE**2
    scores["spatial"] = _spatial_score(specs, found.objects(), pixel_scale)

    is_spatial = torch.tensor([spec.relation is not None for spec in specs], dtype=torch.float64)
    total = scores["color"] + scores["shape"] + scores["count"] + scores["spatial"] * is_spatial
    scores["overall"] = total / (3 + is_spatial)
    return {key: value.float() for key, value in scores.items()}


def applicable(prompts: list[str]) -> dict[str, torch.Tensor]:
    """bool [B] per category key: whether the prompt exercises it (spatial only for spatial prompts)."""
    specs = [parse_prompt(p) for p in prompts]
    every = torch.ones(len(specs), dtype=torch.bool)
    spatial = torch.tensor([spec.relation is not None for spec in specs], dtype=torch.bool)
    return {"color": every, "shape": every, "count": every, "spatial": spatial, "overall": every}


def evaluate(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """Dataset-level summary: each score averaged over the prompts it applies to (NaN if none),
    plus "exact" = fraction of images with overall == 1."""
    scores = score(images, prompts)
    masks = applicable(prompts)
    summary = {key: float(scores[key][masks[key]].mean()) if masks[key].any() else float("nan") for key in scores}
    summary["exact"] = float((scores["overall"] == 1).float().mean())
    return summary

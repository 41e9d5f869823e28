"""Render a random ShapesWorld scene for a prompt: sample a layout, then draw it with hard edges.

All randomness comes from a numpy Generator (sizes, positions), so a seed reproduces an image exactly.
Objects never touch (a gap of at least GAP pixels), so each one is its own connected component, and
a spatial prompt's two objects are separated mostly along the relation's axis, so the relation is
unambiguous for the verifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .grammar import SceneSpec, parse_prompt
from .world import COLORS, IMAGE_SIZE, RELATIONS

GAP = 2  # minimum empty pixels between two objects' bounding boxes
BORDER = 1  # minimum empty pixels between an object and the image edge
MIN_SIZE, MAX_SIZE = 7, 10  # bounding-box side in pixels at 32x32 (scaled for other sizes)
MIN_RELATION_OFFSET = 6  # spatial prompts: centers at least this far apart along the relation's axis


@dataclass(frozen=True)
class PlacedObject:
    """One object: color and shape names, bounding box top-left corner (x = column, y = row), side."""

    color: str
    shape: str
    x: int
    y: int
    size: int

    @property
    def center(self) -> tuple[float, float]:
        """(x, y) of the bounding box middle, in pixels."""
        return self.x + self.size / 2, self.y + self.size / 2


def sample_layout(spec: SceneSpec, rng: np.random.Generator, image_size: int = IMAGE_SIZE) -> list[PlacedObject]:
    """Random non-touching placement of the spec's objects (group order), honouring its relation."""
    scale = image_size / IMAGE_SIZE
    low, high = round(MIN_SIZE * scale), round(MAX_SIZE * scale)
    kinds = [(g.color, g.shape) for g in spec.groups for _ in range(g.count)]
    for _ in range(1000):
        placed: list[PlacedObject] = []
        for color, shape in kinds:
            size = int(rng.integers(low, high + 1))
            corners = np.arange(BORDER, image_size - BORDER - size + 1)
            xs, ys = np.meshgrid(corners, corners, indexing="xy")
            valid = np.ones_like(xs, dtype=bool)
            for other in placed:
                apart_x = (xs + size + GAP <= other.x) | (other.x + other.size + GAP <= xs)
                apart_y = (ys + size + GAP <= other.y) | (other.y + other.size + GAP <= ys)
                valid &= apart_x | apart_y
            if spec.relation is not None and placed:
                valid &= _relation_holds(spec.relation, placed[0], xs, ys, size, scale)
            choices = np.flatnonzero(valid)
            if choices.size == 0:
                break  # this draw of sizes / positions leaves no room: start over
            pick = int(rng.choice(choices))
            placed.append(PlacedObject(color, shape, int(xs.flat[pick]), int(ys.flat[pick]), size))
        else:
            return placed
    raise RuntimeError(f"could not place the objects of {spec} in a {image_size}x{image_size} image")


def _relation_holds(relation: str, first: PlacedObject, xs, ys, size: int, scale: float) -> np.ndarray:
    """Candidate corners (xs, ys) of the second object B for which `first RELATION B` holds clearly."""
    axis, sign = RELATIONS[relation]
    centers = (xs + size / 2, ys + size / 2)
    along = first.center[axis] - centers[axis]  # the first object's offset from B along the axis
    across = first.center[1 - axis] - centers[1 - axis]
    return (sign * along >= MIN_RELATION_OFFSET * scale) & (np.abs(along) > np.abs(across))


def object_mask(obj: PlacedObject, image_size: int) -> np.ndarray:
    """bool [H, W]: the pixels of one object (pixel centers inside the shape)."""
    rows = np.arange(image_size)[:, None] + 0.5
    cols = np.arange(image_size)[None, :] + 0.5
    cx, cy = obj.center
    half = obj.size / 2
    inside_box = (np.abs(cols - cx) <= half) & (np.abs(rows - cy) <= half)
    if obj.shape == "square":
        return inside_box
    if obj.shape == "circle":
        return (cols - cx) ** 2 + (rows - cy) ** 2 <= half**2
    if obj.shape == "triangle":  # apex at the top middle, base along the bottom edge
        depth = (rows - obj.y) / obj.size  # 0 at the top, 1 at the bottom
        return inside_box & (np.abs(cols - cx) <= depth * half + 0.25)
    raise ValueError(f"shape: got {obj.shape!r}, expected square, circle or triangle")


def draw(objects: list[PlacedObject], image_size: int = IMAGE_SIZE) -> np.ndarray:
    """uint8 [H, W, 3] image of the objects on a black background."""
    image = np.zeros((image_size, image_size, 3), dtype=np.uint8)
    for obj in objects:
        rgb = np.round(np.asarray(COLORS[obj.color]) * 255).astype(np.uint8)
        image[object_mask(obj, image_size)] = rgb
    return image


def render_prompt(prompt: str, rng: np.random.Generator, image_size: int = IMAGE_SIZE) -> tuple[np.ndarray, list[PlacedObject]]:
    """A random scene for `prompt`: (uint8 [H, W, 3] image, its layout)."""
    layout = sample_layout(parse_prompt(prompt), rng, image_size)
    return draw(layout, image_size), layout


def render_batch(prompts: list[str], rng: np.random.Generator | int, image_size: int = IMAGE_SIZE) -> torch.Tensor:
    """float [B, 3, H, W] in [0, 1]: one random scene per prompt (rng: a Generator or an int seed)."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    images = np.stack([render_prompt(prompt, rng, image_size)[0] for prompt in prompts])
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255)

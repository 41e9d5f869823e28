"""The fixed vocabulary of ShapesWorld: colors (names and RGB), shapes, counts, relations, image size.

Everything the grammar, the renderer and the verifier must agree on lives here. The colors are corners
of the RGB cube (softened), so every pair is at least 0.8 apart in [0, 1] RGB and far from the black
background: nearest-color segmentation of a rendered image is exact, and of a model's image robust.
"""

from __future__ import annotations

IMAGE_SIZE = 32  # default side in pixels (32x32 keeps CPU training and sampling fast)

BACKGROUND_RGB = (0.0, 0.0, 0.0)

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.9, 0.1),
    "blue": (0.1, 0.1, 0.9),
    "yellow": (0.9, 0.9, 0.1),
    "magenta": (0.9, 0.1, 0.9),
    "cyan": (0.1, 0.9, 0.9),
}
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)

SHAPES: tuple[str, ...] = ("square", "circle", "triangle")
PLURAL: dict[str, str] = {shape: shape + "s" for shape in SHAPES}

# count words; "a" is the singular article (count 1)
NUMBERS: dict[str, int] = {"a": 1, "two": 2, "three": 3, "four": 4}
MAX_OBJECTS = 4

# relation phrase -> (axis, sign): "A left of B" means x_A < x_B (axis 0 = x, axis 1 = y, y grows down)
RELATIONS: dict[str, tuple[int, int]] = {
    "left of": (0, -1),
    "right of": (0, +1),
    "above": (1, -1),
    "below": (1, +1),
}

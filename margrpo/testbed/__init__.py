"""ShapesWorld: a procedural text-to-image testbed with an exact verifier.

Prompts such as "a red square and a blue circle", "three green triangles" or "a yellow circle left
of a red square" (margrpo.testbed.grammar), random scenes drawn for them (render), and a verifier
that parses images back into objects and scores them per category (verifier). Fixed train /
held-out prompt splits ship in margrpo/testbed/prompts/.
"""

from .grammar import CATEGORIES, VOCABULARY, ObjectGroup, SceneSpec, enumerate_prompts, format_prompt, parse_prompt
from .render import PlacedObject, draw, render_batch, render_prompt, sample_layout
from .splits import balanced_prompts, load_prompts, read_prompt_file
from .verifier import applicable, detect, evaluate, score

__all__ = [
    "CATEGORIES",
    "VOCABULARY",
    "ObjectGroup",
    "SceneSpec",
    "PlacedObject",
    "applicable",
    "balanced_prompts",
    "detect",
    "draw",
    "enumerate_prompts",
    "evaluate",
    "format_prompt",
    "load_prompts",
    "parse_prompt",
    "read_prompt_file",
    "render_batch",
    "render_prompt",
    "sample_layout",
    "score",
]

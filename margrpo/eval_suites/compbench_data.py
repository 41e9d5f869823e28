"""T2I-CompBench's prompt files, read from a local checkout of the benchmark (nothing is shipped or
downloaded).

Expected layout: the directory given to `--data` is either the checkout's root (the files are then
under examples/dataset/) or that dataset directory itself. Files read, one prompt a line:

    color_val.txt  shape_val.txt  texture_val.txt      attribute binding (BLIP-VQA)
    spatial_val.txt                                    2D spatial (detector)
    3d_spatial_val.txt                                 3D spatial (detector + depth), T2I-CompBench++
    non_spatial_val.txt                                non-spatial (CLIP)
    numeracy_val.txt  new_objects.txt                  numeracy (detector); "singular - plural" a line
    complex_val.txt  complex_val_spatial.txt  complex_val_action.txt    complex (3-in-1)

Only the files of the categories asked for must be there; a missing one is an error naming it and
where the authors publish it. Categories are kept in the order of the T2I-CompBench++ tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOURCE = "https://github.com/Karine-Huang/T2I-CompBench (folder examples/dataset)"
# category -> the prompt file it is evaluated on (the benchmark's validation split)
PROMPT_FILES = {
    "color": "color_val.txt",
    "shape": "shape_val.txt",
    "texture": "texture_val.txt",
    "spatial": "spatial_val.txt",
    "3d_spatial": "3d_spatial_val.txt",
    "non_spatial": "non_spatial_val.txt",
    "numeracy": "numeracy_val.txt",
    "complex": "complex_val.txt",
}
CATEGORIES = tuple(PROMPT_FILES)
# further files a category's scoring reads
EXTRA_FILES = {"numeracy": ("new_objects.txt",), "complex": ("complex_val_spatial.txt", "complex_val_action.txt")}


class CompBenchDataError(FileNotFoundError):
    """A file of the benchmark's layout is missing or unreadable; the message names it and the source."""


def dataset_dir(data: str | Path) -> Path:
    """The folder holding the prompt files: DATA/examples/dataset when DATA is the checkout, else DATA."""
    root = Path(data).expanduser()
    if not root.is_dir():
        raise CompBenchDataError(
            f"--data: {root} is not a directory; expected a local checkout of T2I-CompBench or its examples/dataset folder ({SOURCE})"
        )
    nested = root / "examples" / "dataset"
    return nested if nested.is_dir() else root


def read_lines(folder: Path, name: str) -> list[str]:
    """The non-empty lines of folder/name, stripped."""
    path = folder / name
    if not path.is_file():
        raise CompBenchDataError(f"--data: missing file {path}: T2I-CompBench's {name}, published at {SOURCE}")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def sentence_key(prompt: str) -> str:
    """How the 3-in-1 score matches a complex prompt with the spatial / action lists: lowercased,
    up to its first full stop."""
    return prompt.split(".")[0].strip().lower()


@dataclass(frozen=True)
class CompBenchData:
    """The prompts of each category asked for, and the files their scoring reads."""

    prompts: dict[str, list[str]]
    objects: dict[str, str]  # numeracy vocabulary: plural and singular -> singular
    complex_spatial: frozenset[str]  # sentence_key of complex prompts with a spatial relation
    complex_action: frozenset[str]  # ... with an action (non-spatial) relation

    @classmethod
    def read(cls, data: str | Path, categories: tuple[str, ...] = CATEGORIES) -> "CompBenchData":
        unknown = [c for c in categories if c not in PROMPT_FILES]
        if unknown:
            raise ValueError(f"categories: unknown {', '.join(unknown)}, expected some of {', '.join(CATEGORIES)}")
        folder = dataset_dir(data)
        prompts = {}
        for category in categories:
            prompts[category] = read_lines(folder, PROMPT_FILES[category])
            if not prompts[category]:
                raise CompBenchDataError(f"--data: {folder / PROMPT_FILES[category]} holds no prompt")
        objects: dict[str, str] = {}
        if "numeracy" in categories:
            for number, line in enumerate(read_lines(folder, "new_objects.txt"), start=1):
                if " - " not in line:
                    raise CompBenchDataError(f"--data: {folder / 'new_objects.txt'}:{number}: got {line!r}, expected 'singular - plural'")
                singular, plural = (w.strip().lower() for w in line.split(" - ", 1))
                objects.setdefault(singular, singular)
                objects.setdefault(plural, singular)
        spatial = action = frozenset()
        if "complex" in categories:
            spatial = frozenset(map(sentence_key, read_lines(folder, "complex_val_spatial.txt")))
            action = frozenset(map(sentence_key, read_lines(folder, "complex_val_action.txt")))
        return cls(prompts, objects, spatial, action)

    def complex_parts(self, prompt: str) -> tuple[str, ...]:
        """Which scores the 3-in-1 score of a complex prompt averages: attribute (BLIP-VQA) with
        spatial (detector) for the spatial list, with action (CLIP) for the action list, else all three."""
        key = sentence_key(prompt)
        if key in self.complex_spatial:
            return ("attribute", "spatial")
        if key in self.complex_action:
            return ("attribute", "action")
        return ("attribute", "spatial", "action")

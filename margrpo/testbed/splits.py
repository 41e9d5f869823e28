"""The fixed train / held-out prompt splits shipped in margrpo/testbed/prompts/{train,heldout}.txt.

They were generated once by `python -m margrpo.testbed.splits` (SPLIT_SEED below): per category, a
shuffled HELDOUT_FRACTION of the canonical prompts is held out, the rest is for training. Held-out
prompts are combinations (of colors, shapes, counts, relations) never seen in training.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .grammar import CATEGORIES, enumerate_prompts, parse_prompt

PROMPT_DIR = Path(__file__).parent / "prompts"
SPLIT_SEED = 20261202
HELDOUT_FRACTION = 0.15
SPLITS = ("train", "heldout")


def make_splits(seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """Deterministic split of every canonical prompt: {"train": [...], "heldout": [...]}."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[str]] = {"train": [], "heldout": []}
    for category in CATEGORIES:
        prompts = enumerate_prompts(category)
        order = rng.permutation(len(prompts))
        held = max(2, round(HELDOUT_FRACTION * len(prompts)))
        out["heldout"] += [prompts[i] for i in order[:held]]  # shuffled: any prefix is a random sample
        out["train"] += [prompts[i] for i in sorted(order[held:])]
    return out


def load_prompts(split: str) -> list[str]:
    """The prompts of a shipped split ("train" or "heldout"), one per line of its file."""
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}, expected one of {', '.join(SPLITS)}")
    return read_prompt_file(PROMPT_DIR / f"{split}.txt")


def read_prompt_file(path: str | Path) -> list[str]:
    """Non-empty, stripped lines of a prompt file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def balanced_prompts(split: str, per_category: int) -> list[str]:
    """The first `per_category` prompts of each category in a split (file order), categories in turn.

    A fixed, category-balanced evaluation set (the held-out file is in shuffled order within each
    category): round-robin over categories, so any prefix of the list is balanced too. A category
    with fewer prompts cycles through them again.
    """
    by_category: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for prompt in load_prompts(split):
        by_category[parse_prompt(prompt).category].append(prompt)
    return [by_category[c][i % len(by_category[c])] for i in range(per_category) for c in CATEGORIES]


def main(argv: list[str] | None = None) -> int:
    """Write the split files (only needed if the grammar changes; the shipped files are canonical)."""
    out_dir = Path(argv[0]) if argv else PROMPT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, prompts in make_splits().items():
        (out_dir / f"{split}.txt").write_text("\n".join(prompts) + "\n")
        print(f"{out_dir / split}.txt: {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

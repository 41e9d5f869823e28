"""GenEval-style prompts: templates over the 80 COCO object classes in GenEval's six categories.

    single_object  "a photo of a bench"                                objects [bench]
    two_object     "a photo of a cat and a bus"                        objects [cat, bus]
    counting       "a photo of three cups"                             objects [cup x3]
    colors         "a photo of a green car"                            objects [car, green]
    position       "a photo of a dog left of a bench"                  objects [dog, bench], position dog left of bench
    color_attr     "a photo of a red bowl and a blue chair"            objects [bowl red, chair blue]

Each prompt is a PromptRecord with the JSONL metadata of margrpo.prompt_files (tag = the category).
The list is drawn from a seeded generator, so a (seed, per_category) pair always gives the same
prompts. Counts are 2 to 4, colours and relations GenEval's vocabularies. These are generated
prompts in GenEval's categories, not GenEval's published prompt list (not shipped by any package
installed here), so scores are comparable between models evaluated here, not with published tables.
"""

from __future__ import annotations

import random

from margrpo.prompt_files import PromptRecord

# the 80 COCO detection classes, in COCO's category order
COCO_CLASSES = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
COUNT_WORDS = {2: "two", 3: "three", 4: "four"}
CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
_IRREGULAR = {"person": "people", "mouse": "mice", "knife": "knives", "sheep": "sheep", "skis": "skis", "scissors": "scissors"}


def plural(name: str) -> str:
    """English plural of a COCO class name ("wine glass" -> "wine glasses", "person" -> "people")."""
    if name in _IRREGULAR:
        return _IRREGULAR[name]
    if name.endswith(("s", "x", "ch", "sh")):
        return name + "es"
    return name + "s"


def with_article(phrase: str) -> str:
    """'a' or 'an' by the phrase's first letter ("an orange", "a red apple")."""
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"


def _record(tag: str, prompt: str, objects: list[dict], position: dict | None = None) -> PromptRecord:
    meta = {"tag": tag, "objects": objects}
    if position is not None:
        meta["position"] = position
    return PromptRecord(prompt, meta)


def _make(category: str, rng: random.Random) -> PromptRecord:
    if category == "single_object":
        name = rng.choice(COCO_CLASSES)
        return _record(category, f"a photo of {with_article(name)}", [{"class": name}])
    if category == "two_object":
        a, b = rng.sample(COCO_CLASSES, 2)
        return _record(category, f"a photo of {with_article(a)} and {with_article(b)}", [{"class": a}, {"class": b}])
    if category == "counting":
        name, count = rng.choice(COCO_CLASSES), rng.choice(sorted(COUNT_WORDS))
        return _record(category, f"a photo of {COUNT_WORDS[count]} {plural(name)}", [{"class": name, "count": count}])
    if category == "colors":
        name, color = rng.choice(COCO_CLASSES), rng.choice(COLORS)
        return _record(category, f"a photo of {with_article(f'{color} {name}')}", [{"class": name, "color": color}])
    if category == "position":
        (a, b), relation = rng.sample(COCO_CLASSES, 2), rng.choice(RELATIONS)
        return _record(
            category,
            f"a photo of {with_article(a)} {relation} {with_article(b)}",
            [{"class": a}, {"class": b}],
            {"subject": a, "relation": relation, "object": b},
        )
    if category == "color_attr":
        (a, b), (ca, cb) = rng.sample(COCO_CLASSES, 2), rng.sample(COLORS, 2)
        return _record(
            category,
            f"a photo of {with_article(f'{ca} {a}')} and {with_article(f'{cb} {b}')}",
            [{"class": a, "color": ca}, {"class": b, "color": cb}],
        )
    raise ValueError(f"category: got {category!r}, expected one of {', '.join(CATEGORIES)}")


def geneval_prompts(per_category: int, seed: int = 0, categories: tuple[str, ...] = CATEGORIES) -> list[PromptRecord]:
    """`per_category` distinct prompts of each category (fewer where a category has fewer, e.g. 80
    single objects), categories in turn, so any prefix of the list is balanced."""
    if per_category < 1:
        raise ValueError(f"per_category: got {per_category}, expected an integer >= 1")
    rng = random.Random(seed)
    lists = {}
    for category in categories:
        seen: dict[str, PromptRecord] = {}
        for _ in range(per_category * 20):  # draws: duplicates are skipped, a small category runs out
            record = _make(category, rng)
            seen.setdefault(record.prompt, record)
            if len(seen) == per_category:
                break
        lists[category] = list(seen.values())
    return [lists[c][i] for i in range(per_category) for c in categories if i < len(lists[c])]

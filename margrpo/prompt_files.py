"""Prompt files: plain text (one prompt per non-empty line) or JSONL (one prompt with metadata a line).

A file whose name ends in `.jsonl` holds one JSON object per non-empty line; any other file is plain
text. The JSONL schema (close to GenEval's metadata):

    prompt    str, required: the text the model is conditioned on
    tag       str: the prompt's category, by which evaluations report (e.g. "counting")
    objects   [{"class": str, "count": int >= 1 (default 1), "color": str (optional)}, ...]: the
              objects the image must show
    position  {"subject": str, "relation": str, "object": str}: "subject <relation> object", both
              classes of `objects`; relation one of the GroundingDINO reward's locality words
              ("left of", "right of", "above", "below", "near", ...)

T2I-CompBench-style reward keys (task_type, nouns, attr_nouns, spatial_info, numeracy_info;
margrpo.rewards.compbench) may also be given directly. Any other key is an error naming the file,
the line and the key. `reward_metadata` turns a record into what the rewards read: the given keys
plus the CompBench keys derived from `objects` and `position` (keys given directly win):

    task_type      spatial with a position, else numeracy when an object's count exceeds 1, else
                   color when an object has a colour, else object
    nouns          the object classes
    attr_nouns     with a colour anywhere: "color class" (or "class") per object, for VQA questions
    spatial_info   {"obj1": subject, "obj2": object, "locality": relation}
    numeracy_info  [{"obj_name": class, "num": count}, ...]
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from margrpo.rewards.grounding_dino import LOCALITIES

COMPBENCH_KEYS = ("task_type", "nouns", "attr_nouns", "spatial_info", "numeracy_info")
SCHEMA_KEYS = ("prompt", "tag", "objects", "position")
OBJECT_KEYS = ("class", "count", "color")
POSITION_KEYS = ("subject", "relation", "object")


class PromptFileError(ValueError):
    """A prompt file that cannot be read: the message names the file, the line and the key."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt and its metadata (the JSONL object less "prompt"; {} for a plain-text line)."""

    prompt: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def tag(self) -> str | None:
        return self.meta.get("tag")


def read_prompt_records(path: str | Path) -> list[PromptRecord]:
    """The prompts of a plain-text or .jsonl file, in file order (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    lines = path.read_text().splitlines()
    if path.suffix != ".jsonl":
        return [PromptRecord(line.strip()) for line in lines if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptFileError(f"{where}: not a JSON object ({err.msg} at column {err.colno})") from err
        records.append(parse_record(value, where))
    return records


def parse_record(value: Any, where: str) -> PromptRecord:
    """A validated PromptRecord from one decoded JSONL line; `where` ("file:line") starts every error."""
    if not isinstance(value, dict):
        raise PromptFileError(f"{where}: got {type(value).__name__}, expected a JSON object with a 'prompt' key")
    unknown = [k for k in value if k not in SCHEMA_KEYS + COMPBENCH_KEYS]
    if unknown:
        raise PromptFileError(f"{where}: key {unknown[0]!r}: unknown; expected keys {', '.join(SCHEMA_KEYS + COMPBENCH_KEYS)}")
    prompt = value.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptFileError(f"{where}: key 'prompt': got {prompt!r}, expected a non-empty string")
    if "tag" in value and not isinstance(value["tag"], str):
        raise PromptFileError(f"{where}: key 'tag': got {value['tag']!r}, expected a string")
    classes = _check_objects(value.get("objects", []), where)
    if "position" in value:
        _check_position(value["position"], classes, where)
    meta = {k: v for k, v in value.items() if k != "prompt"}
    if any(k in meta for k in COMPBENCH_KEYS):
        from margrpo.rewards.compbench import CompBenchItem

        try:
            CompBenchItem.from_metadata(meta, 0)
        except (TypeError, ValueError) as err:  # its message names the key as metadata[0]['key']
            message = re.sub(r"^metadata\[0\]\[", "key [", str(err))
            raise PromptFileError(f"{where}: {message}") from err
    return PromptRecord(prompt.strip(), meta)


def _check_objects(objects: Any, where: str) -> list[str]:
    if not isinstance(objects, list):
        raise PromptFileError(f"{where}: key 'objects': got {objects!r}, expected a list of objects")
    classes = []
    for i, obj in enumerate(objects):
        key = f"key 'objects'[{i}]"
        if not isinstance(obj, dict):
            raise PromptFileError(f"{where}: {key}: got {obj!r}, expected an object with 'class'")
        unknown = [k for k in obj if k not in OBJECT_KEYS]
        if unknown:
            raise PromptFileError(f"{where}: {key}[{unknown[0]!r}]: unknown; expected {', '.join(OBJECT_KEYS)}")
        if not isinstance(obj.get("class"), str) or not obj["class"].strip():
            raise PromptFileError(f"{where}: {key}['class']: got {obj.get('class')!r}, expected a non-empty string")
        count = obj.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise PromptFileError(f"{where}: {key}['count']: got {count!r}, expected an integer >= 1")
        if "color" in obj and (not isinstance(obj["color"], str) or not obj["color"].strip()):
            raise PromptFileError(f"{where}: {key}['color']: got {obj['color']!r}, expected a non-empty string")
        classes.append(obj["class"])
    return classes


def _check_position(position: Any, classes: list[str], where: str) -> None:
    if not isinstance(position, dict) or set(position) != set(POSITION_KEYS):
        raise PromptFileError(f"{where}: key 'position': got {position!r}, expected an object with exactly {', '.join(POSITION_KEYS)}")
    for key in ("subject", "object"):
        if position[key] not in classes:
            raise PromptFileError(
                f"{where}: key 'position'[{key!r}]: got {position[key]!r}, expected one of the "
                f"'objects' classes ({', '.join(classes) or 'none given'})"
            )
    if position["relation"] not in LOCALITIES:
        raise PromptFileError(f"{where}: key 'position'['relation']: got {position['relation']!r}, expected one of {', '.join(LOCALITIES)}")


def reward_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """The dict a reward gets for a prompt: `meta` plus the CompBench keys derived from it."""
    objects = meta.get("objects", [])
    position = meta.get("position")
    if not objects:
        return dict(meta)
    derived: dict[str, Any] = {"nouns": [o["class"] for o in objects]}
    if any("color" in o for o in objects):
        derived["attr_nouns"] = [f"{o['color']} {o['class']}" if "color" in o else o["class"] for o in objects]
    if position is not None:
        derived["task_type"] = "spatial"
        derived["spatial_info"] = {"obj1": position["subject"], "obj2": position["object"], "locality": position["relation"]}
    elif any(o.get("count", 1) > 1 for o in objects):
        derived["task_type"] = "numeracy"
        derived["numeracy_info"] = [{"obj_name": o["class"], "num": o.get("count", 1)} for o in objects]
    else:
        derived["task_type"] = "color" if "attr_nouns" in derived else "object"
    return {**derived, **meta}


def prompts_and_metadata(records: list[PromptRecord]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """(prompts, per-prompt reward metadata), the metadata None when no record carries any: a reward
    that needs metadata is then told it got none, instead of scoring empty dicts."""
    prompts = [r.prompt for r in records]
    if not any(r.meta for r in records):
        return prompts, None
    return prompts, [reward_metadata(r.meta) for r in records]


def write_prompt_records(records: list[PromptRecord], path: str | Path) -> Path:
    """Write records as JSONL (one object a line, "prompt" first); returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps({"prompt": r.prompt, **r.meta}) + "\n" for r in records))
    return path

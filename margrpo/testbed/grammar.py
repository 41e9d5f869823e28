"""The ShapesWorld prompt grammar: parse a prompt into a SceneSpec, format a SceneSpec back to text.

    prompt   := phrase | phrase "and" phrase | phrase RELATION phrase
    phrase   := "a" COLOR SHAPE | NUMBER COLOR SHAPE+"s"        (NUMBER in two, three, four)
    RELATION := "left of" | "right of" | "above" | "below"      (both phrases singular)

Each prompt has one category, decided by its structure:
    "single"   a red square
    "binding"  a red square and a blue circle                 (attribute binding)
    "counting" three green triangles
    "spatial"  a yellow circle left of a red square
Parsing is case-insensitive; format_prompt writes the canonical lowercase form, so
format_prompt(parse_prompt(p)) == p for every canonical prompt.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

from .world import COLOR_NAMES, MAX_OBJECTS, NUMBERS, PLURAL, RELATIONS, SHAPES

CATEGORIES: tuple[str, ...] = ("single", "binding", "counting", "spatial")

_SINGULAR_OF = {plural: shape for shape, plural in PLURAL.items()}
_NUMBER_WORD = {count: word for word, count in NUMBERS.items()}

# every word a grammatical prompt may contain
VOCABULARY: tuple[str, ...] = tuple(
    dict.fromkeys([*NUMBERS, *COLOR_NAMES, *SHAPES, *PLURAL.values(), "and"] + [word for phrase in RELATIONS for word in phrase.split()])
)


@dataclass(frozen=True)
class ObjectGroup:
    """`count` objects of one color and one shape."""

    count: int
    color: str
    shape: str


@dataclass(frozen=True)
class SceneSpec:
    """What a prompt asks for: object groups and, for spatial prompts, groups[0] RELATION groups[1]."""

    groups: tuple[ObjectGroup, ...]
    relation: str | None = None

    @property
    def category(self) -> str:
        """single, binding, counting or spatial (see the module docstring)."""
        if self.relation is not None:
            return "spatial"
        if len(self.groups) > 1:
            return "binding"
        return "counting" if self.groups[0].count > 1 else "single"

    @property
    def num_objects(self) -> int:
        """Total objects the prompt asks for."""
        return sum(group.count for group in self.groups)


def check_vocabulary(words: list[str], prompt: str) -> None:
    """Raise ValueError naming every word of `words` outside VOCABULARY."""
    unknown = [word for word in dict.fromkeys(words) if word not in VOCABULARY]
    if unknown:
        raise ValueError(
            f"unknown word(s) {', '.join(repr(w) for w in unknown)} in prompt {prompt!r}; ShapesWorld knows: {' '.join(VOCABULARY)}"
        )


@lru_cache(maxsize=8192)  # prompts repeat (training batches, groups); SceneSpec is immutable
def parse_prompt(prompt: str) -> SceneSpec:
    """Parse a ShapesWorld prompt. Unknown words or an ungrammatical prompt raise ValueError."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected str, got {type(prompt).__name__}")
    words = prompt.lower().split()
    if not words:
        raise ValueError("prompt: got an empty prompt, expected e.g. 'a red square'")
    check_vocabulary(words, prompt)

    first, rest = _parse_phrase(words, prompt)
    if not rest:
        return SceneSpec((first,))
    if rest[0] == "and":
        second, tail = _parse_phrase(rest[1:], prompt)
        relation = None
    else:
        relation = next((r for r in RELATIONS if rest[: len(r.split())] == r.split()), None)
        if relation is None:
            raise _ungrammatical(prompt, f"expected 'and' or a relation at {' '.join(rest)!r}")
        second, tail = _parse_phrase(rest[len(relation.split()) :], prompt)
        if first.count != 1 or second.count != 1:
            raise _ungrammatical(prompt, "a spatial relation needs a single object on each side")
    if tail:
        raise _ungrammatical(prompt, f"unexpected words at the end: {' '.join(tail)!r}")
    if (first.color, first.shape) == (second.color, second.shape):
        raise _ungrammatical(prompt, "the two phrases name the same kind of object")
    if first.count + second.count > MAX_OBJECTS:
        raise _ungrammatical(prompt, f"at most {MAX_OBJECTS} objects fit in a scene")
    return SceneSpec((first, second), relation)


def _parse_phrase(words: list[str], prompt: str) -> tuple[ObjectGroup, list[str]]:
    """NUMBER COLOR SHAPE at the start of `words` -> (group, remaining words)."""
    if len(words) < 3:
        raise _ungrammatical(prompt, f"incomplete object phrase {' '.join(words)!r}")
    number, color, noun = words[:3]
    if number not in NUMBERS:
        raise _ungrammatical(prompt, f"expected a count word ({', '.join(NUMBERS)}), got {number!r}")
    if color not in COLOR_NAMES:
        raise _ungrammatical(prompt, f"expected a color ({', '.join(COLOR_NAMES)}), got {color!r}")
    count = NUMBERS[number]
    shape = noun if count == 1 else _SINGULAR_OF.get(noun)
    if shape not in SHAPES:
        form = "singular" if count == 1 else "plural"
        raise _ungrammatical(prompt, f"expected a {form} shape after {number!r}, got {noun!r}")
    return ObjectGroup(count, color, shape), words[3:]


def _ungrammatical(prompt: str, why: str) -> ValueError:
    return ValueError(f"prompt {prompt!r} is not ShapesWorld grammar: {why}")


def format_prompt(spec: SceneSpec) -> str:
    """The canonical text of a SceneSpec (inverse of parse_prompt)."""
    phrases = [f"{_NUMBER_WORD[g.count]} {g.color} {g.shape if g.count == 1 else PLURAL[g.shape]}" for g in spec.groups]
    if len(phrases) == 1:
        return phrases[0]
    return f" {spec.relation or 'and'} ".join(phrases)


def enumerate_prompts(category: str) -> list[str]:
    """Every canonical prompt of a category, in a fixed order.

    binding: two objects differing in both color and shape; spatial: two objects of different colors.
    """
    pairs = list(itertools.product(COLOR_NAMES, SHAPES))
    if category == "single":
        specs = [SceneSpec((ObjectGroup(1, c, s),)) for c, s in pairs]
    elif category == "counting":
        counts = [n for n in NUMBERS.values() if n > 1]
        specs = [SceneSpec((ObjectGroup(n, c, s),)) for n in counts for c, s in pairs]
    elif category == "binding":
        specs = [
            SceneSpec((ObjectGroup(1, c1, s1), ObjectGroup(1, c2, s2)))
            for (c1, s1), (c2, s2) in itertools.product(pairs, pairs)
            if c1 != c2 and s1 != s2
        ]
    elif category == "spatial":
        specs = [
            SceneSpec((ObjectGroup(1, c1, s1), ObjectGroup(1, c2, s2)), relation)
            for relation in RELATIONS
            for (c1, s1), (c2, s2) in itertools.product(pairs, pairs)
            if c1 != c2
        ]
    else:
        raise ValueError(f"category: got {category!r}, expected one of {', '.join(CATEGORIES)}")
    return [format_prompt(spec) for spec in specs]

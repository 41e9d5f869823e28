"""The T2I-CompBench suite: the benchmark's validation prompts read from a local checkout
(compbench_data), each category scored by the benchmark's rule (compbench_score) with its metric
model (compbench_models), where the model runs on this library's dependencies, and by a labelled
substitute where it does not (GroundingDINO for UniDet; rule-based noun phrases where spaCy is not
installed). The score of a category is the mean over its images, as the benchmark reports it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from margrpo.prompt_files import PromptRecord
from margrpo.rewards.base import as_dtype, default_device, to_unit_float

from . import Suite
from . import compbench_score as rules
from .compbench_data import CATEGORIES, CompBenchData
from .report import SuiteReport

ATTRIBUTE = ("color", "shape", "texture")
NEEDS = {
    "color": ("blip",),
    "shape": ("blip",),
    "texture": ("blip",),
    "spatial": ("detector",),
    "3d_spatial": ("detector", "depth"),
    "non_spatial": ("clip",),
    "numeracy": ("detector",),
    "complex": ("blip", "clip", "detector"),
}
PARSED = ("color", "shape", "texture", "spatial", "3d_spatial", "complex")  # categories that read prompt words
UNIDET = "GroundingDINO, SUBSTITUTE for UniDet"
METHODS = {
    "color": "BLIP-VQA",
    "shape": "BLIP-VQA",
    "texture": "BLIP-VQA",
    "spatial": UNIDET,
    "3d_spatial": f"{UNIDET}; DPT depth",
    "non_spatial": "CLIP ViT-B/32",
    "numeracy": UNIDET,
    "complex": f"3-in-1: BLIP-VQA, CLIP ViT-B/32, {UNIDET}",
}
SUBSTITUTED = ("spatial", "3d_spatial", "numeracy", "complex")


@dataclass
class CompBenchReport(SuiteReport):
    """A SuiteReport whose table names each category's method (methods) and marks every substitute
    (substitutes: the categories scored other than by the benchmark's own procedure); notes: printed
    under the table."""

    methods: dict[str, str] = field(default_factory=dict)
    substitutes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        methods = self.methods
        width = max(len("category"), *(len(k) for k in self.scores))
        lines = [f"{self.suite}: {'category':<{width}}  score   images  method"]
        indent = " " * (len(self.suite) + 2)
        for key, value in self.scores.items():
            lines.append(f"{indent}{key:<{width}}  {value:.4f}  {self.images.get(key, 0):>6}  {methods.get(key, '')}")
        lines += [f"{indent}{note}" for note in self.notes]
        return "\n".join(lines)

    def markdown(self) -> str:
        """One row in the T2I-CompBench++ column order; substitute columns starred and explained."""
        subs = set(self.substitutes)
        heads = [f"{k}*" if k in subs else k for k in self.scores]
        lines = [
            "| " + " | ".join(heads) + " |",
            "|" + "---|" * len(heads),
            "| " + " | ".join(f"{v:.4f}" for v in self.scores.values()) + " |",
            "",
        ]
        if subs:
            lines.append(
                "\\* scored with a substitute, not comparable with published T2I-CompBench numbers: "
                + "; ".join(f"{k}: {self.methods[k]}" for k in self.scores if k in subs)
            )
        lines += self.notes
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "methods": self.methods, "substitutes": self.substitutes, "notes": self.notes}

    def write(self, path: str | Path) -> Path:
        path = super().write(path)
        path.with_suffix(".md").write_text(self.markdown())
        return path


class CompBenchSuite(Suite):
    """data: the benchmark's checkout or its examples/dataset folder (--data); blip, clip, detector,
    depth: the metric model directories; spacy: a spaCy pipeline name or directory, or 'rules';
    categories: comma-separated subset (default all); batch_size: images per metric-model call."""

    name = "t2i-compbench"
    default_per_category = sys.maxsize  # every prompt of each file unless --per-category

    def __init__(
        self,
        data: str | Path | None = None,
        blip: str | Path | None = None,
        clip: str | Path | None = None,
        detector: str | Path | None = None,
        depth: str | Path | None = None,
        spacy: str | None = None,
        categories: str | None = None,
        device: str | None = None,
        box_threshold: float = 0.3,
        batch_size: int = 16,
        dtype: torch.dtype | str = torch.float32,
    ) -> None:
        from .compbench_text import build_parser

        if data is None:
            raise ValueError("--data: required: a local checkout of T2I-CompBench (or its examples/dataset folder)")
        chosen = tuple(c.strip() for c in categories.split(",")) if categories else CATEGORIES
        self.data = CompBenchData.read(data, chosen)  # a missing prompt file fails before any model loads
        self.categories = chosen
        self.device, self.dtype = torch.device(device or default_device()), as_dtype(dtype)
        self.batch_size = batch_size
        self.parser = build_parser(spacy) if any(c in PARSED for c in chosen) else None
        needed = {model for c in chosen for model in NEEDS[c]}
        self.models = self._load(needed, blip=blip, clip=clip, detector=detector, depth=depth, box_threshold=box_threshold)

    def _load(self, needed: set[str], box_threshold: float, **paths) -> dict[str, Any]:
        from . import compbench_models as m

        makers = {
            "blip": lambda p: m.BlipVQA(p, self.device, self.dtype),
            "clip": lambda p: m.Clip(p, self.device, self.dtype),
            "detector": lambda p: m.Detector(p, self.device, self.dtype, box_threshold=box_threshold),
            "depth": lambda p: m.Depth(p, self.device, self.dtype),
        }
        return {name: makers[name](paths[name]) for name in ("blip", "clip", "detector", "depth") if name in needed}

    def prompts(self, per_category: int, seed: int) -> list[PromptRecord]:
        """The first `per_category` prompts of each category's file, in file order (the seed is unused:
        the benchmark's lists are fixed)."""
        return [PromptRecord(p, {"tag": c}) for c in self.categories for p in self.data.prompts[c][:per_category]]

    def methods(self) -> dict[str, str]:
        out = {}
        for c in self.categories:
            method = METHODS[c]
            if c in PARSED and not self.parser.official:
                method += f"; prompt words: {self.parser.name}"
            out[c] = method
        return out

    def score(self, images: torch.Tensor, records: list[PromptRecord]) -> SuiteReport:
        images = to_unit_float(images)
        tags = [r.tag for r in records]
        unknown = sorted({t for t in tags if t not in self.categories})
        if unknown:
            raise ValueError(
                f"t2i-compbench: records tagged {', '.join(map(str, unknown))}, expected one of "
                f"{', '.join(self.categories)} (the suite scores its own prompts)"
            )
        per_image = [0.0] * len(records)
        details: list[dict[str, Any]] = [{"prompt": r.prompt, "tag": r.tag} for r in records]
        for start in range(0, len(records), self.batch_size):
            chunk = list(range(start, min(start + self.batch_size, len(records))))
            for i, value in zip(chunk, self._score_chunk(images[chunk], [records[i] for i in chunk], [details[i] for i in chunk])):
                per_image[i] = value
                details[i]["score"] = value
        scores, counts = {}, {}
        for c in self.categories:
            values = [v for v, t in zip(per_image, tags) if t == c]
            if values:
                scores[c], counts[c] = sum(values) / len(values), len(values)
        methods = self.methods()
        notes = []
        if self.parser is not None and not self.parser.official:
            notes.append(f"prompt words read by {self.parser.name}: install spaCy and en_core_web_sm for the benchmark's own reading")
        substitutes = [c for c in scores if c in SUBSTITUTED or "substitute" in methods[c]]
        return CompBenchReport(self.name, scores, counts, details=details, methods=methods, substitutes=substitutes, notes=notes)

    def _score_chunk(self, images: torch.Tensor, records: list[PromptRecord], details: list[dict]) -> list[float]:
        """Scores of a chunk of images (any categories mixed), filling each image's details."""
        prompts, tags = [r.prompt for r in records], [r.tag for r in records]
        attribute = self._attribute(images, prompts, [t in ATTRIBUTE or t == "complex" for t in tags])
        complex_parts = {i: self.data.complex_parts(p) for i, (p, t) in enumerate(zip(prompts, tags)) if t == "complex"}
        pairs = {}
        for i, (p, t) in enumerate(zip(prompts, tags)):
            if t in ("spatial", "3d_spatial"):
                pairs[i] = self.parser.spatial_pair(p)
            elif t == "complex" and "spatial" in complex_parts[i]:
                pairs[i] = self.parser.complex_pair(p)
        asked = {i: rules.numeracy_objects(p, self.data.objects) for i, (p, t) in enumerate(zip(prompts, tags)) if t == "numeracy"}
        words = [list(pairs[i]) if pairs.get(i) else [name for name, _ in asked.get(i, [])] for i in range(len(tags))]
        found = self.models["detector"](images, words) if any(words) else [{} for _ in tags]
        depth = self.models["depth"](images) if "3d_spatial" in tags else None
        clip_texts = {i: p for i, (p, t) in enumerate(zip(prompts, tags)) if t == "non_spatial"}
        clip_texts.update({i: self.parser.without_adjectives(prompts[i]) for i, parts in complex_parts.items() if "action" in parts})
        clip = {}
        if clip_texts:
            index = sorted(clip_texts)
            clip = dict(zip(index, self.models["clip"].cosine(images[index], [clip_texts[i] for i in index]).tolist()))
        pixel = 1.0 / max(images.shape[-2:])
        out = []
        for i, tag in enumerate(tags):
            if tag in ATTRIBUTE:
                value = attribute[i]
            elif tag == "non_spatial":
                value = clip[i]
            elif tag == "numeracy":
                value = rules.numeracy_score(asked[i], found[i], pixel)
                details[i]["objects"] = asked[i]
            elif tag == "spatial":
                value = self._spatial_2d(prompts[i], pairs[i], found[i])
            elif tag == "3d_spatial":
                value = self._spatial_3d(prompts[i], pairs[i], found[i], depth[i])
            else:  # complex
                parts = {
                    "attribute": attribute[i],
                    "action": clip.get(i, 0.0),
                    "spatial": self._spatial_2d(prompts[i], pairs.get(i), found[i]),
                }
                value = rules.three_in_one(complex_parts[i], **parts)
                details[i]["parts"] = {k: parts[k] for k in complex_parts[i]}
            if i in pairs:
                details[i]["objects"] = list(pairs[i]) if pairs[i] else None
            out.append(float(value))
        return out

    def _attribute(self, images: torch.Tensor, prompts: list[str], asks: list[bool]) -> list[float]:
        """BLIP-VQA score per image (1.0 where not asked)."""
        questions = [
            ([f"{np}?" for np in self.parser.noun_phrases(p)][: rules.MAX_PHRASES] if ask else []) for p, ask in zip(prompts, asks)
        ]
        flat = [(i, q) for i, qs in enumerate(questions) if qs for q in qs]
        if not flat:
            return [1.0] * len(prompts)
        p_yes = self.models["blip"].p_yes(images, [q for _, q in flat], [i for i, _ in flat]).tolist()
        answers: list[list[float]] = [[] for _ in prompts]
        for (i, _), p in zip(flat, p_yes):
            answers[i].append(p)
        return [rules.attribute_score(a) for a in answers]

    @staticmethod
    def _spatial_2d(prompt: str, pair: tuple[str, str] | None, found: dict) -> float:
        if not pair:
            return 0.0
        box1, box2 = (next(iter(found.get(w.lower(), [])), None) for w in pair)
        locality = rules.first_locality(prompt, rules.LOCALITY_2D)
        position = rules.position_2d(locality, box1, box2) if box1 and box2 else 0.0
        return rules.pair_score(box1, box2, position, cut=rules.SPATIAL_CUT)

    @staticmethod
    def _spatial_3d(prompt: str, pair: tuple[str, str] | None, found: dict, depth: torch.Tensor) -> float:
        from .compbench_models import mean_in_box

        if not pair:
            return 0.0
        box1, box2 = (next(iter(found.get(w.lower(), [])), None) for w in pair)
        locality = rules.first_locality(prompt, rules.LOCALITY_3D)
        position = 0.0
        if box1 and box2:
            position = rules.position_3d(locality, box1, box2, mean_in_box(depth, box1), mean_in_box(depth, box2))
        return rules.pair_score(box1, box2, position)

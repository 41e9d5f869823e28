"""Evaluation suites for `margrpo eval --suite NAME`: a prompt set and a scorer, reported per category.

    shapes   the ShapesWorld held-out prompts scored by the exact verifier (what `margrpo eval` reports
             without --suite for a ShapesWorld config): color, shape, count, spatial, overall, exact
    geneval  GenEval-style prompts (geneval_prompts: the 80 COCO classes in the six GenEval categories)
             scored by an open-vocabulary detector and CLIP (geneval_detector); accuracy per category
             and overall = their mean, as GenEval reports

    t2i-compbench  T2I-CompBench's validation prompts from a local checkout of the benchmark (--data),
             each category scored by the benchmark's rule and model, or by a labelled substitute
             where its model does not run here (compbench)
    preference  HPS v2.1, ImageReward, PickScore and aesthetic over a prompt file, in the paper's
             column order, optionally side by side with an earlier report (preference)

DrawBench and DPG-Bench are not suites here: their prompt lists ship with no package installed in
this environment, and this library does not make up substitutes. A JSONL file of such prompts with
objects/position metadata (margrpo.prompt_files) can be scored by the geneval scorer with
`--prompts FILE`, and any prompt file by the preference suite.
"""

from __future__ import annotations

import abc
import inspect
from pathlib import Path

import torch

from margrpo.prompt_files import PromptRecord

from .report import SuiteReport


class Suite(abc.ABC):
    """A named prompt set (`prompts`) and its scorer (`score`); the constructor takes the scorer's options."""

    name = "suite"
    default_per_category: int | None = None  # None: run.eval_per_category

    @abc.abstractmethod
    def prompts(self, per_category: int, seed: int) -> list[PromptRecord]:
        """The suite's prompts with their metadata (tag = the category they are reported under)."""

    @abc.abstractmethod
    def score(self, images: torch.Tensor, records: list[PromptRecord]) -> SuiteReport:
        """Score images [B, 3, H, W] in [0, 1], one per record."""

    @classmethod
    def check_records(cls, records: list[PromptRecord]) -> None:
        """ValueError when the scorer cannot judge these prompts (e.g. metadata it needs is missing);
        called on a --prompts file before the scorer loads."""


class ShapesSuite(Suite):
    """The ShapesWorld held-out split, `per_category` prompts of each grammar category, scored by the verifier."""

    name = "shapes"  # per category: run.eval_per_category by default, as the trainer's held-out evaluation

    def prompts(self, per_category: int, seed: int) -> list[PromptRecord]:
        from margrpo.testbed import balanced_prompts, parse_prompt

        return [PromptRecord(p, {"tag": parse_prompt(p).category}) for p in balanced_prompts("heldout", per_category)]

    def score(self, images: torch.Tensor, records: list[PromptRecord]) -> SuiteReport:
        from margrpo.testbed import verifier

        prompts = [r.prompt for r in records]
        summary = verifier.evaluate(images, prompts)
        applies = {k: int(v.sum()) for k, v in verifier.applicable(prompts).items()}
        return SuiteReport(self.name, summary, {k: applies.get(k, len(prompts)) for k in summary})


class GenEvalSuite(Suite):
    """GenEval-style prompts and scoring. detector / clip: the model directories (see geneval_detector)."""

    name = "geneval"
    default_per_category = 50

    def __init__(
        self,
        detector: str | Path | None = None,
        clip: str | Path | None = None,
        device: str | None = None,
        box_threshold: float = 0.3,
        nms_iou: float = 0.5,
        margin: float = 0.05,
    ) -> None:
        from .geneval_detector import GenEvalScorer

        self.scorer = GenEvalScorer(detector, clip, box_threshold=box_threshold, nms_iou=nms_iou, margin=margin, device=device)

    def prompts(self, per_category: int, seed: int) -> list[PromptRecord]:
        from .geneval_prompts import geneval_prompts

        return geneval_prompts(per_category, seed)

    @classmethod
    def check_records(cls, records: list[PromptRecord]) -> None:
        missing = [r.prompt for r in records if not r.meta.get("objects")]
        if missing:
            raise ValueError(
                f"geneval: prompt {missing[0]!r} has no 'objects' metadata, which this scorer judges "
                "(a .jsonl prompt file: margrpo.prompt_files)"
            )

    def score(self, images: torch.Tensor, records: list[PromptRecord]) -> SuiteReport:
        from .geneval_score import summarize

        self.check_records(records)
        results = self.scorer(images, [r.meta for r in records])
        tags = [r.tag or "untagged" for r in records]
        scores, counts = summarize(tags, [ok for ok, _ in results])
        details = [{"prompt": r.prompt, "tag": t, "correct": ok, "why": why} for r, t, (ok, why) in zip(records, tags, results)]
        return SuiteReport(self.name, scores, counts, details=details)


SUITES: dict[str, type[Suite]] = {"shapes": ShapesSuite, "geneval": GenEvalSuite}

# after Suite: these modules subclass it
from .compbench import CompBenchSuite  # noqa: E402
from .preference import PreferenceSuite  # noqa: E402

SUITES.update({"t2i-compbench": CompBenchSuite, "preference": PreferenceSuite})


def available_suites() -> list[str]:
    return list(SUITES)


def suite_options(name: str) -> list[str]:
    """The options the suite `name` accepts (its scorer's settings)."""
    params = inspect.signature(SUITES[name].__init__).parameters
    return [p for p in params if p != "self" and params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


def build_suite(name: str, **options) -> Suite:
    """The suite `name` with its scorer's options (geneval: detector, clip, device, box_threshold, ...)."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}, expected one of {', '.join(SUITES)}")
    unknown = sorted(set(options) - set(suite_options(name)))
    if unknown:
        accepted = ", ".join(suite_options(name)) or "none"
        raise ValueError(f"suite {name!r}: does not take option(s) {', '.join(unknown)}; accepted: {accepted}")
    return SUITES[name](**options)

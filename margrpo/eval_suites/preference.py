"""The preference suite: the paper's four preference scores over a prompt file, and a before / after
comparison of two checkpoints.

Columns, in the paper's order: HPS v2.1 (shown x 100, as the paper reports it), ImageReward,
PickScore, the LAION aesthetic score: margrpo's rewards `hps`, `image_reward`, `pickscore`,
`aesthetic`, each loaded from its official layout (margrpo.rewards) under `weights` (default
$MARGRPO_WEIGHTS_DIR), with per-reward options `reward_options` ("hps.version=2.0",
"pickscore.processor_path=DIR", ...). The report holds the mean of each column, the score of every
image and the mean per prompt; it is written as JSON and as a Markdown table beside it (.md).
With `compare` (the JSON report of an earlier run on the same prompts, samples and seed, e.g. the
checkpoint before GRPO), the table sets the two side by side with the paired difference per column
and its 95% bootstrap interval over prompts (margrpo.eval_suites.paired).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from margrpo.config import ConfigError
from margrpo.prompt_files import PromptRecord

from . import Suite
from .paired import paired_difference
from .report import SuiteReport

# (reward name, column title, display scale)
COLUMNS = (
    ("hps", "HPS v2.1 (x100)", 100.0),
    ("image_reward", "ImageReward", 1.0),
    ("pickscore", "PickScore", 1.0),
    ("aesthetic", "Aesthetic", 1.0),
)


def default_paths(weights: str | Path) -> dict[str, dict[str, str]]:
    """Each reward's path options under a weights root in the rewards' standard layout."""
    from margrpo.rewards import aesthetic, clip_score, hps, image_reward

    root = Path(weights).expanduser()
    return {
        "hps": {"path": str(root / hps.weights_spec("2.1").default)},
        "image_reward": {"path": str(root / image_reward.SPEC.default)},
        "pickscore": {"path": str(root / clip_score.PICKSCORE.default)},
        "aesthetic": {"path": str(root / aesthetic.HEAD.default), "clip_path": str(root / aesthetic.CLIP.default)},
    }


def parse_reward_options(items: list[str] | dict | None) -> dict[str, dict[str, Any]]:
    """["hps.version=2.0", ...] -> {"hps": {"version": "2.0"}}; a dict is taken as it is."""
    if isinstance(items, dict) or items is None:
        return dict(items or {})
    names = [name for name, _, _ in COLUMNS]
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        reward, dot, option = key.partition(".")
        if not sep or not dot or reward not in names or not option:
            raise ConfigError(f"--reward-option: got {item!r}, expected REWARD.OPTION=VALUE with REWARD one of {', '.join(names)}")
        out.setdefault(reward, {})[option] = value
    return out


@dataclass
class PreferenceReport(SuiteReport):
    """Scores per column (raw; the table shows HPS x 100); per_prompt: each prompt's mean per column;
    comparison (when compared with `compare`, an earlier report): per column the before and after
    means, the paired difference and its interval."""

    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    compare: str | None = None
    comparison: dict[str, dict[str, float]] = field(default_factory=dict)

    def _value(self, name: str, value: float) -> str:
        scale = next(s for n, _, s in COLUMNS if n == name)
        return f"{value * scale:.4f}" if scale == 1.0 else f"{value * scale:.2f}"

    def rows(self) -> list[tuple[str, ...]]:
        titles = {n: t for n, t, _ in COLUMNS}
        comparison = self.comparison
        if not comparison:
            return [("", *(titles[n] for n in self.scores)), ("score", *(self._value(n, v) for n, v in self.scores.items()))]
        rows = [
            ("", *(titles[n] for n in self.scores)),
            ("before", *(self._value(n, comparison[n]["before"]) for n in self.scores)),
            ("after", *(self._value(n, comparison[n]["after"]) for n in self.scores)),
        ]
        level = int(round(100 * next(iter(comparison.values()))["level"]))
        rows.append(
            (
                f"after - before [{level}% CI]",
                *(f"{self._value(n, c['mean'])} [{self._value(n, c['low'])}, {self._value(n, c['high'])}]" for n, c in comparison.items()),
            )
        )
        return rows

    def table(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.append(f"{self.images.get('all', 0)} images, {len(self.per_prompt)} prompts")
        if self.comparison:
            paired = next(iter(self.comparison.values()))["prompts"]
            lines.append(f"paired over {paired} prompts with {self.compare}")
        return "\n".join(f"{self.suite}: {line}" for line in lines)

    def markdown(self) -> str:
        rows = self.rows()
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        scales = {n: s for n, _, s in COLUMNS}
        return {
            **super().to_json(),
            "display_scale": {n: scales[n] for n in self.scores},
            "per_prompt": self.per_prompt,
            "compare": self.compare,
            "comparison": self.comparison,
        }

    def write(self, path: str | Path) -> Path:
        path = super().write(path)
        path.with_suffix(".md").write_text(self.markdown())
        return path


class PreferenceSuite(Suite):
    """weights: a root in the rewards' layout (default $MARGRPO_WEIGHTS_DIR); reward_options:
    per-reward options; compare: an earlier report's JSON to compare with; batch_size: images per
    reward call."""

    name = "preference"

    def __init__(
        self,
        weights: str | Path | None = None,
        reward_options: list[str] | dict | None = None,
        compare: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 16,
    ) -> None:
        from margrpo.rewards import build_reward

        options = parse_reward_options(reward_options)
        paths = default_paths(weights) if weights is not None else {}
        self.baseline = self._read_baseline(compare) if compare is not None else None
        self.compare = str(compare) if compare is not None else None
        self.rewards = {
            name: build_reward(name, device=device, batch_size=batch_size, **{**paths.get(name, {}), **options.get(name, {})})
            for name, _, _ in COLUMNS
        }

    @staticmethod
    def _read_baseline(path: str | Path) -> dict[tuple[str, int], dict[str, float]]:
        path = Path(path)
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--compare: cannot read {path}: {err}") from err
        if report.get("suite") != "preference" or not report.get("details"):
            raise ConfigError(
                f"--compare: {path} is not a preference report (suite {report.get('suite')!r}); "
                "expected the JSON that `margrpo eval --suite preference` wrote"
            )
        return {(d["prompt"], d["sample"]): d["scores"] for d in report["details"]}

    def prompts(self, per_category: int, seed: int) -> list[PromptRecord]:
        raise ConfigError(
            "--prompts: the preference suite scores a prompt file (the paper's prompts, DrawBench "
            "or your own, one a line or .jsonl); give --prompts FILE"
        )

    def score(self, images: torch.Tensor, records: list[PromptRecord]) -> SuiteReport:
        prompts = [r.prompt for r in records]
        values = {name: reward(images, prompts).cpu().tolist() for name, reward in self.rewards.items()}
        seen: dict[str, int] = {}
        details = []
        for i, prompt in enumerate(prompts):
            sample = seen.get(prompt, 0)  # the k-th image of a prompt: the same seed in every run
            seen[prompt] = sample + 1
            details.append({"prompt": prompt, "sample": sample, "scores": {n: values[n][i] for n in values}})
        per_prompt = [
            {"prompt": p, **{n: sum(d["scores"][n] for d in details if d["prompt"] == p) / k for n in values}} for p, k in seen.items()
        ]
        scores = {n: sum(v) / len(v) for n, v in values.items()}
        comparison = self._comparison(details) if self.baseline is not None else {}
        return PreferenceReport(
            self.name, scores, {"all": len(records)}, details=details, per_prompt=per_prompt, compare=self.compare, comparison=comparison
        )

    def _comparison(self, details: list[dict]) -> dict[str, dict[str, float]]:
        """Per column: before and after means over the paired images, and the paired difference over prompts."""
        missing = [(d["prompt"], d["sample"]) for d in details if (d["prompt"], d["sample"]) not in self.baseline]
        if missing:
            raise ConfigError(
                f"--compare: {self.compare} has no score for prompt {missing[0][0]!r} sample "
                f"{missing[0][1]}; compare runs on the same prompts and --samples-per-prompt"
            )
        out = {}
        for name in self.rewards:
            by_prompt: dict[str, list[tuple[float, float]]] = {}
            for d in details:
                before = self.baseline[d["prompt"], d["sample"]][name]
                by_prompt.setdefault(d["prompt"], []).append((before, d["scores"][name]))
            before = [sum(b for b, _ in v) / len(v) for v in by_prompt.values()]
            after = [sum(a for _, a in v) / len(v) for v in by_prompt.values()]
            diff = paired_difference(before, after)
            out[name] = {
                "before": sum(before) / len(before),
                "after": sum(after) / len(after),
                "mean": diff.mean,
                "low": diff.low,
                "high": diff.high,
                "prompts": diff.prompts,
                "level": diff.level,
            }
        return out

"""benchmarks/compare_runs.py: paired gains over seeds from ablate-style run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script


def _module():
    return load_script("benchmarks/compare_runs.py", "compare_runs")


def _write_run(root: Path, seed: int, curve: dict[int, float], kl: float, finished: bool = True) -> None:
    run = root / "preset" / f"seed{seed}"
    run.mkdir(parents=True)
    rows = [{"kind": "eval", "step": s, "heldout/overall": v, "heldout/color": v / 2} for s, v in curve.items()]
    rows.insert(1, {"kind": "train", "step": 1, "kl": kl, "time/rollout": 1.0, "time/train": 0.5})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    if finished:
        (run / "summary.json").write_text("{}")


def test_paired_differences_and_unfinished_runs(tmp_path):
    module = _module()
    base, other = tmp_path / "base", tmp_path / "other"
    for seed, gain in enumerate([0.10, 0.20, 0.15]):
        _write_run(base, seed, {0: 0.1, 10: 0.1 + gain / 2, 60: 0.1 + gain}, kl=0.01)
        _write_run(other, seed, {0: 0.1, 10: 0.1, 60: 0.1 + gain - 0.05 * (seed + 1)}, kl=0.2)
    _write_run(other, 9, {0: 0.1, 10: 0.5}, kl=0.1, finished=False)  # no summary: not counted
    variants = {"base": module.load_runs(base), "other": module.load_runs(other)}
    assert sorted(variants["other"]) == [0, 1, 2]
    table, report = module.compare(variants, [10, 60])
    assert report["base"]["gain@60"]["mean"] == pytest.approx(0.15)
    paired = report["other"]["paired@60"]
    assert paired["values"] == pytest.approx([-0.05, -0.10, -0.15])
    assert paired["mean"] == pytest.approx(-0.10)
    assert paired["ci95"] == pytest.approx(4.303 * 0.05 / 3**0.5)
    assert report["other"]["kl"]["mean"] == pytest.approx(0.2)
    assert "0.050 -> " in table  # the color category, before -> after

"""`margrpo eval --suite preference`: the paired bootstrap, the table in the paper's column order on
tiny random-init reward models in their official layouts, the before / after comparison, its error
paths, and the command end to end on a tiny ShapesWorld model (twice, the second run compared with
the first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_checkpoint
from margrpo.config import ConfigError
from margrpo.eval_suites import build_suite
from margrpo.eval_suites.paired import paired_difference
from margrpo.eval_suites.preference import COLUMNS, parse_reward_options
from margrpo.prompt_files import PromptRecord
from margrpo.rewards import build_reward, synthetic
from margrpo.train import evaluate

EMPTY = str(Path(__file__).parent / "empty.yaml")
NAMES = [name for name, _, _ in COLUMNS]


# ---------------------------------------------------------------------- the paired bootstrap
def test_paired_difference_mean_and_interval():
    shifted = paired_difference([0.1, 0.5, 0.9], [0.3, 0.7, 1.1])
    assert shifted.mean == pytest.approx(0.2) and shifted.low == pytest.approx(0.2) and shifted.high == pytest.approx(0.2)
    g = torch.Generator().manual_seed(0)
    before = torch.rand(40, generator=g).tolist()
    after = [b + 0.1 + 0.2 * (torch.rand(1, generator=g).item() - 0.5) for b in before]
    d = paired_difference(before, after)
    diffs = torch.tensor(after) - torch.tensor(before)
    assert d.mean == pytest.approx(float(diffs.mean()))
    assert d.low < d.mean < d.high and d.prompts == 40 and d.level == 0.95
    # the interval is about mean +- 1.96 standard errors
    se = float(diffs.std() / 40**0.5)
    assert d.high - d.low == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert paired_difference(before, after) == d  # fixed seed: reproducible
    assert paired_difference(before, after, level=0.5).high - paired_difference(before, after, level=0.5).low < d.high - d.low


def test_paired_difference_errors():
    with pytest.raises(ValueError, match="after: got 1 values for 2 before"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="before: got no values"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="level: got 1.5"):
        paired_difference([1.0], [2.0], level=1.5)


def test_reward_options_parse():
    assert parse_reward_options(["hps.version=2.0", "pickscore.processor_path=/p", "hps.preprocess=center_crop"]) == {
        "hps": {"version": "2.0", "preprocess": "center_crop"},
        "pickscore": {"processor_path": "/p"},
    }
    assert parse_reward_options(None) == {}
    for bad in ("hps=2.0", "clipscore.path=x", "hps.version"):
        with pytest.raises(ConfigError, match=f"--reward-option: got '{bad}', expected REWARD.OPTION=VALUE"):
            parse_reward_options([bad])


# ---------------------------------------------------------------------- the suite on tiny reward models
@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    for module in ("open_clip", "timm", "transformers"):
        pytest.importorskip(module)
    root = tmp_path_factory.mktemp("preference-weights")
    written = {name: synthetic.write(name, root) for name in NAMES}  # the rewards' standard layout under root
    return root, written["hps"]["architecture"]


def suite_for(weights, **options):
    root, architecture = weights
    return build_suite("preference", weights=str(root), reward_options={"hps": {"architecture": architecture}}, device="cpu", **options)


RECORDS = [PromptRecord("a red cat"), PromptRecord("a red cat"), PromptRecord("two dogs"), PromptRecord("two dogs")]


def images(seed: int) -> torch.Tensor:
    return torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_scores_table_and_per_prompt_means(weights, tmp_path):
    suite = suite_for(weights)
    report = suite.score(images(0), RECORDS)
    assert list(report.scores) == NAMES  # the paper's order: HPS, ImageReward, PickScore, aesthetic
    root, architecture = weights
    direct = build_reward("hps", device="cpu", path=str(root / "hps" / "HPS_v2.1_compressed.pt"), architecture=architecture)(
        images(0), [r.prompt for r in RECORDS]
    )
    assert [d["scores"]["hps"] for d in report.details] == pytest.approx(direct.tolist())
    assert report.scores["hps"] == pytest.approx(float(direct.mean()))
    assert [(d["prompt"], d["sample"]) for d in report.details] == [("a red cat", 0), ("a red cat", 1), ("two dogs", 0), ("two dogs", 1)]
    assert report.per_prompt[1]["prompt"] == "two dogs"
    assert report.per_prompt[1]["aesthetic"] == pytest.approx(
        (report.details[2]["scores"]["aesthetic"] + report.details[3]["scores"]["aesthetic"]) / 2
    )
    table = report.table().splitlines()
    assert table[0].split()[1:] == ["HPS", "v2.1", "(x100)", "ImageReward", "PickScore", "Aesthetic"]
    assert table[1].split()[2] == f"{100 * report.scores['hps']:.2f}"  # HPS shown x 100, as the paper
    assert table[1].split()[3] == f"{report.scores['image_reward']:.4f}"
    out = report.write(tmp_path / "pref.json")
    markdown = out.with_suffix(".md").read_text().splitlines()
    assert markdown[0] == "|  | HPS v2.1 (x100) | ImageReward | PickScore | Aesthetic |"
    saved = json.loads(out.read_text())
    assert saved["display_scale"]["hps"] == 100.0 and len(saved["per_prompt"]) == 2 and len(saved["details"]) == 4


def test_before_after_comparison_is_paired_by_prompt_and_sample(weights, tmp_path):
    before = suite_for(weights).score(images(0), RECORDS)
    path = before.write(tmp_path / "before.json")
    after = suite_for(weights, compare=str(path)).score(images(1), RECORDS)
    for name in NAMES:
        row = after.comparison[name]
        assert row["before"] == pytest.approx(before.scores[name]) and row["after"] == pytest.approx(after.scores[name])
        assert row["mean"] == pytest.approx(after.scores[name] - before.scores[name])
        assert row["low"] <= row["mean"] <= row["high"] and row["prompts"] == 2
    table = after.table()
    assert "after - before [95% CI]" in table and f"paired over 2 prompts with {path}" in table
    same = suite_for(weights, compare=str(path)).score(images(0), RECORDS)
    assert all(same.comparison[n]["mean"] == pytest.approx(0.0, abs=1e-6) for n in NAMES)  # same images: no difference
    assert "| after - before [95% CI] |" in after.markdown()


def test_comparison_errors(weights, tmp_path):
    path = suite_for(weights).score(images(0)[:2], RECORDS[:2]).write(tmp_path / "before.json")
    with pytest.raises(ConfigError, match="--compare: .*before.json has no score for prompt 'two dogs' sample 0"):
        suite_for(weights, compare=str(path)).score(images(0), RECORDS)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"suite": "geneval", "details": [{}]}))
    with pytest.raises(ConfigError, match="--compare: .*other.json is not a preference report .suite 'geneval'"):
        suite_for(weights, compare=str(other))
    with pytest.raises(ConfigError, match="--compare: cannot read .*missing.json"):
        suite_for(weights, compare=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="--prompts: the preference suite scores a prompt file"):
        suite_for(weights).prompts(4, seed=0)


def test_missing_weights_are_named(weights, tmp_path):
    from margrpo.rewards import MissingWeightsError

    with pytest.raises(MissingWeightsError, match=r"hps: weights file not found: .*hps/HPS_v2.1_compressed.pt"):
        build_suite("preference", weights=str(tmp_path), device="cpu")


# ---------------------------------------------------------------------- margrpo eval, end to end
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def test_eval_preference_end_to_end_before_and_after(tmp_path, tiny_checkpoint, weights, capsys):
    root, architecture = weights
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square\ntwo blue circles\n")
    common = [
        "--config",
        EMPTY,
        f"backbone.checkpoint={tiny_checkpoint}",
        "rollout.num_mask_steps=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=1",
        "run.threads=1",
        "--suite",
        "preference",
        "--prompts",
        str(prompts),
        "--samples-per-prompt",
        "2",
        "--weights",
        str(root),
        "--reward-option",
        f"hps.architecture={architecture}",
    ]
    first = tmp_path / "before.json"
    assert evaluate.main([*common, "--out", str(first)]) == 0
    report = json.loads(first.read_text())
    assert list(report["scores"]) == NAMES and report["images"] == {"all": 4}
    assert [p["prompt"] for p in report["per_prompt"]] == ["a red square", "two blue circles"]
    assert first.with_suffix(".md").is_file()
    second = tmp_path / "after.json"
    assert evaluate.main([*common, "--compare", str(first), "--out", str(second)]) == 0
    compared = json.loads(second.read_text())
    # the same checkpoint and seeds draw the same images: every paired difference is zero
    assert all(abs(compared["comparison"][n]["mean"]) < 1e-6 for n in NAMES)
    printed = capsys.readouterr().out
    assert "after - before [95% CI]" in printed and "HPS v2.1 (x100)" in printed
    with pytest.raises(ConfigError, match="--prompts: the preference suite scores a prompt file"):
        evaluate.main([arg for arg in common if arg not in ("--prompts", str(prompts))])

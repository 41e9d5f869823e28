"""`margrpo eval` reads prompt metadata from the prompts it scores (run.eval_prompts or --prompts, never
run.train_prompts), honours --prompts without --suite, and a suite's errors are one line (exit 2)
said before any scorer loads: a prompt file without the metadata it judges, a missing CLIP
directory, prompt words the model does not know. A suite needs no configured reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_tiny_checkpoint
from margrpo import cli
from margrpo.config import ConfigError
from margrpo.eval_suites import geneval_detector
from margrpo.rewards import Reward, register
from margrpo.train import evaluate

EMPTY = str(Path(__file__).parent / "empty.yaml")
SEEN: list[tuple[list[str], list[dict] | None]] = []
META = [
    {"prompt": "a red square", "tag": "colors", "objects": [{"class": "square", "color": "red"}]},
    {"prompt": "two blue circles", "tag": "counting", "objects": [{"class": "circle", "count": 2}]},
]


@register("test_eval_prompts_recorder")
class Recorder(Reward):
    """A reward that scores from metadata (like grounding_dino) and records what it got."""

    needs_metadata = True

    def score(self, images, prompts, metadata):
        SEEN.append((list(prompts), list(metadata)))
        return images.mean((1, 2, 3))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def _common(checkpoint) -> list[str]:
    return [
        "--config",
        EMPTY,
        f"backbone.checkpoint={checkpoint}",
        "rollout.num_mask_steps=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=1",
        "run.eval_samples_per_prompt=1",
        "run.threads=1",
        "run.device=cpu",
    ]


def _files(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("a red square\n")
    jsonl = tmp_path / "meta.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in META))
    return plain, jsonl


def test_eval_takes_metadata_from_the_eval_prompts_not_the_train_prompts(tmp_path, tiny):
    plain, jsonl = _files(tmp_path)
    SEEN.clear()
    assert (
        evaluate.main(
            [*_common(tiny), "rewards={test_eval_prompts_recorder: 1.0}", f"run.train_prompts={plain}", f"run.eval_prompts={jsonl}"]
        )
        == 0
    )
    prompts, metadata = SEEN[-1]
    assert prompts == ["a red square", "two blue circles"] and metadata[1]["numeracy_info"]  # derived from objects


def test_eval_scores_the_prompts_option_with_its_metadata(tmp_path, tiny, capsys):
    plain, jsonl = _files(tmp_path)
    SEEN.clear()
    assert (
        evaluate.main([*_common(tiny), "rewards={test_eval_prompts_recorder: 1.0}", f"run.train_prompts={plain}", "--prompts", str(jsonl)])
        == 0
    )
    assert SEEN[-1][0] == ["a red square", "two blue circles"] and SEEN[-1][1][0]["nouns"]
    assert "heldout/reward=" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="^run.eval_prompts: reward.s. test_eval_prompts_recorder .*plain.txt"):
        evaluate.main([*_common(tiny), "rewards={test_eval_prompts_recorder: 1.0}", "--prompts", str(plain)])


def test_unknown_prompt_words_are_a_one_line_error(tmp_path, tiny, capsys):
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"prompt": "a photo of a cup", "objects": [{"class": "cup"}]}) + "\n")
    assert cli.main(["eval", *_common(tiny), "--prompts", str(odd)]) == 2
    assert "margrpo eval: error: --prompts: unknown word(s) 'photo'" in capsys.readouterr().err
    assert (
        cli.main(["eval", *_common(tiny), "--suite", "geneval", "--prompts", str(odd), "--detector", "x", "--clip", "y"]) == 2
    )  # before the scorer's directories are even looked at
    assert "--prompts: unknown word(s)" in capsys.readouterr().err


def test_a_suite_checks_its_prompt_file_before_loading_and_needs_no_reward(tmp_path, tiny, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the scorer was built before the prompt file was checked")

    monkeypatch.setattr(geneval_detector.GenEvalScorer, "__init__", no_loading)
    monkeypatch.setenv("MARGRPO_WEIGHTS_DIR", str(tmp_path / "no-weights"))  # the config's reward has none
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "a red square"}) + "\n")
    with pytest.raises(ConfigError, match="^--prompts: geneval: prompt 'a red square' has no 'objects' metadata"):
        evaluate.main(
            [*_common(tiny), "rewards={hps: 1.0}", "--suite", "geneval", "--prompts", str(bare), "--detector", "x", "--clip", "y"]
        )


def test_a_missing_clip_directory_is_said_before_the_detector_loads(tmp_path, tiny, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from margrpo.rewards import grounding_dino, synthetic

    detector = synthetic.write("grounding_dino", tmp_path)["path"]
    capsys.readouterr()  # the writer's progress bar

    def no_loading(*args, **kwargs):
        raise AssertionError("the detector loaded before the CLIP directory was checked")

    monkeypatch.setattr(grounding_dino, "GroundingDinoReward", no_loading)
    _, jsonl = _files(tmp_path)
    args = [
        "eval",
        *_common(tiny),
        "rewards={hps: 1.0}",
        "--suite",
        "geneval",
        "--prompts",
        str(jsonl),
        "--detector",
        detector,
        "--clip",
        str(tmp_path / "no-clip"),
    ]
    monkeypatch.setenv("MARGRPO_WEIGHTS_DIR", str(tmp_path / "no-weights"))
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-clip" in err and "--clip" in err, err

"""JSONL prompt files with per-prompt metadata (margrpo.prompt_files): reading, errors naming file, line
and key, the reward metadata derived from them, the trainer passing it to the rewards, rewards that
need metadata refusing a call without it, and the trainer's warning on a reward flat within every group."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_small_trainer, make_tiny_checkpoint
from margrpo.config import ConfigError
from margrpo.prompt_files import (
    PromptFileError,
    PromptRecord,
    prompts_and_metadata,
    read_prompt_records,
    reward_metadata,
    write_prompt_records,
)
from margrpo.rewards import MissingMetadataError, Reward, build_reward, register, synthetic
from margrpo.sample import read_prompts
from margrpo.train.step import step_prompts, watch_flat_rewards
from margrpo.train.trainer import Trainer

LINES = [
    {"prompt": "a red square", "tag": "colors", "objects": [{"class": "square", "color": "red"}]},
    {"prompt": "two blue circles", "tag": "counting", "objects": [{"class": "circle", "count": 2, "color": "blue"}]},
    {
        "prompt": "a red square left of a blue circle",
        "tag": "position",
        "objects": [{"class": "square", "color": "red"}, {"class": "circle", "color": "blue"}],
        "position": {"subject": "square", "relation": "left of", "object": "circle"},
    },
    {"prompt": "a green triangle and a red circle", "objects": [{"class": "triangle"}, {"class": "circle"}]},
]


def write_jsonl(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_jsonl_records_and_the_reward_metadata_derived_from_them(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [LINES[0], "", LINES[1], LINES[2], LINES[3]])
    records = read_prompt_records(path)
    assert [r.prompt for r in records] == [line["prompt"] for line in LINES]  # the blank line is skipped
    assert records[0].tag == "colors" and records[3].tag is None
    color, count, spatial, plain = (reward_metadata(r.meta) for r in records)
    assert color["task_type"] == "color" and color["nouns"] == ["square"] and color["attr_nouns"] == ["red square"]
    assert count["task_type"] == "numeracy" and count["numeracy_info"] == [{"obj_name": "circle", "num": 2}]
    assert spatial["task_type"] == "spatial"
    assert spatial["spatial_info"] == {"obj1": "square", "obj2": "circle", "locality": "left of"}
    assert plain["task_type"] == "object" and plain["nouns"] == ["triangle", "circle"] and "attr_nouns" not in plain
    # CompBench keys given directly win over the derived ones
    assert reward_metadata({**LINES[0], "task_type": "texture"})["task_type"] == "texture"
    # written back, the file reads the same
    again = read_prompt_records(write_prompt_records(records, tmp_path / "again.jsonl"))
    assert again == records


def test_plain_text_files_keep_working_and_carry_no_metadata(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("a red square\n\n  two blue circles  \n")
    records = read_prompt_records(text)
    assert records == [PromptRecord("a red square"), PromptRecord("two blue circles")]
    assert prompts_and_metadata(records) == (["a red square", "two blue circles"], None)
    # a JSONL file of bare prompts carries none either: a reward needing it must not get empty dicts
    assert prompts_and_metadata(read_prompt_records(write_jsonl(tmp_path / "bare.jsonl", [{"prompt": "x"}])))[1] is None
    assert read_prompts(text) == ["a red square", "two blue circles"]
    assert read_prompts(write_jsonl(tmp_path / "s.jsonl", LINES[:2])) == ["a red square", "two blue circles"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not a JSON object"),
        ('["a list"]', "got list, expected a JSON object"),
        ({"text": "a cat"}, "key 'text': unknown"),
        ({"prompt": ""}, "key 'prompt': got '', expected a non-empty string"),
        ({"prompt": "x", "tag": 3}, "key 'tag': got 3"),
        ({"prompt": "x", "objects": {"class": "cat"}}, "key 'objects': got"),
        ({"prompt": "x", "objects": [{"class": "cat", "count": 0}]}, "key 'objects'[0]['count']: got 0, expected an integer >= 1"),
        ({"prompt": "x", "objects": [{"class": "cat", "count": True}]}, "key 'objects'[0]['count']: got True"),
        ({"prompt": "x", "objects": [{"cls": "cat"}]}, "key 'objects'[0]['cls']: unknown"),
        ({"prompt": "x", "objects": [{"class": "cat"}, {"class": "dog", "color": ""}]}, "key 'objects'[1]['color']"),
        (
            {"prompt": "x", "objects": [{"class": "cat"}], "position": {"subject": "cat", "relation": "left of", "object": "dog"}},
            "key 'position'['object']: got 'dog', expected one of the 'objects' classes (cat)",
        ),
        (
            {
                "prompt": "x",
                "objects": [{"class": "cat"}, {"class": "dog"}],
                "position": {"subject": "cat", "relation": "inside", "object": "dog"},
            },
            "key 'position'['relation']: got 'inside'",
        ),
        ({"prompt": "x", "position": ["cat", "left of", "dog"]}, "key 'position': got"),
        ({"prompt": "x", "nouns": "cat"}, "key ['nouns']: got 'cat', expected a list of strings"),
    ],
)
def test_a_bad_line_is_an_error_naming_file_line_and_key(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [LINES[0], line])
    with pytest.raises(PromptFileError) as err:
        read_prompt_records(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value), str(err.value)


# ---------------------------------------------------------------------- rewards that need metadata
@pytest.fixture(scope="module")
def detector_weights(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("weights")
    return {"grounding_dino": synthetic.write("grounding_dino", root), "git_vqa": synthetic.write("git_vqa", root)}


def test_rewards_scored_from_metadata_refuse_a_call_without_it(detector_weights):
    images = torch.rand(2, 3, 32, 32)
    prompts = ["a cat", "a dog"]
    dino = build_reward("grounding_dino", device="cpu", **detector_weights["grounding_dino"])
    with pytest.raises(MissingMetadataError, match="grounding_dino: got no metadata.*jsonl prompt file"):
        dino(images, prompts)
    scores = dino(images, prompts, [reward_metadata(r) for r in ({"objects": [{"class": "cat"}]}, {"objects": [{"class": "dog"}]})])
    assert scores.shape == (2,)
    git = build_reward("git_vqa", device="cpu", **detector_weights["git_vqa"])
    with pytest.raises(MissingMetadataError, match="git_vqa: got no metadata"):
        git(images, prompts)
    asking = build_reward("git_vqa", device="cpu", no_nouns="ask_prompt", **detector_weights["git_vqa"])
    assert ((asking(images, prompts) > 0) & (asking(images, prompts) < 1)).all()  # asks "{prompt}?": no error


# ---------------------------------------------------------------------- the trainer
SEEN: list[tuple[list[str], list[dict] | None]] = []


@register("test_prompt_metadata_recorder")
class Recorder(Reward):
    """Scores brightness and records what it was called with."""

    needs_metadata = True

    def score(self, images, prompts, metadata):
        SEEN.append((list(prompts), list(metadata)))
        return images.mean((1, 2, 3))


@register("test_prompt_metadata_constant")
class Constant(Reward):
    """The same score for every image: no advantage."""

    def score(self, images, prompts, metadata):
        return torch.ones(images.shape[0])


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def make(tmp_path, checkpoint, *extra) -> Trainer:
    return make_small_trainer(
        tmp_path,
        checkpoint,
        "rollout.num_mask_steps=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=1",
        "grpo.group_size=2",
        "grpo.prompts_per_step=2",
        *extra,
    )


def test_the_trainer_passes_each_prompts_metadata_to_the_rewards(tmp_path, tiny_checkpoint):
    path = write_jsonl(tmp_path / "train.jsonl", LINES)
    trainer = make(
        tmp_path, tiny_checkpoint, f"run.train_prompts={path}", f"run.eval_prompts={path}", "rewards={test_prompt_metadata_recorder: 1.0}"
    )
    SEEN.clear()
    trainer.train_step()
    prompts, metadata = SEEN[-1]
    expected = {line["prompt"]: reward_metadata({k: v for k, v in line.items() if k != "prompt"}) for line in LINES}
    assert len(prompts) == 4 and metadata == [expected[p] for p in prompts]
    assert prompts == step_prompts(trainer, 0)[0]
    summary = trainer.evaluate(0, log=False)  # the held-out reward gets the eval prompts' metadata
    prompts, metadata = SEEN[-1]
    assert set(summary) == {"heldout/reward"} and metadata == [expected[p] for p in prompts]


@pytest.mark.parametrize("key", ["train_prompts", "eval_prompts"])
def test_a_reward_needing_metadata_with_plain_prompts_fails_at_start(tmp_path, tiny_checkpoint, key):
    plain = tmp_path / "plain.txt"
    plain.write_text("a red square\n")
    jsonl = write_jsonl(tmp_path / "meta.jsonl", LINES)
    files = {"train_prompts": jsonl, "eval_prompts": jsonl, key: str(plain)}
    with pytest.raises(ConfigError) as err:
        make(tmp_path, tiny_checkpoint, *(f"run.{k}={v}" for k, v in files.items()), "rewards={test_prompt_metadata_recorder: 1.0}")
    text = str(err.value)
    assert text.startswith(f"run.{key}: ") and "test_prompt_metadata_recorder" in text and str(plain) in text


def test_a_bad_jsonl_train_file_is_a_config_error_naming_the_line(tmp_path, tiny_checkpoint):
    path = write_jsonl(tmp_path / "bad.jsonl", [LINES[0], LINES[1], {"prompt": "x", "objects": [{"count": 2}]}])
    with pytest.raises(ConfigError, match=rf"^run.train_prompts: {path}:3: key 'objects'\[0\]\['class'\]"):
        make(tmp_path, tiny_checkpoint, f"run.train_prompts={path}")


def test_a_reward_flat_in_every_group_is_reported_after_n_steps(tmp_path, tiny_checkpoint, capsys):
    trainer = make(
        tmp_path,
        tiny_checkpoint,
        "rewards={test_prompt_metadata_constant: 1.0, flat_alias: {reward: test_prompt_metadata_constant, weight: 0.0}}",
        "run.flat_reward_warn_steps=2",
    )
    for _ in range(3):
        metrics = trainer.train_step()
        trainer.step += 1
    err = capsys.readouterr().err
    assert metrics["zero_variance_fraction"] == 1.0
    for name in ("test_prompt_metadata_constant", "flat_alias"):  # each term, once, at its second flat step
        assert err.count(f"reward {name!r} gave every group identical scores for 2 steps in a row") == 1
    assert trainer.flat_steps == {"test_prompt_metadata_constant": 3, "flat_alias": 3}
    quiet = make(tmp_path, tiny_checkpoint, "rewards={test_prompt_metadata_constant: 1.0}", "run.flat_reward_warn_steps=0")
    quiet.train_step()
    quiet.step += 1
    quiet.train_step()
    assert "identical scores" not in capsys.readouterr().err


def test_a_varying_reward_resets_the_count(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_prompt_metadata_constant: 1.0}")
    trainer.train_step()
    assert trainer.flat_steps["test_prompt_metadata_constant"] == 1
    watch_flat_rewards(trainer, {"test_prompt_metadata_constant": torch.tensor([0.0, 1.0, 2.0, 2.0])})
    assert trainer.flat_steps["test_prompt_metadata_constant"] == 0  # the first group varies

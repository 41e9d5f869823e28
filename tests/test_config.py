"""Typed config: unknown keys and ill-typed values are errors that name the key."""

from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from margrpo.config import ConfigError, apply_overrides, from_dict, load_yaml


@dataclass
class Optim:
    lr: float = 1e-5
    schedule: Literal["constant", "cosine"] = "constant"
    clip: Optional[float] = None


@dataclass
class Root:
    optim: Optim = field(default_factory=Optim)
    steps: int = 3
    tags: list[str] = field(default_factory=list)


def test_overrides_and_types():
    cfg = from_dict(Root, apply_overrides({"steps": 4}, ["optim.lr=1e-4", "optim.clip=0.5", "tags=[a, b]"]))
    assert cfg == Root(optim=Optim(lr=1e-4, clip=0.5), steps=4, tags=["a", "b"])
    assert isinstance(from_dict(Optim, {"lr": 1}).lr, float)  # int accepted for float


@pytest.mark.parametrize(
    "data, message",
    [
        ({"stpes": 3}, "unknown config key 'stpes'; did you mean steps"),
        ({"optim": {"lrr": 1.0}}, "unknown config key 'optim.lrr'; did you mean lr"),
        ({"optim": {"lr": "fast"}}, "optim.lr: got 'fast', expected a number"),
        ({"optim": {"schedule": "linear"}}, "optim.schedule: got 'linear', expected one of"),
        ({"steps": 2.5}, "steps: got 2.5, expected an integer"),
        ({"steps": True}, "steps: got True, expected an integer"),
        ({"optim": 3}, "optim: got int 3, expected a mapping"),
    ],
)
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(Root, data)
    assert message in str(err.value)


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_yaml(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(tmp_path / "list.yaml")


def test_relative_input_paths_resolve_beside_the_config_file(tmp_path, monkeypatch):
    """backbone.checkpoint and the prompt files of a config file are looked up beside the file first,
    so `--config /elsewhere/configs/x.yaml` works from any directory; output paths, paths found only
    from the working directory, builtin: names and command-line overrides are left as written."""
    from margrpo.train.config import load_config

    configs = tmp_path / "project" / "configs"
    (configs / "prompts").mkdir(parents=True)
    (configs / "prompts" / "train.txt").write_text("a red circle\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "eval.txt").parent.mkdir()
    (elsewhere / "eval.txt").write_text("a red circle\n")
    (configs / "x.yaml").write_text(
        "backbone: {checkpoint: builtin:shapes-tiny}\nrun: {train_prompts: prompts/train.txt, eval_prompts: eval.txt, out_dir: runs/x}\n"
    )
    monkeypatch.chdir(elsewhere)
    config = load_config(configs / "x.yaml")
    assert config.run.train_prompts == str(configs / "prompts" / "train.txt")
    assert config.run.eval_prompts == "eval.txt"  # not beside the file: the working directory's
    assert config.run.out_dir == "runs/x" and config.backbone.checkpoint == "builtin:shapes-tiny"
    assert load_config(configs / "x.yaml", ["run.train_prompts=prompts/train.txt"]).run.train_prompts == "prompts/train.txt"
    monkeypatch.chdir(configs)  # the same file from both: unchanged (a resumed run compares the text)
    assert load_config(configs / "x.yaml").run.train_prompts == "prompts/train.txt"


def test_a_config_file_trains_from_another_directory(tmp_path, monkeypatch):
    import shutil

    from margrpo.checkpoints import resolve_checkpoint
    from margrpo.train.trainer import Trainer

    configs = tmp_path / "configs"
    shutil.copytree(resolve_checkpoint("builtin:shapes-tiny"), configs / "model")
    (configs / "prompts.txt").write_text("a red circle\ntwo blue squares\n")
    (configs / "t.yaml").write_text("backbone: {checkpoint: model}\nrun: {train_prompts: prompts.txt, device: cpu}\n")
    monkeypatch.chdir(tmp_path.parent)
    trainer = Trainer.from_files(configs / "t.yaml", create_run_dir=False)
    assert trainer.train_prompts == ["a red circle", "two blue squares"]
    assert trainer.config.backbone.checkpoint == str(configs / "model")

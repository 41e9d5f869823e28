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

"""The trainer config's value rules: every setting found to train in the wrong direction, be ignored,
or fail after work began is an error at load time (or, for model- and file-dependent bounds, when the
trainer starts) that names its key; docs/CONFIG.md states every rule; a fuzz over every numeric key
finds no value accepted without a documented meaning; the CLI prints the message and exits 2."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest
import torch

from margrpo import cli
from margrpo.config import ConfigError
from margrpo.rollout import config as rollout_config
from margrpo.train import config as train_config
from margrpo.train.config import TrainerConfig, load_config
from margrpo.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "CONFIG.md").read_text()

# (key, overrides): each was accepted before, with a wrong or late result (issue 15, items 1-3, 12, 13)
BAD = [
    ("optim.grad_clip", ["optim.grad_clip=-1"]),  # negated the update
    ("optim.grad_clip", ["optim.grad_clip=0"]),  # no update, logged as a normal step
    ("grpo.advantage_eps", ["grpo.advantage_eps=-1"]),  # flipped the advantages' sign
    ("grpo.kl_beta", ["grpo.kl_beta=-1"]),
    ("grpo.head_lr_scale", ["grpo.head=low_lr", "grpo.head_lr_scale=-1"]),
    ("grpo.lora.alpha", ["grpo.lora.rank=4", "grpo.lora.alpha=-1"]),
    ("optim.warmup_steps", ["optim.warmup_steps=-5"]),
    ("backbone.diffusion_steps", ["backbone.diffusion_steps=0"]),
    ("optim.betas", ["optim.betas=[0.9, 0.99, 0.5]"]),
    ("optim.betas", ["optim.betas=[0.9]"]),
    ("optim.betas", ["optim.betas=[0.9, 1.5]"]),
    ("run.threads", ["run.threads=0"]),
    ("run.threads", ["run.threads=-1"]),
    ("optim.lr", ["optim.lr=.inf"]),
    ("optim.lr", ["optim.lr=-0.1"]),
    ("optim.lr", ["optim.lr=.nan"]),
    ("run.eval_samples_per_prompt", ["run.eval_samples_per_prompt=0"]),
    ("run.eval_per_category", ["run.eval_per_category=0"]),
    ("run.log_every", ["run.log_every=0"]),
    ("grpo.pixels_per_token", ["grpo.pixels_per_token=0"]),
    ("grpo.clip_eps", ["grpo.clip_eps=-0.1"]),
    ("rollout.record_mask_steps", ["rollout.num_mask_steps=8", "rollout.record_mask_steps=9"]),
    ("rollout.record_diffusion_steps", ["backbone.diffusion_steps=20", "rollout.record_diffusion_steps=21"]),
    ("rollout.num_diffusion_steps", ["rollout.num_diffusion_steps=5"]),  # ignored: the trainer's sampler
    ("run.seed", ["run.seed=-1"]),
    ("grpo.lora.targets", ["grpo.lora.rank=4", "grpo.lora.targets=['blocks.(']"]),
    ("rewards", ["rewards={shapes: .nan}"]),
    ("run.device", ["run.device=gpu"]),
]


@pytest.mark.parametrize("key, extra", BAD, ids=[f"{k}:{' '.join(e)}" for k, e in BAD])
def test_bad_value_fails_at_load_naming_the_key(key, extra):
    with pytest.raises(ConfigError) as err:
        load_config(None, extra)
    assert str(err.value).startswith(f"{key}: "), str(err.value)


def test_documented_special_values_load():
    config = load_config(
        None,
        [
            "optim.grad_clip=null",
            "optim.lr=0",
            "run.keep_last=0",
            "run.eval_every=0",
            "optim.betas=[0, 0.5]",
            "backbone.diffusion_steps=12",
            "rollout.num_diffusion_steps=12",
        ],
    )
    assert config.optim.grad_clip is None and config.optim.betas == (0.0, 0.5)


def _start(*extra: str) -> Trainer:
    base = [
        "run.tensorboard=false",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "run.resume=never",
    ]
    return Trainer(load_config(None, [*base, *extra]), create_run_dir=False)


@pytest.mark.parametrize(
    "key, extra, message",
    [
        ("run.train_prompts", ["run.train_prompts=EMPTY"], "holds no prompt"),
        ("run.eval_prompts", ["run.eval_prompts=EMPTY"], "holds no prompt"),
        ("run.train_prompts", ["run.train_prompts=MISSING"], "prompt file not found"),
        # the model's chain: 20 steps, the last deterministic; with diffusion_steps null only the model knows
        ("rollout.record_diffusion_steps", ["rollout.record_diffusion_steps=20"], "expected 1..19"),
        # post_step leaves out the final effective step: 3 of 4 can be recorded
        (
            "rollout.record_mask_steps",
            ["rollout.likelihood_positions=unknown", "rollout.known_mask=post_step", "rollout.record_mask_steps=4"],
            "expected 0..3",
        ),
        # records nothing to train on (passed every check, then crashed in the update)
        ("rollout.record_mask_steps", ["rollout.record_mask_steps=0"], "expected >= 1 to train"),
        ("rewards", ["rewards={no_such_reward: 1.0}"], "unknown name 'no_such_reward'"),
        ("rewards", ["rewards={shapes: {weight: 1.0, colour: red}}"], "unknown option(s) colour"),
    ],
)
def test_model_and_file_bounds_fail_when_the_trainer_starts(tmp_path, key, extra, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    paths = {"EMPTY": str(empty), "MISSING": str(tmp_path / "missing.txt")}
    with pytest.raises(ConfigError) as err:
        _start(*(re.sub("EMPTY|MISSING", lambda m: paths[m.group()], e) for e in extra))
    assert str(err.value).startswith(f"{key}: ") and message in str(err.value), str(err.value)


def test_a_config_recording_nothing_still_evaluates():
    config = load_config(None, ["run.tensorboard=false", "rollout.num_mask_steps=4", "rollout.record_mask_steps=0", "run.resume=never"])
    trainer = Trainer(config, create_run_dir=False, evaluation_only=True)
    assert trainer.config.rollout.record_mask_steps == 0


def test_null_grad_clip_is_no_clipping():
    weights = []
    for clip in ("null", "1e9"):  # 1e9 is far above the norm: clip_grad_norm_ scales by exactly 1
        trainer = _start("grpo.prompts_per_step=2", "optim.lr=1e-3", f"optim.grad_clip={clip}", "run.threads=1")
        trainer.train_step()
        weights.append({k: v.detach().clone() for k, v in trainer.policy.named_parameters() if v.requires_grad})
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


# ---------------------------------------------------------------------- docs/CONFIG.md
def _leaf_keys(cls=TrainerConfig, prefix=""):
    """(dotted key, annotation) of every leaf of the config tree."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name]


def _all_rules():
    return [*train_config.RULES, *(dataclasses.replace(r, key=f"rollout.{r.key}") for r in rollout_config.RULES)]


def _doc_row(key: str) -> str:
    rows = [line for line in DOCS.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(rows) == 1, f"docs/CONFIG.md: expected one row for {key}, found {len(rows)}"
    return rows[0]


def test_docs_state_every_key_and_every_rule():
    for key, tp in _leaf_keys():
        row = _doc_row(key)
        if typing.get_origin(tp) is typing.Literal:
            valid = row.rsplit(" | ", 1)[1]
            assert all(re.search(rf"\b{choice}\b", valid) for choice in typing.get_args(tp)), key
    for rule in _all_rules():
        assert rule.expected in _doc_row(rule.key), f"docs/CONFIG.md does not state {rule.key}: {rule.expected}"


# ---------------------------------------------------------------------- fuzz
FLOAT_VALUES = ["0", "-1", ".inf", "-.inf", ".nan", "1e300", "-1e300", "abc"]
INT_VALUES = ["0", "-1", ".inf", ".nan", "1000000000000000000000", "-1000000000000000000000", "1.5", "abc"]


def _numeric(tp) -> bool:
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    options = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    return all(o in (int, float) for o in options)


def _fuzz_cases() -> list[tuple[str, str]]:
    cases = []
    for key, tp in _leaf_keys():
        if _numeric(tp):
            is_int = int in typing.get_args(tp) or tp is int
            cases += [(key, v) for v in (INT_VALUES if is_int else FLOAT_VALUES)]
    cases += [("optim.betas", f"[{v}, 0.999]") for v in FLOAT_VALUES] + [("optim.betas", "[0.9]"), ("optim.betas", "[]")]
    cases += [("rewards.shapes", v) for v in FLOAT_VALUES]
    cases += [("grpo.lora.targets", v) for v in ("['(']", "['[a-']", "['*']", "[1]", "abc")]
    return cases


def fuzz() -> dict[str, list]:
    """Each case loaded alone on the defaults: a clean error (ConfigError starting with the key), a
    documented acceptance (the key has a rule, so docs/CONFIG.md states what its accepted values
    mean), or a failure of the rule: silent (accepted, no rule) or unclean (another error, or one
    not naming the key)."""
    ruled = {r.key for r in _all_rules()}
    outcome = {"clean": [], "documented": [], "silent": [], "unclean": []}
    for key, value in _fuzz_cases():
        section = "rewards" if key.startswith("rewards.") else key
        try:
            load_config(None, [f"{key}={value}"])
        except ConfigError as err:
            named = re.match(rf"{re.escape(section)}(\[\d+\])?: ", str(err))  # the key, or one of its items
            outcome["clean" if named else "unclean"].append((key, value, str(err)))
            continue
        except Exception as err:  # noqa: BLE001 - counting every other failure is the point
            outcome["unclean"].append((key, value, f"{type(err).__name__}: {err}"))
            continue
        outcome["documented" if section in ruled else "silent"].append((key, value))
    return outcome


def test_config_fuzz_has_no_silent_acceptance(capsys):
    result = fuzz()
    tried = sum(len(v) for v in result.values())
    with capsys.disabled():
        print(
            f"\nconfig fuzz: {tried} values tried, {len(result['clean'])} clean errors, "
            f"{len(result['documented'])} documented acceptances, {len(result['silent'])} silent acceptances, "
            f"{len(result['unclean'])} unclean errors"
        )
    assert not result["silent"], result["silent"]
    assert not result["unclean"], result["unclean"]
    assert len(result["clean"]) > len(result["documented"]) > 0


# ---------------------------------------------------------------------- the command line
def test_cli_prints_a_config_error_and_exits_2(capsys):
    assert cli.main(["train", "--config", str(ROOT / "tests" / "empty.yaml"), "optim.lr=-0.1"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"margrpo train: error: optim\.lr: got -0\.1, expected .*\n", err), err
    assert cli.main(["train", "--config", str(ROOT / "tests" / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_eval_names_a_missing_or_wrong_checkpoint(tmp_path, capsys):
    config = str(ROOT / "tests" / "empty.yaml")
    assert cli.main(["eval", "--config", config, "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "nope: no such file or directory" in capsys.readouterr().err
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")  # neither a run checkpoint nor any family's model directory
    assert cli.main(["eval", "--config", config, "--checkpoint", str(model_dir)]) == 2
    assert "neither a run checkpoint (a step-XXXXXXXX directory" in capsys.readouterr().err

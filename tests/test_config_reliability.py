"""The configuration findings of the reliability audit (issue 30): values that were accepted and then
trained on nothing, wrote into the wrong place, or failed late with a traceback are refused with a
one-line error naming the key (exit 2): at load, or, where only the model knows the bound, when the
trainer starts, before any work. Two weightings of rewards are by design: accepted, documented, and
announced when the trainer starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from margrpo import cli
from margrpo.config import ConfigError
from margrpo.rollout import RolloutConfig
from margrpo.train.config import load_config, reward_weight_notes
from margrpo.train.trainer import Trainer

EMPTY = Path(__file__).resolve().parent / "empty.yaml"

# (key, overrides): each was accepted at load before, and trained on nothing or failed later
AT_LOAD = [
    ("grpo.advantage_eps", ["grpo.advantage_eps=1e30"]),  # every advantage 0
    ("grpo.advantage_eps", ["grpo.advantage_eps=1e300"]),
    ("grpo.advantage_eps", ["grpo.advantage_eps=2"]),
    ("optim.weight_decay", ["optim.lr=1e-4", "optim.weight_decay=1e4"]),  # lr * wd = 1: the weights zeroed
    ("optim.weight_decay", ["optim.lr=0.5", "optim.weight_decay=3"]),  # lr * wd = 1.5: their sign flipped
    ("optim.weight_decay", ["grpo.head=low_lr", "grpo.head_lr_scale=20", "optim.lr=0.01", "optim.weight_decay=5"]),
    ("rewards", ["rewards={shapes: 0}"]),  # the only reward weighs 0: no signal
    ("rewards", ["rewards={shapes: 0, jpeg_incompressibility: 0.0}"]),
    ("rewards", ["rewards={shapes: {weight: 0, partial_credit: true}}"]),
    ("run.out_dir", ["run.out_dir="]),  # wrote into (and resumed from) the working directory
    ("run.out_dir", ["run.out_dir='  '"]),
    ("run.train_prompts", ["run.train_prompts="]),  # silently the built-in split
    ("run.eval_prompts", ["run.eval_prompts="]),
    ("rollout.cfg_scale", ["rollout.cfg_scale=1e30"]),  # saturated images, zero gradient
    ("rollout.cfg_scale", ["rollout.cfg_scale=101"]),
    ("rollout.cfg_scale", ["rollout.cfg_scale=0"]),  # unconditional: training cannot follow the prompt
    ("rollout.temperature", ["rollout.temperature=1e30"]),  # NaN images, a traceback in the reward
    ("rollout.temperature", ["rollout.temperature=11"]),
    ("backbone.checkpoint", ["backbone.checkpoint="]),
]


@pytest.mark.parametrize("key, extra", AT_LOAD, ids=[" ".join(e) for _, e in AT_LOAD])
def test_a_value_that_would_train_on_nothing_fails_at_load(key, extra):
    with pytest.raises(ConfigError) as err:
        load_config(None, extra)
    assert str(err.value).startswith(f"{key}: "), str(err.value)


@pytest.mark.parametrize(
    "extra",
    [
        ["grpo.advantage_eps=1"],
        ["optim.lr=1e-4", "optim.weight_decay=9999"],
        ["optim.lr=0", "optim.weight_decay=1e6"],
        ["grpo.head=low_lr", "grpo.head_lr_scale=0.1", "optim.lr=0.01", "optim.weight_decay=50"],
        ["rewards={shapes: 1, jpeg_incompressibility: 0}"],
        ["rollout.cfg_scale=100"],
        ["rollout.cfg_scale=0.5"],
        ["rollout.temperature=10"],
        ["run.out_dir=."],
        ["run.train_prompts=null"],
    ],
)
def test_the_limits_themselves_load(extra):
    import yaml

    config = load_config(None, extra)
    for item in extra:  # each value at its limit is accepted as given
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        got = getattr(getattr(config, section), name) if name else getattr(config, section)
        expected = float(value) if isinstance(got, float) else yaml.safe_load(value)  # YAML reads 1e-4 as a string
        assert got == expected, item


def test_a_rollout_config_may_sample_unconditionally_but_not_beyond_its_limits():
    """cfg_scale 0 samples unconditionally (sample, eval); only a trainer config refuses it."""
    assert RolloutConfig(cfg_scale=0.0, record_mask_steps=0).uses_cfg
    for field, value in (("cfg_scale", 1e30), ("cfg_scale", -1.0), ("temperature", 1e30), ("temperature", 0.0)):
        with pytest.raises(ValueError, match=rf"^{field}: got"):
            RolloutConfig(**{field: value})


def _start(*extra: str) -> Trainer:
    base = [
        "run.tensorboard=false",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "run.resume=never",
        "run.threads=1",
    ]
    return Trainer(load_config(None, [*base, *extra]), create_run_dir=False)


@pytest.mark.parametrize(
    "key, extra, message",
    [
        # the built-in model has 64 tokens; 10^9 steps ran until killed
        ("rollout.num_mask_steps", ["rollout.num_mask_steps=65"], "at most the model's 64 tokens"),
        ("rollout.num_mask_steps", ["rollout.num_mask_steps=1000000000"], "at most the model's 64 tokens"),
        ("backbone.diffusion_steps", ["backbone.diffusion_steps=100000000"], "got 100000000"),
        ("backbone.options", ["backbone.options={flow_shift: 3.0}"], "unknown option(s) flow_shift for backbone 'tiny'"),
        ("backbone.checkpoint", ["backbone.checkpoint=MISSING"], "no-such-model/config.json not found"),
        ("backbone.checkpoint", ["backbone.checkpoint=NOT_A_MODEL"], "config.json not found"),
        ("backbone.checkpoint", ["backbone.checkpoint=builtin:shapes-tinny"], "expected one of the shipped checkpoints"),
    ],
)
def test_a_bound_only_the_model_knows_fails_when_the_trainer_starts(tmp_path, key, extra, message):
    (tmp_path / "not-a-model").mkdir()
    paths = {"MISSING": str(tmp_path / "no-such-model"), "NOT_A_MODEL": str(tmp_path / "not-a-model")}
    extra = [e.replace("MISSING", paths["MISSING"]).replace("NOT_A_MODEL", paths["NOT_A_MODEL"]) for e in extra]
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        _start(*extra)
    assert str(err.value).startswith(f"{key}: ") and message in str(err.value), str(err.value)
    assert time.monotonic() - start < 60  # refused before any work, however large the value


@pytest.mark.parametrize("value", ["", "CWD_DIR", "no-such-model", "builtin:nope"])
def test_a_bad_checkpoint_is_one_line_and_exit_2_on_the_command_line(tmp_path, monkeypatch, capsys, value):
    """Was a traceback and exit 1 (the message itself was good)."""
    (tmp_path / "CWD_DIR").mkdir()
    monkeypatch.chdir(tmp_path)
    code = cli.main(
        [
            "train",
            "--config",
            str(EMPTY),
            f"backbone.checkpoint={value}",
            f"run.out_dir={tmp_path / 'run'}",
            "run.tensorboard=false",
            "rollout.num_mask_steps=4",
            "rollout.record_mask_steps=2",
        ]
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("margrpo train: error:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("margrpo train: error: backbone.checkpoint: "), err
    assert "Traceback" not in err


def test_reward_weightings_accepted_by_design_are_announced(capsys):
    assert reward_weight_notes({"shapes": 1.0}) == []
    notes = reward_weight_notes({"a": 1.0, "b": {"reward": "shapes", "weight": -1.0}, "c": 0})
    assert len(notes) == 2 and notes[0].startswith("rewards.c: weight 0") and "sum to 0" in notes[1]
    _start("rewards={shapes: 1.0, opposite: {reward: shapes, category: color, weight: -1.0}}")
    err = capsys.readouterr().err
    assert "[margrpo] warning: rewards: the weights sum to 0" in err


def test_seed_trajectories_that_nothing_reads_are_announced(capsys):
    _start("rollout.num_seeds=2", "grpo.mte=false")
    assert "[margrpo] warning: rollout.num_seeds is 2 but grpo.mte is false" in capsys.readouterr().err
    _start("rollout.num_seeds=2", "grpo.mte=true")
    _start("rollout.num_seeds=0", "grpo.mte=false")
    assert "rollout.num_seeds" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, deferred",
    [
        (("grpo.mte=true",), True),  # the seed chains past the committed tokens run for the MTE tokens alone
        (("grpo.mte=false",), False),
        (("grpo.mte=true", "grpo.mte_random_positions=1"), False),  # the update draws those: not known before
        (("grpo.mte=true", "rollout.seed_chains=commit"), False),
        (("grpo.mte=true", "grpo.estimator=matching"), False),
    ],
)
def test_the_trainer_defers_seed_chains_exactly_under_deterministic_mte(extra, deferred):
    from margrpo.train.step import step_rollout

    trainer = _start("rollout.num_seeds=2", "rollout.likelihood_positions=unknown", "grpo.prompts_per_step=1", "grpo.group_size=2", *extra)
    _, rollout = step_rollout(trainer, 0)
    assert (rollout.seed_recorded is not None) == deferred
    if deferred:  # some seed entries past the committed tokens are left out
        assert not bool(rollout.seed_recorded.all())


def test_the_prompt_tracker_uses_grpo_advantage_eps():
    trainer = _start("grpo.advantage=tracker", "grpo.advantage_eps=0.5")
    assert trainer.tracker.eps == 0.5

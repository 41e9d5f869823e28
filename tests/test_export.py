"""Getting a trained model out: `margrpo export` of a run checkpoint (trained tensors, EMA, LoRA merged)
into the family's layout, and `margrpo sample` / `eval` of a run, a run checkpoint or a model directory.
End to end on a tiny MAR trained for 2 GRPO steps (CPU, seconds)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_checkpoint
from safetensors.torch import load_file

from margrpo import cli
from margrpo.config import ConfigError
from margrpo.models import BackboneConfig, load_backbone
from margrpo.rewards import Reward, register
from margrpo.rollout import RolloutConfig, generate
from margrpo.train import checkpoint as ckpt
from margrpo.train.config import load_config
from margrpo.train.export import export
from margrpo.train.restore import EXPORT_FILE, restore_policy, run_checkpoint, trainer_config
from margrpo.train.trainer import Trainer

PROMPTS = ["a red circle", "two blue squares"]


@register("test_export_redness")
class Redness(Reward):
    """A dense toy reward, so that two GRPO steps surely move the weights (the verifier scores a random
    model 0 everywhere: no advantage, no update)."""

    def score(self, images, prompts, metadata):
        return images[:, 0].mean((1, 2)) - 0.5 * images[:, 1:].mean((1, 2, 3))


def run_overrides(base, out, *extra):
    return [
        f"backbone.checkpoint={base}",
        f"run.out_dir={out}",
        "run.tensorboard=false",
        "run.steps=2",
        "run.eval_every=0",
        "run.eval_per_category=1",
        "run.eval_samples_per_prompt=1",
        "run.save_every=0",
        "run.threads=1",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=2",
        "grpo.prompts_per_step=2",
        "optim.lr=1e-2",
        "grpo.kl_beta=0",
        "rewards={test_export_redness: 1.0}",
        *extra,
    ]


def train(base, out, *extra) -> Trainer:
    trainer = Trainer(load_config(None, run_overrides(base, out, *extra)))
    trainer.run()
    return trainer


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


@pytest.fixture(scope="module")
def ema_run(base, tmp_path_factory):
    """A 2-step run with an EMA (decay 0.5), and its trainer (the in-training policy)."""
    out = tmp_path_factory.mktemp("run") / "ema"
    return out, train(base, out, "run.ema_decay=0.5")


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "lora"
    return out, train(base, out, "grpo.lora.rank=2")


def tokens(model, seeds=(3, 4)):
    config = RolloutConfig(num_mask_steps=4, cfg_scale=2.0).generation_only()
    with torch.no_grad():
        return generate(model.eval(), PROMPTS, config, list(seeds), sampler=model.make_sampler()).tokens


def test_export_writes_the_trained_policy_in_the_shipped_layout(ema_run, base, tmp_path):
    run, trainer = ema_run
    out = export(run, tmp_path / "model")  # a run directory: its newest checkpoint
    assert sorted(p.name for p in out.iterdir()) == ["config.json", EXPORT_FILE, "model.safetensors"]
    assert json.loads((out / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    record = json.loads((out / EXPORT_FILE).read_text())
    assert (record["step"], record["weights"], record["backbone"]) == (2, "trained", "tiny")

    exported = load_backbone(BackboneConfig(name="tiny", checkpoint=str(out)))
    weights = load_file(str(out / "model.safetensors"))
    original = load_file(str(base / "model.safetensors"))
    assert weights.keys() == original.keys()
    assert not torch.equal(weights["token_embed.weight"], original["token_embed.weight"])  # training moved it
    assert torch.equal(weights["head.input_proj.weight"], original["head.input_proj.weight"])  # frozen head
    assert torch.equal(tokens(exported), tokens(trainer.policy))  # the same images as the in-training policy


def test_export_ema_writes_the_average_and_refuses_a_run_without_one(ema_run, lora_run, tmp_path):
    run, trainer = ema_run
    out = export(run / "checkpoints" / "step-00000002", tmp_path / "ema", ema=True)
    weights = load_file(str(out / "model.safetensors"))
    average = trainer.ema.state_dict()
    assert average and all(torch.equal(weights[name], value) for name, value in average.items())
    trained = dict(trainer.policy.named_parameters())
    assert not torch.equal(weights["token_embed.weight"], trained["token_embed.weight"])
    with pytest.raises(ConfigError, match="--ema: .* holds no EMA weights .*run.ema_decay: 0"):
        export(lora_run[0], tmp_path / "none", ema=True)


def test_lora_is_merged_into_the_base_weights(lora_run, base, tmp_path):
    run, trainer = lora_run
    adapters = {n: p for n, p in trainer.policy.named_parameters() if "lora_B" in n}
    assert adapters and any(p.abs().max() > 0 for p in adapters.values())  # trained away from B = 0
    out = export(run, tmp_path / "merged")
    assert json.loads((out / EXPORT_FILE).read_text())["lora_layers_merged"] == len(adapters)
    weights = load_file(str(out / "model.safetensors"))
    assert weights.keys() == load_file(str(base / "model.safetensors")).keys()  # no lora_* / base_layer names
    exported = load_backbone(BackboneConfig(name="tiny", checkpoint=str(out)))
    torch.testing.assert_close(tokens(exported), tokens(trainer.policy), rtol=1e-3, atol=2e-3)  # float32 merge
    # restoring without merging gives the in-training policy exactly
    checkpoint = run_checkpoint(run)
    unmerged = restore_policy(checkpoint, trainer_config(checkpoint, None, [])[0], merge=False)
    assert torch.equal(tokens(unmerged), tokens(trainer.policy))


def test_output_directory_rules(ema_run, tmp_path):
    run, _ = ema_run
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="OUT_DIR: .*taken: directory is not empty; pass --force"):
        export(run, taken)
    assert (taken / "keep.txt").is_file()
    export(run, taken, force=True)
    assert sorted(p.name for p in taken.iterdir()) == ["config.json", EXPORT_FILE, "model.safetensors"]
    with pytest.raises(ConfigError, match="RUN_CHECKPOINT .*not a run checkpoint .*step-XXXXXXXX"):
        export(taken, tmp_path / "other")


def test_the_config_comes_from_the_checkpoint_else_run_dir_else_config_option(ema_run, base, tmp_path):
    import shutil

    run, _ = ema_run
    copy = tmp_path / "copy" / "checkpoints" / "step-00000002"
    shutil.copytree(run / "checkpoints" / "step-00000002", copy)
    config, source = trainer_config(copy, None, [])
    assert str(copy) in source and config.run.ema_decay == 0.5
    # a checkpoint whose state.pt carries no config (an older trainer): <run>/config.yaml, else --config
    weights, state = ckpt.load(copy)
    del state["config"]
    bare = ckpt.save(tmp_path / "bare" / "checkpoints", 2, weights, state)
    with pytest.raises(ConfigError, match="--config: .* has no saved config"):
        trainer_config(bare, None, [])
    shutil.copy(run / "config.yaml", tmp_path / "bare" / "config.yaml")
    assert trainer_config(bare, None, [])[0].run.ema_decay == 0.5
    (tmp_path / "bare" / "config.yaml").unlink()
    given = tmp_path / "given.yaml"
    given.write_text(f"backbone: {{checkpoint: {base}}}\n")
    assert trainer_config(bare, str(given), ["run.ema_decay=0.25"])[0].run.ema_decay == 0.25


def test_sample_and_eval_take_a_run_a_checkpoint_or_a_model_directory(ema_run, lora_run, tmp_path, capsys):
    run, _ = ema_run
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    exported = export(run, tmp_path / "model")
    for i, source in enumerate([run, run / "checkpoints" / "step-00000002", exported]):
        out = tmp_path / f"samples{i}"
        argv = ["sample", "--checkpoint", str(source), "--prompts", str(prompts), "--out", str(out), "--per-prompt", "1", "--device", "cpu"]
        assert cli.main(argv) == 0
        assert (out / "grid.png").is_file()
    assert cli.main(["eval", "--checkpoint", str(exported), "run.device=cpu"]) == 0
    assert "heldout/reward=" in capsys.readouterr().out
    for source in (run, lora_run[0]):  # a LoRA run: merged, then the trainer adds its own (identity) adapters
        assert cli.main(["eval", "--checkpoint", str(source), "run.device=cpu"]) == 0
        assert "heldout/reward=" in capsys.readouterr().out


def test_checkpoint_errors_say_what_was_expected(ema_run, tmp_path, capsys):
    run, _ = ema_run
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    (tmp_path / "empty").mkdir()
    argv = ["sample", "--prompts", str(prompts), "--out", str(tmp_path / "o"), "--checkpoint"]
    assert cli.main([*argv, str(tmp_path / "empty")]) == 2
    error = capsys.readouterr().err
    assert "neither a run checkpoint (a step-XXXXXXXX directory with manifest.json" in error
    assert "tiny: config.json (TinyMARConfig) + model.safetensors" in error and "nova: model_index.json" in error
    assert cli.main([*argv, str(tmp_path / "absent")]) == 2
    assert "absent: no such file or directory" in capsys.readouterr().err
    broken = tmp_path / "broken"
    export(run, broken)
    (broken / "model.safetensors").unlink()
    assert cli.main([*argv, str(broken)]) == 2
    assert "broken/model.safetensors not found (expected a directory with config.json and model.safetensors" in capsys.readouterr().err
    # a run checkpoint where a model directory is expected (backbone.checkpoint) names `margrpo export`
    with pytest.raises(FileNotFoundError, match="is a training run or run checkpoint .*margrpo export"):
        load_backbone(BackboneConfig(name="tiny", checkpoint=str(run / "checkpoints" / "step-00000002")))

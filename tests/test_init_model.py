"""`margrpo init-model`: random-init presets written in their family's official layout load with
load_backbone and generate; exporting a run of a NOVA / Harmon model (a checkpoint with a modified
trained tensor, or LoRA adapters) writes that family's layout back with the change in it."""

from __future__ import annotations

import pytest
import torch
import yaml

from margrpo import cli
from margrpo.config import ConfigError, to_dict
from margrpo.models import BackboneConfig, load_backbone
from margrpo.models.directories import detect_family
from margrpo.models.init_model import PRESETS, init_model
from margrpo.rollout import RolloutConfig, generate
from margrpo.train import checkpoint as ckpt
from margrpo.train import lora as lora_utils
from margrpo.train.config import load_config
from margrpo.train.export import export
from margrpo.train.restore import restore_policy

TINY = {"shapes-tiny-random": "tiny", "nova-tiny": "nova", "harmon-tiny": "harmon"}
PROMPT = {"tiny": "a red circle", "nova": "a photo of a cat", "harmon": "a photo of a cat"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each small preset written once by init-model (seed 1)."""
    root = tmp_path_factory.mktemp("init")
    return {name: init_model(name, root / name, seed=1) for name in TINY}


def tokens(model, family, seeds=(5, 6)):
    config = RolloutConfig(num_mask_steps=3, cfg_scale=2.0).generation_only()
    with torch.no_grad():
        return generate(model.eval(), [PROMPT[family]] * 2, config, list(seeds), sampler=model.make_sampler(3)).tokens


@pytest.mark.parametrize("name", list(TINY))
def test_a_preset_loads_from_its_directory_and_generates(name, written):
    family = TINY[name]
    assert detect_family(written[name]) == family == PRESETS[name]
    model = load_backbone(BackboneConfig(name=family, checkpoint=str(written[name])))
    out = tokens(model, family)
    assert out.shape == (2, model.num_tokens, model.token_channels) and torch.isfinite(out).all()
    assert not torch.equal(out[0], out[1])  # two seeds, two samples
    again = init_model(name, written[name].parent / f"{name}-again", seed=1)  # the seed fixes the weights
    assert torch.equal(tokens(load_backbone(BackboneConfig(name=family, checkpoint=str(again))), family), out)


@pytest.mark.parametrize("name", ["nova-tiny", "harmon-tiny"])
def test_sample_detects_the_family_of_a_model_directory(name, written, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a cat\n")
    argv = [
        "sample",
        "--checkpoint",
        str(written[name]),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "out"),
        "--per-prompt",
        "1",
        "--device",
        "cpu",
        "pretrain.sampling.num_mask_steps=2",
        "backbone.diffusion_steps=2",
    ]
    assert cli.main(argv) == 0
    assert f"sampling {TINY[name]} {written[name]}" in capsys.readouterr().out
    assert (tmp_path / "out" / "grid.png").is_file()


def fake_run(root, family, checkpoint, lora_rank=0, options="{}"):
    """A run checkpoint of `family` as the trainer writes one: the trainable tensors (every trainable
    parameter of the backbone, the first one changed, or all when they include adapters: grpo.lora's or
    Harmon's own mar+lora) and the config."""
    config = load_config(
        None,
        [
            f"backbone.name={family}",
            f"backbone.checkpoint={checkpoint}",
            f"backbone.options={options}",
            f"grpo.lora.rank={lora_rank}",
            "grpo.kl_beta=0",
        ],
    )
    policy = load_backbone(config.backbone)
    gen = torch.Generator().manual_seed(0)
    if lora_rank:
        lora_utils.apply_lora(policy, lora_rank)
        trainable = lora_utils.adapter_parameters(policy)
    else:
        trainable = policy.trainable_parameters()
    ids = {id(p) for p in trainable}
    weights = {n: p.detach().clone() for n, p in policy.named_parameters() if id(p) in ids}
    adapted = any("lora_" in name for name in weights)
    for i, (name, value) in enumerate(weights.items()):
        if adapted or i == 0:
            value.add_(torch.randn(value.shape, generator=gen) * 0.1)
    state = {"step": 7, "config": yaml.safe_dump(to_dict(config), sort_keys=False), "ema": None}
    ckpt.save(root / "checkpoints", 7, weights, state)
    return config, weights


@pytest.mark.parametrize("name", ["nova-tiny", "harmon-tiny"])
def test_export_round_trip_of_a_changed_weight(name, written, tmp_path):
    family = TINY[name]
    _, weights = fake_run(tmp_path / "run", family, written[name])
    changed = next(iter(weights))
    out = export(tmp_path / "run", tmp_path / "model")
    assert detect_family(out) == family
    exported = load_backbone(BackboneConfig(name=family, checkpoint=str(out)))
    original = load_backbone(BackboneConfig(name=family, checkpoint=str(written[name])))
    state, before = exported.state_dict(), original.state_dict()
    assert torch.equal(state[changed], weights[changed]) and not torch.equal(before[changed], weights[changed])
    assert all(torch.equal(state[k], before[k]) for k in before if k != changed)


@pytest.mark.parametrize(
    "name, rank, options", [("nova-tiny", 2, "{}"), ("harmon-tiny", 2, "{}"), ("harmon-tiny", 0, "{trainable: mar+lora, lora_rank: 2}")]
)
def test_lora_merge_generates_what_the_adapted_policy_does(name, rank, options, written, tmp_path):
    family = TINY[name]
    config, weights = fake_run(tmp_path / "run", family, written[name], rank, options)
    assert any("lora_B" in k for k in weights)
    out = export(tmp_path / "run", tmp_path / "model")
    exported = load_backbone(BackboneConfig(name=family, checkpoint=str(out)))
    assert not any("lora_" in k or "base_layer" in k for k in exported.state_dict())
    adapted = restore_policy(ckpt.latest(tmp_path / "run" / "checkpoints"), config, merge=False)
    assert lora_utils.has_adapters(adapted)
    expected = tokens(adapted, family)
    # float32 merge rounding, amplified along the sampling chain: close, not equal
    torch.testing.assert_close(tokens(exported, family), expected, rtol=1e-3, atol=2e-3)
    original = load_backbone(BackboneConfig(name=family, checkpoint=str(written[name])))
    assert (tokens(original, family) - expected).abs().max() > 0.05  # the adapters change the samples


def test_init_model_errors_and_help(written, tmp_path, capsys):
    assert cli.main(["init-model", "nova-huge", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert "PRESET: got 'nova-huge', expected one of shapes-tiny-random, nova-tiny" in error and "harmon-tiny" in error
    with pytest.raises(SystemExit):
        cli.main(["init-model", "--help"])
    usage = capsys.readouterr().out
    assert all(name in usage for name in PRESETS)
    assert cli.main(["init-model", "nova-tiny", str(written["shapes-tiny-random"])]) == 2
    assert "directory is not empty; pass --force" in capsys.readouterr().err
    assert detect_family(written["shapes-tiny-random"]) == "tiny"  # left as it was
    with pytest.raises(ConfigError, match="PRESET"):
        init_model("tiny", tmp_path / "y")


def test_missing_nova_and_harmon_checkpoints_point_to_init_model(tmp_path):
    for family in ("nova", "harmon"):
        with pytest.raises(FileNotFoundError, match=f"margrpo init-model {family}-tiny DIR"):
            load_backbone(BackboneConfig(name=family, checkpoint=str(tmp_path / "absent")))


def test_model_directories_never_replace_a_shipped_checkpoint_or_a_non_empty_one(tmp_path):
    from margrpo.checkpoints import BUILTIN_DIR
    from margrpo.models.directories import write_directory
    from margrpo.train import pretrain

    shipped = BUILTIN_DIR / "shapes-tiny"
    for backbone, settings in [
        (BackboneConfig(checkpoint=str(shipped)), pretrain.PretrainConfig()),
        (BackboneConfig(), pretrain.PretrainConfig(out=str(shipped))),
    ]:
        with pytest.raises(ValueError, match="inside the package's shipped checkpoints"):
            pretrain.output_dir(backbone, settings, force=True)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "old.txt").write_text("x")
    with pytest.raises(ConfigError, match="pretrain.out: .*taken: directory is not empty; pass --force"):
        pretrain.output_dir(BackboneConfig(), pretrain.PretrainConfig(out=str(taken)))
    assert pretrain.output_dir(BackboneConfig(), pretrain.PretrainConfig(out=str(taken)), force=True) == taken

    def fail(tmp):
        (tmp / "partial").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):  # a failed write leaves the old directory alone
        write_directory(taken, fail, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and (taken / "old.txt").is_file()
    write_directory(taken, lambda tmp: (tmp / "new.txt").write_text("y"), force=True)
    assert sorted(p.name for p in taken.iterdir()) == ["new.txt"]

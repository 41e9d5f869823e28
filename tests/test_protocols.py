"""The head and backbone protocols checked on every implementation, the backbone registry, and the
one loading path that lets `margrpo sample` and `margrpo eval` run every backbone (tiny random-init
NOVA and Harmon presets on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from margrpo.config import ConfigError
from margrpo.conformance import protocol_mismatches
from margrpo.heads import DiffusionHead, adapt, mar_head, nova_head
from margrpo.models import (
    BackboneConfig,
    MARBackbone,
    TinyMAR,
    available_backbones,
    backbone_loader,
    load_backbone,
    register_backbone,
)
from margrpo.models import harmon, nova
from margrpo.sample import main as sample_main
from margrpo.train import evaluate, pretrain
from margrpo.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nova_dir(tmp_path_factory) -> Path:
    return nova.save_preset("nova-tiny", tmp_path_factory.mktemp("nova") / "nova-tiny", seed=3)


@pytest.fixture(scope="module")
def harmon_dir(tmp_path_factory) -> Path:
    model = harmon.build("harmon-tiny", seed=2)
    return harmon.save_pretrained(model, tmp_path_factory.mktemp("harmon") / "harmon-tiny")


@pytest.fixture(scope="module")
def backbones(nova_dir, harmon_dir) -> dict[str, MARBackbone]:
    return {
        "tiny": load_backbone(BackboneConfig()),
        "nova": load_backbone(BackboneConfig(name="nova", checkpoint=str(nova_dir))),
        "harmon": load_backbone(BackboneConfig(name="harmon", checkpoint=str(harmon_dir))),
    }


# ------------------------------------------------------------------ protocols
def test_every_head_implements_the_head_protocol(backbones):
    heads = {"mar_b": mar_head("mar_b", token_channels=4), "nova": nova_head("mlp_d3w1280", cond_dim=32)}
    heads.update({f"{name} backbone": b.head for name, b in backbones.items()})
    for name, head in heads.items():
        assert isinstance(head, DiffusionHead), name
        assert protocol_mismatches(head, DiffusionHead) == [], name
        assert adapt(head) is head, name


def test_every_backbone_implements_the_backbone_protocol(backbones):
    assert isinstance(backbones["tiny"], TinyMAR)
    assert isinstance(backbones["nova"], nova.NovaBackbone) and isinstance(backbones["harmon"], harmon.Harmon)
    for name, backbone in backbones.items():
        assert isinstance(backbone, MARBackbone), name
        assert protocol_mismatches(backbone, MARBackbone) == [], name
        assert not backbone.training, name  # load_backbone returns eval mode


def test_the_conformance_check_finds_what_is_wrong():
    class Partial:
        in_channels = out_channels = z_channels = 4

        def embed_condition(self, condition):  # renamed parameter
            return condition

        def modulation(self, cond, t, extra):  # an extra required parameter
            return cond

        def denoise(self, x, modulation, backend):  # the protocol's default is missing
            return x

    problems = protocol_mismatches(Partial(), DiffusionHead)
    assert any(p.startswith("embed_condition: got parameters (condition)") for p in problems), problems
    assert any(p.startswith("modulation: extra required parameters ['extra']") for p in problems), problems
    assert any(p.startswith("denoise: parameters ['backend'] need a default") for p in problems), problems
    del Partial.denoise
    assert not isinstance(Partial(), DiffusionHead)
    assert "denoise: missing" in protocol_mismatches(Partial(), DiffusionHead)


# ------------------------------------------------------------------ registry and config
def test_registry_lists_the_families_and_registers_new_ones(tmp_path):
    assert {"tiny", "nova", "harmon"} <= set(available_backbones())
    assert backbone_loader("nova") is nova.load and backbone_loader("harmon") is harmon.load
    with pytest.raises(KeyError, match="backbone.name: got 'nope', expected one of"):
        backbone_loader("nope")
    with pytest.raises(ConfigError, match="backbone.name: got 'nope', expected a registered backbone"):
        load_config(None, ["backbone.name=nope"])

    calls = []

    @register_backbone("test-tiny-copy")
    def load_copy(checkpoint, *, device, dtype, scale=1.0):
        calls.append((checkpoint, device, dtype, scale))
        return TinyMAR.load(checkpoint, map_location=device)

    with pytest.raises(ValueError, match="already taken"):
        register_backbone("test-tiny-copy", lambda *a, **k: None)
    config = load_config(None, ["backbone.name=test-tiny-copy", "backbone.options={scale: 2.0}"])
    model = load_backbone(config.backbone)
    assert isinstance(model, TinyMAR) and not model.training
    ((checkpoint, device, dtype, scale),) = calls
    assert checkpoint.name == "shapes-tiny" and (checkpoint / "model.safetensors").is_file()
    assert (device, dtype, scale) == (torch.device("cpu"), torch.float32, 2.0)


def test_the_retired_model_section_names_the_new_keys(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  kind: tiny\n  path: checkpoints/shapes-tiny\n")
    for load in (
        lambda: load_config(old),
        lambda: pretrain.main(["--config", str(old)]),
        lambda: sample_main(["--config", str(old), "--prompts", str(old), "--out", str(tmp_path)]),
    ):
        with pytest.raises(ConfigError, match=r"model.path -> backbone.checkpoint.*model.arch -> pretrain.arch"):
            load()


def test_builtin_checkpoint_names_resolve_or_list_the_shipped_ones():
    from margrpo.checkpoints import builtin_checkpoints, resolve_checkpoint

    assert builtin_checkpoints() == ["shapes-tiny"]
    assert (resolve_checkpoint("builtin:shapes-tiny") / "config.json").is_file()
    assert resolve_checkpoint("some/dir") == Path("some/dir")
    with pytest.raises(FileNotFoundError, match="expected one of the shipped checkpoints builtin:shapes-tiny"):
        resolve_checkpoint("builtin:shapes-huge")


def test_pretrain_never_overwrites_a_shipped_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="pretrain.out: not set"):
        pretrain.output_dir(BackboneConfig(), pretrain.PretrainConfig())
    assert pretrain.output_dir(BackboneConfig(checkpoint=str(tmp_path)), pretrain.PretrainConfig()) == tmp_path
    with pytest.raises(ValueError, match="backbone.name: got 'nova', expected 'tiny'"):
        pretrain.output_dir(BackboneConfig(name="nova"), pretrain.PretrainConfig(out=str(tmp_path)))


# ------------------------------------------------------------------ sample and eval for every backbone
SMALL_ROLLOUT = {"num_mask_steps": 3, "cfg_scale": 2.0, "num_seeds": 0, "record_mask_steps": 0, "record_diffusion_steps": 1}


def _config(tmp_path, name: str, checkpoint) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {  # JSON is YAML
                "backbone": {"name": name, "checkpoint": str(checkpoint), "diffusion_steps": 3},
                "rollout": SMALL_ROLLOUT,
                "rewards": {"jpeg_incompressibility": 1.0},
                "run": {
                    "device": "cpu",
                    "eval_per_category": 1,
                    "eval_samples_per_prompt": 1,
                    "tensorboard": False,
                    "out_dir": str(tmp_path / "run"),
                },
            }
        )
    )
    return path


@pytest.mark.parametrize("name", ["nova", "harmon"])
def test_sample_and_eval_run_every_backbone(name, tmp_path, capsys, nova_dir, harmon_dir, backbones):
    checkpoint = {"nova": nova_dir, "harmon": harmon_dir}[name]
    config = _config(tmp_path, name, checkpoint)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a cat\na red car\n")
    assert (
        sample_main(
            ["--config", str(config), "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--per-prompt", "2", "--device", "cpu"]
        )
        == 0
    )
    size = backbones[name].decode(torch.zeros(1, backbones[name].num_tokens, backbones[name].token_channels)).shape[-1]
    row = Image.open(tmp_path / "out" / "000.png")
    assert row.size == (2 * size * 4, size * 4 + 14) and (tmp_path / "out" / "001.png").is_file()
    assert f"sampling {name} {checkpoint} with the rollout settings" in capsys.readouterr().out

    assert evaluate.main(["--config", str(config)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("heldout/reward=") and float(line.split("=")[1]) > 0, line  # JPEG size: positive

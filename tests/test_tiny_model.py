"""The tiny ShapesWorld MAR: protocol, tokenizer, checkpoints, pretraining pieces, sampling CLI, and
the shipped checkpoint's held-out quality."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from margrpo.heads import reinit_zero_layers_
from margrpo.models import BackboneConfig, MARBackbone, TinyMAR, TinyMARConfig, load_backbone
from margrpo.models.tiny import RelativePositionBias
from margrpo.sample import SampleConfig, generate_images
from margrpo.sample import main as sample_main
from margrpo.testbed import balanced_prompts, evaluate, render_batch
from margrpo.train import pretrain

ROOT = Path(__file__).resolve().parents[1]
SMALL = TinyMARConfig(width=32, depth=1, num_heads=2, head_width=32, head_depth=1, diffusion_steps=4, relative_position_bias=True)


def small_model(seed: int = 0, config: TinyMARConfig = SMALL) -> TinyMAR:
    """A random small TinyMAR whose head is not the all-zero adaLN-Zero init."""
    torch.manual_seed(seed)
    model = TinyMAR(config)
    reinit_zero_layers_(model.head, 0.1)
    return model.eval()


# ---------------------------------------------------------------- protocol and shapes


def test_implements_the_backbone_protocol_and_freezes_only_the_head():
    model = small_model()
    assert isinstance(model, MARBackbone)
    assert (model.num_tokens, model.token_channels) == (64, 48)
    trainable = {id(p) for p in model.trainable_parameters()}
    head = {id(p) for p in model.head.parameters()}
    assert not trainable & head
    assert trainable | head == {id(p) for p in model.parameters()}


def test_patchify_and_decode_are_inverse():
    model = small_model()
    images = render_batch(["a red square", "three cyan circles"], 0)
    tokens = model.encode_images(images)
    assert tokens.shape == (2, 64, 48) and tokens.min() >= -1 and tokens.max() <= 1
    torch.testing.assert_close(model.decode(tokens), images)
    # token 0 is the top-left 4x4 patch, channel-major (c, row, col) as in MAR's patchify
    torch.testing.assert_close(tokens[0, 0].view(3, 4, 4), images[0, :, :4, :4] * 2 - 1)


def test_forward_z_reads_prompt_and_known_tokens_and_ignores_padding():
    model = small_model()
    canvas = torch.randn(2, 64, 48)
    known = torch.rand(2, 64) < 0.5
    prompts = ["a red square", "a blue circle left of a green triangle"]
    z = model.forward_z(model.encode_prompts(prompts), canvas, known)
    assert z.shape == (2, 64, 32)
    # the short prompt alone (no padding) gives the same z as inside the padded batch
    alone = model.forward_z(model.encode_prompts(prompts[:1]), canvas[:1], known[:1])
    torch.testing.assert_close(alone, z[:1], rtol=1e-5, atol=1e-5)
    # unknown positions' values are never read; known ones are
    scrambled = torch.where(known[..., None], canvas, torch.randn(2, 64, 48))
    torch.testing.assert_close(model.forward_z(model.encode_prompts(prompts), scrambled, known), z)
    changed = torch.where(known[..., None], torch.randn(2, 64, 48), canvas)
    assert not torch.allclose(model.forward_z(model.encode_prompts(prompts), changed, known), z)
    other = model.forward_z(model.encode_prompts(["a red circle", prompts[1]]), canvas, known)
    assert not torch.allclose(other[0], z[0])


def test_relative_position_bias_depends_only_on_the_grid_offset():
    bias = RelativePositionBias(grid=8, num_heads=4)
    with torch.no_grad():
        bias.table.normal_()  # any learned table
    full = bias(prompt_length=3)
    assert full.shape == (4, 67, 67)
    assert torch.all(full[:, :3] == 0) and torch.all(full[:, :, :3] == 0)  # prompt tokens: no bias
    image = full[:, 3:, 3:].reshape(4, 8, 8, 8, 8)  # [H, row_i, col_i, row_j, col_j]
    # token (2, 3) -> (4, 1) and token (5, 6) -> (7, 4) share the offset (2, -2)
    torch.testing.assert_close(image[:, 2, 3, 4, 1], image[:, 5, 6, 7, 4])
    assert not torch.allclose(image[:, 2, 3, 4, 1], image[:, 2, 3, 4, 2])
    fresh = RelativePositionBias(grid=8, num_heads=4)(0)  # init: head 0 global, the others decay with distance
    assert torch.all(fresh[0] == 0) and fresh[3, 0, 1] == -2.0 and fresh[3, 0, 9] < fresh[3, 0, 1]


def test_forward_z_rejects_wrong_shapes():
    model = small_model()
    prompts = model.encode_prompts(["a red square"])
    with pytest.raises(ValueError, match=r"canvas: got shape \(1, 63, 48\)"):
        model.forward_z(prompts, torch.zeros(1, 63, 48), torch.zeros(1, 63, dtype=torch.bool))
    with pytest.raises(ValueError, match="known: got torch.float32"):
        model.forward_z(prompts, torch.zeros(1, 64, 48), torch.zeros(1, 64))


# ---------------------------------------------------------------- tokenizer


def test_unknown_words_and_empty_prompts_raise_value_errors_naming_them():
    model = small_model()
    with pytest.raises(ValueError, match=r"'purple'.*'hexagon'"):
        model.encode_prompts(["a red square", "a purple hexagon"])
    with pytest.raises(ValueError, match="empty prompt"):
        model.encode_prompts(["a red square", "  "])
    with pytest.raises(ValueError, match="non-empty list"):
        model.encode_prompts([])
    with pytest.raises(ValueError, match="at most 12"):
        model.encode_prompts(["a red square and a blue circle and a red circle and a"])


def test_negative_prompt_encodes_and_mask_marks_padding():
    model = small_model()
    batch = model.encode_prompts([model.negative_prompt(), "A Red  square"])
    assert batch.mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.embeds.shape == (2, 3, 32)


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("relative_position_bias", [False, True])
def test_save_load_round_trip_is_exact(tmp_path, relative_position_bias):
    model = small_model(seed=3, config=dataclasses.replace(SMALL, relative_position_bias=relative_position_bias))
    model.save(tmp_path / "ckpt")
    loaded = TinyMAR.load(tmp_path / "ckpt")
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    canvas, known = torch.randn(1, 64, 48), torch.rand(1, 64) < 0.3
    prompts = ["two yellow triangles"]
    assert torch.equal(
        model.forward_z(model.encode_prompts(prompts), canvas, known), loaded.forward_z(loaded.encode_prompts(prompts), canvas, known)
    )


def test_wrong_shape_checkpoint_lists_the_mismatches(tmp_path):
    small_model(config=dataclasses.replace(SMALL, width=16, num_heads=2)).save(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["width"] = 32  # the weights are width 16
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    expected = r"shape mismatches: .*word_embed.weight: checkpoint \(\d+, 16\), model \(\d+, 32\)"
    with pytest.raises(ValueError, match=expected):
        TinyMAR.load(tmp_path / "ckpt")


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    small_model(config=dataclasses.replace(SMALL, depth=2)).save(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["depth"], config["head_depth"] = 1, 2  # one block too many in the file, one head block too few
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing keys \['head.res_blocks.1.*unexpected keys \['blocks.1."):
        TinyMAR.load(tmp_path / "ckpt")


def test_load_errors_name_missing_files_and_unknown_config_keys(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        TinyMAR.load(tmp_path)
    small_model().save(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "widht": 3}))
    with pytest.raises(ValueError, match="widht"):
        TinyMAR.load(tmp_path / "ckpt")


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="patch_size"):
        TinyMARConfig(image_size=32, patch_size=5)
    with pytest.raises(ValueError, match="num_heads"):
        TinyMARConfig(width=30, num_heads=4)


# ---------------------------------------------------------------- pretraining pieces


def test_mask_ratios_and_masks():
    generator = torch.Generator().manual_seed(0)
    cosine = pretrain.sample_mask_ratios("cosine", 4000, 0.7, generator)
    assert 0 <= cosine.min() and cosine.max() <= 1
    assert abs(cosine.mean().item() - 2 / np.pi) < 0.02  # E[cos(pi/2 u)] = 2/pi
    trunc = pretrain.sample_mask_ratios("truncnorm", 4000, 0.7, generator)
    assert trunc.min() >= 0.7 and trunc.max() <= 1 and trunc.std() > 0.05
    masks = pretrain.random_masks(torch.tensor([0.0, 0.5, 0.51, 1.0]), 64, generator)
    assert masks.sum(1).tolist() == [1, 32, 33, 64]


def test_diffusion_loss_trains_transformer_and_head():
    model = small_model().train()
    sampler = model.make_sampler()
    tokens = model.encode_images(render_batch(["a red square", "two blue circles"], 0))
    masked = torch.rand(2, 64) < 0.5
    z = model.forward_z(model.encode_prompts(["a red square", "two blue circles"]), tokens, ~masked)
    loss = pretrain.diffusion_loss(model, sampler, z, tokens, masked, 2, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss)
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == [], no_grad


def test_pretrain_cli_writes_a_loadable_checkpoint_and_metrics(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "backbone": {"name": "tiny", "checkpoint": str(tmp_path / "model")},
                "pretrain": {
                    "arch": dataclasses.asdict(SMALL),
                    "steps": 3,
                    "batch_size": 4,
                    "warmup_steps": 1,
                    "eval_every": 2,
                    "eval_per_category": 1,
                    "final_eval_per_category": 1,
                    "sampling": {"num_mask_steps": 4, "cfg_scale": 2.0},
                },
                "rollout": {"num_mask_steps": 8},  # another job's section: ignored here
            }
        )
    )
    assert pretrain.main(["--config", str(config), "pretrain.lr=3e-3"]) == 0
    model = load_backbone(BackboneConfig(checkpoint=str(tmp_path / "model")))
    assert model.config == SMALL
    metrics = json.loads((tmp_path / "model" / "pretrain_metrics.json").read_text())
    assert [e["step"] for e in metrics["evals"]] == [2, 3]
    assert metrics["config"]["pretrain"]["lr"] == 3e-3
    assert all(0 <= metrics["evals"][-1][k] <= 1 for k in ("color", "shape", "count", "overall"))


def test_pretrain_rejects_unknown_keys(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("pretrain:\n  stpes: 3\n")
    with pytest.raises(ValueError, match="pretrain.stpes"):
        pretrain.main(["--config", str(config)])


# ---------------------------------------------------------------- sampling CLI


def test_sample_cli_writes_captioned_grids(tmp_path):
    small_model().save(tmp_path / "model")
    config = tmp_path / "c.yaml"
    config.write_text(f"backbone:\n  checkpoint: {tmp_path / 'model'}\npretrain:\n  sampling:\n    num_mask_steps: 4\n")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square\n\ntwo blue circles\n")
    assert sample_main(["--config", str(config), "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--per-prompt", "3"]) == 0
    rows = sorted((tmp_path / "out").glob("[0-9]*.png"))
    assert [p.name for p in rows] == ["000.png", "001.png"]
    row = Image.open(rows[0])
    assert row.size == (3 * 32 * 4, 32 * 4 + 14)
    assert np.asarray(row)[:14].min() < 128  # the caption strip holds dark text
    assert Image.open(tmp_path / "out" / "grid.png").size == (row.width, 2 * row.height)


def test_sample_cli_rejects_an_empty_prompt_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("backbone:\n  checkpoint: nowhere\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match=r"--prompts: .*empty.txt holds no prompts"):
        sample_main(["--config", str(config), "--prompts", str(empty), "--out", str(tmp_path / "out")])


def test_generation_is_seeded():
    model = small_model()
    settings = SampleConfig(num_mask_steps=4).rollout_config()
    a = generate_images(model, ["a red square"] * 2, settings, seeds=[5, 6])
    b = generate_images(model, ["a red square"] * 2, settings, seeds=[5, 6])
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])


# ---------------------------------------------------------------- the shipped checkpoint


def test_shipped_checkpoint_scores_in_its_documented_band():
    """margrpo/checkpoints/shapes-tiny/README.md: 16 balanced held-out prompts, seeds 0..15, pretrain.sampling
    settings -> overall 0.372, color 0.542 when measured; the band is loose (other torch builds and
    thread counts change samples), but an untrained (~0.03) or broken model falls far outside it."""
    model = load_backbone(BackboneConfig())  # the default: builtin:shapes-tiny
    prompts = balanced_prompts("heldout", 4)
    images = generate_images(model, prompts, SampleConfig().rollout_config(), seeds=list(range(len(prompts))))
    summary = evaluate(images, prompts)
    assert 0.20 <= summary["overall"] <= 0.60, summary
    assert summary["color"] >= 0.35, summary

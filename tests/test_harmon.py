"""Harmon backbone (margrpo.models.harmon) on tiny random-init models of the official layout (CPU).

The forward pass is checked against a literal transcription of the official algorithm (one LLM pass
over [prompt ; image] without a cache, masked tokens dropped by boolean indexing), the blocks against
timm, loading against files written in the released layouts, and the whole backbone through the
shared rollout and trainer.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import load_script
from margrpo.models import harmon
from margrpo.models.base import MARBackbone
from margrpo.models.harmon.mar import MAR, Block
from margrpo.models.harmon.vae import AttnBlock, AutoencoderKL
from margrpo.rollout import RolloutConfig, choose_plan, generate, harmon_schedule, mask_schedule, rollout_logprob
from margrpo.rollout.guidance import prompt_rows

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a red cube on a table", "two cats", "a red cube on a table", "a very long prompt about a small boat"]


@pytest.fixture(scope="module")
def tiny():
    """A float64 harmon-tiny (exact comparisons), eval mode."""
    return harmon.build("harmon-tiny", dtype=torch.float64, seed=1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """harmon-tiny (float32) saved in the Hugging Face layout, and the model itself."""
    model = harmon.build("harmon-tiny", seed=2)
    return harmon.save_pretrained(model, tmp_path_factory.mktemp("harmon") / "Harmon-tiny"), model


def twin(model, **options):
    """A copy of `model` with other constructor options (same weights), eval mode."""
    other = harmon.Harmon(model.config, model.tokenizer, **options).to(next(model.parameters()).dtype)
    other.load_state_dict(model.state_dict())
    return other.eval()


def random_state(model, batch: int, known_count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    canvas = torch.randn(batch, model.num_tokens, model.token_channels, generator=gen, dtype=torch.float64)
    known = torch.zeros(batch, model.num_tokens, dtype=torch.bool)
    for row in range(batch):
        known[row, torch.randperm(model.num_tokens, generator=gen)[:known_count]] = True
    return canvas, known


def official_forward_z(model, prompts, canvas, known):
    """The official computation, transcribed step by step (wusize/Harmon harmon.py + mar.py)."""
    mar, cfg = model.mar, model.config
    buffer, side, learned = cfg.mar.buffer_size, cfg.grid, cfg.mar.seq_side
    batch, length, _ = canvas.shape
    mask = (~known).to(canvas.dtype)  # 1 = unknown

    def interpolate(table, buffer_size):
        image = table[:, buffer_size:].reshape(1, learned, learned, -1).permute(0, 3, 1, 2)
        image = F.interpolate(image, size=(side, side), mode="bilinear").flatten(2).transpose(1, 2)
        return torch.cat([table[:, :buffer_size], image], 1)

    x = mar.z_proj(canvas)
    embed = x.shape[-1]
    x = torch.cat([x.new_zeros(batch, buffer, embed), x], dim=1)
    mask_with_buffer = torch.cat([mask.new_zeros(batch, buffer), mask], dim=1)
    x[:, :buffer] = mar.fake_latent.expand(batch, -1).view(batch, -1, embed)
    x = mar.z_proj_ln(x + interpolate(mar.encoder_pos_embed_learned, buffer))
    x = x[(1 - mask_with_buffer).nonzero(as_tuple=True)].reshape(batch, -1, embed)
    for block in mar.encoder_blocks:
        x = block(x)
    x_enc = mar.encoder_norm(x)
    z_enc = model.proj_in(x_enc)
    z_enc = torch.cat([z_enc[:, buffer:], z_enc[:, :buffer]], dim=1)
    full_mask = torch.cat([prompts.mask, prompts.mask.new_ones(batch, z_enc.shape[1])], 1)
    positions = (full_mask.long().cumsum(1) - 1).clamp(min=0)
    out = model.llm.model(
        inputs_embeds=torch.cat([prompts.embeds, z_enc], 1), attention_mask=full_mask, position_ids=positions, use_cache=False
    )
    z_llm = out.last_hidden_state[:, -z_enc.shape[1] :]
    z_llm = torch.cat([z_llm[:, -buffer:], z_llm[:, :-buffer]], dim=1)
    x = mar.decoder_embed(x_enc + model.proj_out(z_llm))
    x_after_pad = mar.mask_token.repeat(batch, buffer + length, 1).to(x.dtype)
    x_after_pad[(1 - mask_with_buffer).nonzero(as_tuple=True)] = x.reshape(-1, x.shape[-1])
    x = x_after_pad + interpolate(mar.decoder_pos_embed_learned, buffer)
    for block in mar.decoder_blocks:
        x = block(x)
    x = mar.decoder_norm(x)[:, buffer:]
    return x + interpolate(mar.diffusion_pos_embed_learned, 0)


# ---------------------------------------------------------------------- architecture
def test_real_size_parts_and_official_names():
    config = harmon.preset("harmon-1.5b")
    assert config.grid == 32 and config.mar.seq_side == 16 and config.mar.buffer_size == 64
    assert (config.llm["hidden_size"], config.llm["num_hidden_layers"], config.llm["num_key_value_heads"]) == (1536, 28, 2)
    with torch.device("meta"):
        mar, vae = MAR(config.mar), AutoencoderKL(config.vae)
    assert len(mar.encoder_blocks) == len(mar.decoder_blocks) == 20
    assert mar.encoder_pos_embed_learned.shape == (1, 16 * 16 + 64, 1280)
    head = mar.diffloss.net
    assert (head.num_res_blocks, head.model_channels, head.out_channels, head.z_channels) == (12, 1536, 32, 1280)
    assert 150e6 < sum(p.numel() for p in head.parameters()) < 152e6  # MAR-H head: about 151 M
    names = set(mar.state_dict()) | {f"vae.{k}" for k in vae.state_dict()}
    for key in (
        "encoder_blocks.19.attn.qkv.weight",
        "decoder_blocks.0.mlp.fc2.bias",
        "diffloss.net.res_blocks.11.mlp.2.weight",
        "diffloss.net.final_layer.adaLN_modulation.1.weight",
        "fake_latent",
        "class_emb.weight",
        "vae.encoder.down.4.attn.1.q.weight",
        "vae.encoder.down.2.block.0.nin_shortcut.weight",
        "vae.decoder.up.1.block.0.nin_shortcut.weight",
        "vae.decoder.up.3.upsample.conv.weight",
        "vae.encoder.mid.attn_1.proj_out.bias",
    ):
        assert key in names, key
    assert "vae.encoder.down.4.downsample.conv.weight" not in names and "vae.decoder.up.0.upsample.conv.weight" not in names


def test_blocks_match_timm():
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(0)
    ours = Block(32, 4, 4.0, attn_drop=0.0, proj_drop=0.0).double()
    theirs = timm_vit.Block(32, 4, 4.0, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6)).double()
    theirs.load_state_dict(ours.state_dict())  # same parameter names, strict
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)


def test_vae_attention_is_the_ldm_formula():
    torch.manual_seed(0)
    block = AttnBlock(32).double()
    x = torch.randn(2, 32, 3, 5, dtype=torch.float64)
    h = block.norm(x)
    q, k, v = (conv(h).flatten(2) for conv in (block.q, block.k, block.v))  # [b, c, hw]
    weights = torch.softmax(torch.bmm(q.transpose(1, 2), k) * 32**-0.5, dim=2)  # [b, hw_q, hw_k]
    expected = x + block.proj_out(torch.bmm(v, weights.transpose(1, 2)).reshape(x.shape))
    torch.testing.assert_close(block(x), expected, rtol=1e-12, atol=1e-12)


def test_is_a_mar_backbone_with_harmon_defaults(tiny):
    assert isinstance(tiny, MARBackbone)
    assert tiny.negative_prompt() == "Generate an image."
    assert tiny.format_prompt("a cat") == "<|im_start|>user\nGenerate an image: a cat<|im_end|>\n<|im_start|>assistant\n"
    assert tiny.format_prompt("Generate an image.") == "<|im_start|>user\nGenerate an image.<|im_end|>\n<|im_start|>assistant\n"
    assert (tiny.num_tokens, tiny.token_channels) == (36, 16)
    assert tiny.head is tiny.mar.diffloss.net
    sampler = tiny.make_sampler()
    assert sampler.num_steps == 4 and sampler.out_channels(16) == 32  # checkpoint default, learned-range variance
    assert tiny.make_sampler(3).num_steps == 3


@pytest.mark.parametrize("bad", [[], "a cat", ["a cat", ""], ["a cat", 3]])
def test_encode_prompts_rejects_bad_input(tiny, bad):
    with pytest.raises(ValueError, match="prompts"):
        tiny.encode_prompts(bad)


# ---------------------------------------------------------------------- forward_z and the KV cache
def test_forward_z_matches_official_and_prompt_cache_never_grows(tiny):
    prompts = tiny.encode_prompts(PROMPTS)
    assert not prompts.mask.all()  # prompts of different lengths: right padding is exercised
    length = prompts.embeds.shape[1]
    with torch.no_grad():
        for count, seed in ((0, 0), (7, 1), (35, 2), (7, 3)):
            canvas, known = random_state(tiny, len(PROMPTS), count, seed)
            z = tiny.forward_z(prompts, canvas, known)
            torch.testing.assert_close(z, official_forward_z(tiny, prompts, canvas, known), rtol=1e-10, atol=1e-10)
            state = tiny._prompt_cache.state
            assert state.batch() is prompts
            assert all(k.shape[2] == v.shape[2] == length for k, v in state.kv.tensors)


def test_cached_prompt_kv_is_recomputed_after_a_weight_update(tiny):
    model = twin(tiny)
    prompts = model.encode_prompts(PROMPTS[:2])
    canvas, known = random_state(model, 2, 5, 4)
    with torch.no_grad():
        before = model.forward_z(prompts, canvas, known)
        model.llm.model.layers[0].self_attn.k_proj.weight.add_(0.5)  # in place, as an optimizer step
        after = model.forward_z(prompts, canvas, known)
        torch.testing.assert_close(after, official_forward_z(model, prompts, canvas, known), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(before, after)


def test_trainable_llm_gradients_match_the_uncached_pass(tiny):
    model = twin(tiny, trainable="mar+llm").train()
    model.requires_grad_(False)
    for p in model.trainable_parameters():
        p.requires_grad_(True)
    canvas, known = random_state(model, 2, 9, 5)
    with torch.no_grad():  # embeddings without a graph, and a cached prompt KV without one either
        prompts = model.encode_prompts(PROMPTS[:2])
        model.forward_z(prompts, canvas, known)
    grads = []
    for forward in (model.forward_z, model.forward_z, partial(official_forward_z, model)):
        model.zero_grad()
        forward(prompts, canvas, known).square().sum().backward()
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.trainable_parameters()])
    assert model.llm.model.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0
    for cached, again, uncached in zip(*grads):  # the prompt's keys and values got their gradient
        torch.testing.assert_close(cached, uncached, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(again, uncached, rtol=1e-9, atol=1e-12)


def test_forward_z_rejects_bad_input(tiny):
    prompts = tiny.encode_prompts(PROMPTS[:2])
    canvas, known = random_state(tiny, 2, 3, 6)
    with pytest.raises(ValueError, match="canvas"):
        tiny.forward_z(prompts, canvas[:, :5], known)
    with pytest.raises(ValueError, match="known"):
        tiny.forward_z(prompts, canvas, known.long())
    known[0, ~known[0]] = True
    with pytest.raises(ValueError, match="same count"):
        tiny.forward_z(prompts, canvas, known)


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    grads = []
    for remat in (False, True):
        model = twin(tiny, gradient_checkpointing=remat).train()
        prompts = model.encode_prompts(PROMPTS[:2])
        canvas, known = random_state(model, 2, 11, 7)
        model.forward_z(prompts, canvas, known).square().sum().backward()
        grads.append([p.grad.clone() for p in model.trainable_parameters()])
    assert sum(g.abs().sum() for g in grads[0]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_trainable_parameters_by_mode(tiny):
    ids = {id(p) for p in tiny.trainable_parameters()}
    head, llm = {id(p) for p in tiny.head.parameters()}, {id(p) for p in tiny.llm.parameters()}
    frozen = head | llm | {id(p) for p in (*tiny.vae.parameters(), *tiny.proj_in.parameters(), tiny.mar.class_emb.weight)}
    assert not ids & frozen
    assert ids == {id(p) for p in tiny.mar.parameters()} - head - {id(tiny.mar.class_emb.weight)}
    wide = twin(tiny, trainable="mar+llm")
    wide_ids = {id(p) for p in wide.trainable_parameters()}
    assert {id(p) for p in wide.llm.model.parameters()} <= wide_ids and id(wide.proj_out[2].weight) in wide_ids
    assert not wide_ids & ({id(p) for p in wide.head.parameters()} | {id(p) for p in wide.vae.parameters()})
    with pytest.raises(ValueError, match="trainable"):
        twin(tiny, trainable="head")


def test_lora_adapters_are_the_only_trainable_llm_parameters(tiny):
    pytest.importorskip("peft")
    model = twin(tiny, trainable="mar+lora")
    with pytest.raises(RuntimeError, match="enable_lora"):
        model.trainable_parameters()
    prompts = model.encode_prompts(PROMPTS[:2])
    canvas, known = random_state(model, 2, 5, 12)
    before = model.forward_z(prompts, canvas, known).detach()
    model.enable_lora()
    model.requires_grad_(False)
    for p in model.trainable_parameters():
        p.requires_grad_(True)
    names = {id(p): n for n, p in model.named_parameters()}
    llm_params = [names[id(p)] for p in model.trainable_parameters() if names[id(p)].startswith("llm.")]
    assert llm_params and all("lora_" in n for n in llm_params)
    z = model.forward_z(prompts, canvas, known)
    torch.testing.assert_close(z, before, rtol=1e-12, atol=1e-12)  # LoRA starts as the identity (B = 0)
    z.square().sum().backward()
    assert model.llm.model.layers[1].mlp.down_proj.lora_B["default"].weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------- reference behaviour (parity)
def test_dropout_only_in_the_reference_behaviours_policy_pass(tiny):
    prompts = tiny.encode_prompts(PROMPTS[:2])
    canvas, known = random_state(tiny, 2, 6, 8)
    expected = tiny.forward_z(prompts, canvas, known).detach()
    default = twin(tiny).train()
    torch.testing.assert_close(default.forward_z(prompts, canvas, known), expected, rtol=1e-12, atol=1e-12)
    parity = twin(tiny, reference_behaviour=True)
    torch.testing.assert_close(parity.forward_z(prompts, canvas, known), expected, rtol=1e-12, atol=1e-12)
    parity.train()
    with torch.no_grad():  # a rollout or the frozen reference's pass: no dropout even in training mode
        torch.testing.assert_close(parity.forward_z(prompts, canvas, known), expected, rtol=1e-12, atol=1e-12)
    first, second = parity.forward_z(prompts, canvas, known), parity.forward_z(prompts, canvas, known)
    assert not torch.allclose(first, expected) and not torch.allclose(first, second)


def test_reference_behaviour_lags_the_unconditional_canvas_one_call(tiny):
    parity, default = twin(tiny, reference_behaviour=True), twin(tiny)
    config = RolloutConfig(cfg_scale=3.0, cfg_channels="eps")
    rows = prompt_rows(parity, PROMPTS[:2], config)  # [cond ; uncond] rows, as the rollout builds them
    canvas1, known1 = random_state(parity, 2, 0, 9)
    canvas2, known2 = random_state(parity, 2, 4, 10)
    with torch.no_grad():
        parity.forward_z(rows.batch, canvas1.repeat(2, 1, 1), known1.repeat(2, 1))
        z = parity.forward_z(rows.batch, canvas2.repeat(2, 1, 1), known2.repeat(2, 1))
        expected = default.forward_z(rows.batch, torch.cat([canvas2, canvas1]), known2.repeat(2, 1))
        plain = default.forward_z(rows.batch, canvas2.repeat(2, 1, 1), known2.repeat(2, 1))
    torch.testing.assert_close(z, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(z[2:], plain[2:])  # the lag is visible on the unconditional rows


# ---------------------------------------------------------------------- decoding
def test_decode_scales_and_unpatchifies_tokens(tiny):
    gen = torch.Generator().manual_seed(11)
    tokens = torch.randn(2, 36, 16, generator=gen, dtype=torch.float64) * 0.3
    images = tiny.decode(tokens)
    assert images.shape == (2, 3, 12, 12) and images.dtype == torch.float32
    assert 0 <= images.min() and images.max() <= 1
    latents = tokens.transpose(1, 2).reshape(2, 16, 6, 6) / 0.2325  # token (row, col) -> latent pixel
    expected = tiny.vae.decode(latents).add(1).div(2).clamp(0, 1)
    torch.testing.assert_close(images, expected.float(), rtol=1e-6, atol=1e-6)
    assert tiny.encode_images(images).shape == (2, 36, 16)
    with pytest.raises(ValueError, match="tokens"):
        tiny.decode(tokens[:, :5])


# ---------------------------------------------------------------------- rollout through margrpo.rollout
@pytest.mark.parametrize("positions", ["revealed", "unknown"])
def test_generate_records_what_recomputation_gives(tiny, positions):
    config = RolloutConfig(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=3.0,
        cfg_channels="eps",
        num_seeds=2,
        record_mask_steps=2,
        record_diffusion_steps=2,
        likelihood_positions=positions,
    )
    sampler = tiny.make_sampler()
    rollout = generate(tiny, PROMPTS, config, [3, 4, 5, 6], sampler=sampler)
    assert rollout.reveal_counts == tuple(harmon_schedule(36, 5))
    assert rollout.images.shape == (4, 3, 12, 12) and torch.isfinite(rollout.tokens).all()
    assert rollout.logp.shape[:2] == (3, 4) and rollout.logp.shape[2] > 0  # [T, B, L]
    likelihood = rollout_logprob(tiny, rollout)
    torch.testing.assert_close(likelihood.logp, rollout.logp, rtol=1e-9, atol=1e-9)
    unguided = rollout_logprob(tiny, rollout, cfg="none")
    assert not torch.allclose(unguided.logp, likelihood.logp)  # CFG 3 on eps changes the policy


# ---------------------------------------------------------------------- checkpoints
def _same_model(loaded, original):
    assert loaded.state_dict().keys() == original.state_dict().keys()
    for key, value in original.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    prompts = [original.format_prompt(p) for p in PROMPTS]
    assert loaded.tokenizer(prompts)["input_ids"] == original.tokenizer(prompts)["input_ids"]


def test_load_hugging_face_layout(tiny_dir):
    path, original = tiny_dir
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    assert {"llm", "mar"} <= set(json.loads((path / "config.json").read_text()))
    loaded = harmon.load(path)
    _same_model(loaded, original)
    assert loaded.config == original.config and not loaded.training
    assert harmon.load(path, dtype=torch.float64).mar.z_proj.weight.dtype == torch.float64


def test_load_github_layout(tiny_dir, tmp_path):
    _, original = tiny_dir
    harmon.save_pretrained(original, tmp_path, layout="github")
    assert {"harmon_1.5b.pth", "kl16.ckpt", "Qwen2.5-1.5B-Instruct"} <= {p.name for p in tmp_path.iterdir()}
    _same_model(harmon.load(tmp_path, preset_name="harmon-tiny"), original)


def _copy_layout(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for item in src.iterdir():
        if item.name not in skip:
            (dst / item.name).symlink_to(item)
    return dst


@pytest.mark.parametrize(
    "missing, message",
    [
        ("model.safetensors", "no weights.*wusize/Harmon-1_5B"),
        ("tokenizer.json", "no tokenizer.*wusize/Harmon-1_5B"),
    ],
)
def test_missing_parts_of_the_hugging_face_layout(tiny_dir, tmp_path, missing, message):
    path = _copy_layout(tiny_dir[0], tmp_path / "ckpt", skip=(missing,))
    with pytest.raises(harmon.MissingCheckpointError, match=message):
        harmon.load(path)


@pytest.mark.parametrize(
    "missing, message",
    [
        ("kl16.ckpt", "kl16.ckpt.*wusize/harmon kl16.ckpt"),
        ("Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
    ],
)
def test_missing_parts_of_the_github_layout(tiny_dir, tmp_path, missing, message):
    full = harmon.save_pretrained(tiny_dir[1], tmp_path / "full", layout="github")
    path = _copy_layout(full, tmp_path / "ckpt", skip=(missing,))
    with pytest.raises(harmon.MissingCheckpointError, match=message):
        harmon.load(path, preset_name="harmon-tiny")


def test_pickled_objects_in_a_checkpoint_are_refused_with_advice(tiny_dir, tmp_path):
    import argparse

    full = harmon.save_pretrained(tiny_dir[1], tmp_path / "full", layout="github")
    vae = torch.load(full / "kl16.ckpt", weights_only=True)
    torch.save({**vae, "args": argparse.Namespace(embed_dim=16)}, full / "kl16.ckpt")  # as training scripts save
    with pytest.raises(ValueError, match="kl16.ckpt: holds Python objects.*weights_only"):
        harmon.load(full, preset_name="harmon-tiny")


def test_no_checkpoint_names_both_layouts(tmp_path):
    with pytest.raises(harmon.MissingCheckpointError, match="config.json.*harmon_1.5b.pth"):
        harmon.load(tmp_path)
    with pytest.raises(harmon.MissingCheckpointError, match="not a directory"):
        harmon.load(tmp_path / "absent")


def test_weights_that_do_not_fit_are_listed(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy_layout(tiny_dir[0], tmp_path / "ckpt", skip=("model.safetensors", "config.json"))
    values = json.loads((tiny_dir[0] / "config.json").read_text())
    values["mar"]["diffloss_w"] = 48
    (path / "config.json").write_text(json.dumps(values))
    state = load_file(str(tiny_dir[0] / "model.safetensors"))
    del state["mar.fake_latent"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing keys: \['mar.fake_latent'\].*shape mismatches: .*diffloss.net"):
        harmon.load(path)


# ---------------------------------------------------------------------- training and configs
# the parity preset's settings, except kl_type parity_mean_k3: exp of raw mean differences overflows
# on a random-init head, whose 4-step chains reach means of 1e4 (a trained head's stay O(1))
PARITY = [
    "backbone.options={reference_behaviour: true}",
    "grpo.objective=reinforce",
    "grpo.likelihood_cfg=none",
    "grpo.minibatch_over=mask_steps",
    "grpo.minibatches=2",
    "rollout.likelihood_positions=unknown",
    "grpo.consistency=true",
    "grpo.consistency_start_step=1",
    "rollout.known_mask=post_step",
    "grpo.likelihood_std=recorded_main",
]


@pytest.mark.parametrize("extra", [[], PARITY], ids=["default", "parity"])
def test_one_grpo_step_through_the_trainer_changes_only_trainable_parameters(tiny_dir, tmp_path, extra):
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    overrides = [
        "backbone.name=harmon",
        f"backbone.checkpoint={tiny_dir[0]}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=1",
        "rollout.num_mask_steps=4",
        "rollout.schedule=harmon",
        "rollout.cfg_scale=3.0",
        "rollout.cfg_channels=eps",
        "rollout.num_seeds=2",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=2",
        "grpo.prompts_per_step=2",
        "grpo.kl_beta=0.01",
        "grpo.mte=true",
        "rewards={jpeg_incompressibility: 1.0}",
        "optim.lr=1e-4",
        *extra,
    ]
    trainer = Trainer(load_config(None, overrides))
    assert trainer.policy.reference_behaviour == bool(extra)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    metrics = trainer.train_step()
    assert metrics["updates"] == (2 if extra else 1) and "skipped" not in metrics
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # the first update is on-policy
    trainable = {n for n, p in trainer.policy.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("mar.") and not n.startswith("mar.diffloss.") for n in trainable)
    changed = {k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and changed <= trainable
    assert "mar.encoder_blocks.0.attn.qkv.weight" in changed and "mar.decoder_pos_embed_learned" in changed


def test_grpo_step_under_cuda_bf16_autocast(tiny_dir, tmp_path):
    """optim.bf16 (autocast) over float32 weights, with CUDA's autocast rules: the MAR decoder's
    scatter of bf16 decoder_embed outputs into the float32 mask-token canvas needs one dtype."""
    from cuda_autocast import cuda_autocast_rules

    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    overrides = [
        "backbone.name=harmon",
        f"backbone.checkpoint={tiny_dir[0]}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=1",
        "run.device=cpu",
        "rollout.num_mask_steps=3",
        "rollout.schedule=harmon",
        "rollout.cfg_scale=3.0",
        "rollout.cfg_channels=eps",
        "rollout.num_seeds=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=2",
        "grpo.prompts_per_step=1",
        "grpo.kl_beta=0.01",
        "grpo.mte=true",
        "rewards={jpeg_incompressibility: 1.0}",
        "optim.lr=1e-4",
        "optim.bf16=true",
    ]
    trainer = Trainer(load_config(None, overrides), create_run_dir=False)
    with cuda_autocast_rules():
        metrics = trainer.train_step()
    assert metrics["updates"] == 1 and "skipped" not in metrics and metrics["grad_norm"] > 0


@pytest.mark.parametrize("name", ["harmon-1.5b", "harmon-1.5b-parity"])
def test_configs_load(name, tiny_dir):
    from margrpo.train.config import load_config

    config = load_config(ROOT / "configs" / f"{name}.yaml")
    assert config.backbone.name == "harmon"
    r = config.rollout
    assert (r.num_mask_steps, r.schedule, r.cfg_scale, r.cfg_channels, r.num_seeds) == (64, "harmon", 3.0, "eps", 5)
    assert r.negative_prompt in (None, "Generate an image.")
    assert config.grpo.head == "frozen" and config.optim.lr == 1e-6
    if name.endswith("parity"):
        g = config.grpo
        assert (g.objective, g.kl_type, g.likelihood_cfg, g.minibatch_over) == ("reinforce", "parity_mean_k3", "none", "mask_steps")
        assert g.minibatches == r.record_mask_steps and r.likelihood_positions == "unknown"
        assert r.known_mask == "post_step"
        assert config.backbone.options == {"reference_behaviour": True}
    assert harmon.load(tiny_dir[0], **config.backbone.options).reference_behaviour == name.endswith("parity")


@pytest.fixture(scope="module")
def bench():
    """benchmarks/gpu/harmon.py (a script directory, not a package)."""
    yield load_script("benchmarks/gpu/harmon.py", "harmon_bench")
    del sys.modules["harmon_bench"]


def test_gpu_benchmark_runs_tiny_on_cpu(bench, tmp_path):
    result = bench.run(tmp_path, tiny=True, device="cpu")
    setting = json.loads((tmp_path / "harmon-tiny.json").read_text())["setting"]
    assert setting["preset"] == "harmon-tiny" and setting["head_compiled"] is False  # auto, on a CPU
    for key in ("backbone_ms", "fused_rollout_ms", "reference_rollout_ms", "fused_step_ms", "reference_step_ms"):
        assert result[key] > 0, key
    assert result["step_speedup"] == pytest.approx(result["reference_step_ms"] / result["fused_step_ms"])
    assert "rollout" in bench.format_table(result)
    # every timed path says what compiled inside its timed calls: nothing, after the warm-up
    paths = ("backbone", "fused_rollout", "ref_rollout", "fused_step", "ref_step")
    assert result["compiles_while_timed"] == {p: {"triton": 0, "graphs": 0, "kernels": []} for p in paths}
    assert all("compiles_while_timed" in row for row in result["rows"])


def test_benchmark_reference_rollout_keeps_all_tokens_at_recorded_steps(bench, tiny):
    config = RolloutConfig(
        num_mask_steps=4, schedule="harmon", cfg_scale=3.0, cfg_channels="eps", num_seeds=2, record_mask_steps=2, record_diffusion_steps=2
    )
    sampler = tiny.make_sampler()
    plan = choose_plan(mask_schedule(36, 4, "harmon"), sampler, 2, 2, torch.Generator().manual_seed(0))
    images, kept, seeds = bench.reference_rollout(tiny, PROMPTS[:2], config, sampler, plan, torch.Generator().manual_seed(1))
    assert images.shape == (2, 3, 12, 12) and sorted(kept) == [0, 1]
    assert all(out.x_t.shape == (1, 2, 2 * 36, 16) for _, _, out in kept.values())
    assert seeds.x_t.shape == (2, sampler.num_steps, 2 * 36, 16)

"""NOVA backbone (margrpo.models.nova) on tiny random-init presets in the official checkpoint layout:
config reading, loading and its errors, the transformer against an official-style forward written
here from the upstream algorithm, prompts, decoding, rollout + likelihood recomputation, one GRPO
step through the shared trainer, the configs, and the benchmark's CPU path."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import load_script
from margrpo.diffusion import DDPMSampler, FlowSDESampler
from margrpo.models import nova
from margrpo.models.base import MARBackbone
from margrpo.models.nova.config import NovaConfig
from margrpo.rollout import RolloutConfig, effective_steps, generate, mask_schedule, rollout_logprob

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a red car", "a photo of a cat on a sofa at night", "", "a red car"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return nova.save_preset("nova-tiny", tmp_path_factory.mktemp("nova") / "nova-tiny", seed=3)


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> nova.NovaBackbone:
    return nova.load(tiny_dir)


@pytest.fixture(scope="module")
def tiny64(tiny_dir) -> nova.NovaBackbone:
    return nova.load(tiny_dir, dtype=torch.float64)


# ---------------------------------------------------------------------- config
def test_config_reads_the_official_fields():
    official = {
        "_class_name": "NOVATransformer3DModel",
        "_diffusers_version": "0.31.0",
        "image_dim": 4,
        "image_size": 512,
        "image_stride": 8,
        "text_token_dim": 2560,
        "text_token_len": 256,
        "image_base_size": [32, 32],
        "video_base_size": [1, 16, 16],
        "video_mixer_rank": None,
        "arch": ["vit_d16w1024", "vit_d32w1024", "mlp_d6w1024"],
    }
    config = NovaConfig.from_dict(official)
    assert (config.num_tokens, config.token_channels, config.frame_tokens) == (1024, 16, 256)
    assert (config.patch_size, config.temporal_patch_size, config.latent_size) == (2, 4, (64, 64))
    assert config.temporal == (16, 1024, 16) and config.spatial == (32, 1024, 16) and config.head == (6, 1024)
    assert NovaConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "change, message",
    [
        ({"video_base_size": [3, 16, 16]}, "video checkpoints"),
        ({"rotary_pos_embed": True}, "RoPE"),
        ({"image_base_size": [16, 16]}, "expected [32, 32]"),
        ({"arch": ["vit_d16w1024", "vit_d32w768", "mlp_d3w1280"]}, "one width"),
        ({"arch": ["vit_d16w1024", "vit_d32w1024", "mlp_big"]}, "mlp_d<depth>w<width>"),
        ({"text_token_dim": None}, "class-conditional"),
        ({"num_layers": 3}, "unknown key(s) ['num_layers']"),
        ({"_class_name": "Transformer2DModel"}, "expected 'NOVATransformer3DModel'"),
    ],
)
def test_config_errors_name_the_field(change, message):
    data = {**NovaConfig().to_dict(), **change}
    with pytest.raises(ValueError) as err:
        NovaConfig.from_dict(data, "transformer/config.json")
    assert message in str(err.value) and "transformer/config.json" in str(err.value)


def test_real_size_model_has_official_names_and_0_6b_parameters():
    with torch.device("meta"):
        transformer = nova.NovaTransformer(nova.PRESETS["nova-0.6b-random"].transformer)
    state = transformer.state_dict()
    for key, shape in {
        "video_encoder.patch_embed.proj.weight": (1024, 4, 4, 4),
        "video_encoder.blocks.15.attn.qkv.weight": (3072, 1024),
        "video_encoder.norm.weight": (1024,),
        "image_encoder.patch_embed.proj.weight": (1024, 4, 2, 2),
        "image_encoder.blocks.31.mlp.fc2.weight": (1024, 4096),
        "image_encoder.blocks.0.norm1.bias": (1024,),
        "image_decoder.blocks.2.norm1.proj.weight": (3 * 1280, 1280),
        "image_decoder.head.weight": (16, 1280),
        "mask_embed.bos_token": (1, 1024),
        "mask_embed.mask_token": (1, 1024),
        "text_embed.proj.weight": (1024, 2560),
        "text_embed.weight": (512, 2560),
        "video_pos_embed.time_proj.0.weight": (1024, 256),
        "video_pos_embed.norm.weight": (1024,),
    }.items():
        assert tuple(state[key].shape) == shape, key
    assert "image_pos" not in state and "video_pos_embed.space" not in state  # computed tables, not weights
    total = sum(p.numel() for p in transformer.parameters())
    assert 0.6e9 < total < 0.66e9, total


# ---------------------------------------------------------------------- loading
def test_load_reads_the_layout_back_with_sizes_from_the_configs(tmp_path, tiny_dir, tiny):
    built = nova.build("nova-tiny", seed=3)
    assert isinstance(tiny, MARBackbone)
    for (key, value), (key2, value2) in zip(built.state_dict().items(), tiny.state_dict().items()):
        assert key == key2 and torch.equal(value, value2), key
    assert isinstance(tiny.make_sampler(), DDPMSampler) and tiny.make_sampler().num_steps == 25
    assert tiny.make_sampler(7).num_steps == 7
    assert tiny.negative_prompt() == "" and (tiny.num_tokens, tiny.token_channels) == (16, 16)
    flow = nova.load(nova.save_preset("nova-tiny-flow", tmp_path / "flow"))
    assert (flow.head.depth, flow.head.embed_dim) == (1, 40) and len(flow.transformer.image_encoder.blocks) == 3
    assert isinstance(flow.make_sampler(4), FlowSDESampler)
    assert "video_encoder.mixer.lora.weight" in flow.transformer.state_dict()


def test_pipeline_flow_shift_reaches_the_sampler_through_the_config(tmp_path, tiny_dir):
    """backbone.options.flow_shift is NOVA's pipeline flow_shift (the scheduler's set_shift): the
    trainer's sampler gets it as FlowSDESampler's flow_shift, not as shift; a DDPM checkpoint refuses it."""
    from margrpo.models import BackboneConfig, load_backbone

    flow_dir = nova.save_preset("nova-tiny-flow", tmp_path / "flow")
    shifted = load_backbone(BackboneConfig(name="nova", checkpoint=str(flow_dir), options={"flow_shift": 5.0}))
    sigmas = shifted.make_sampler(25).sigmas
    np.testing.assert_allclose(sigmas, FlowSDESampler(25, shift=1.0, flow_shift=5.0).sigmas, rtol=0, atol=0)
    assert sigmas[-2] == pytest.approx(0.004980, abs=1e-6)  # not shift=5's 0.0244
    assert nova.load(flow_dir).make_sampler(25).sigmas[-2] != pytest.approx(sigmas[-2])
    with pytest.raises(ValueError, match="flow_shift.*DDPMScheduler"):
        nova.load(tiny_dir, flow_shift=5.0)
    with pytest.raises(ValueError, match="flow_shift"):
        nova.load(flow_dir, flow_shift=-1.0)


def test_text_encoder_weights_load_with_the_upstream_prefix_and_lm_head(tmp_path, tiny_dir, tiny):
    copied = tmp_path / "ckpt"
    _copy_tree(tiny_dir, copied)
    file = copied / "text_encoder" / "model.safetensors"
    state = load_file(str(file))
    assert all(k.startswith("model.") for k in state)
    hidden = state["model.embed_tokens.weight"].shape
    state["lm_head.weight"], state["lm_head.bias"] = torch.zeros(hidden), torch.zeros(hidden[0])
    save_file(state, str(file))
    loaded = nova.load(copied)
    assert torch.equal(loaded.encode_prompts(["a cat"]).embeds, tiny.encode_prompts(["a cat"]).embeds)


def _copy_tree(src: Path, dst: Path) -> None:
    for file in src.rglob("*"):
        if file.is_file():
            target = dst / file.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(file.read_bytes())


@pytest.mark.parametrize(
    "remove",
    [
        "model_index.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/tokenizer.json",
        "scheduler/scheduler_config.json",
    ],
)
def test_a_missing_file_is_named_with_where_to_get_it(tmp_path, tiny_dir, remove):
    _copy_tree(tiny_dir, tmp_path / "ckpt")
    (tmp_path / "ckpt" / remove).unlink()
    with pytest.raises(FileNotFoundError) as err:
        nova.load(tmp_path / "ckpt")
    assert remove.split("/")[0] in str(err.value) and nova.REPO_ID in str(err.value)


def test_wrong_directories_and_weights_are_errors(tmp_path, tiny_dir):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        nova.load(tmp_path / "nothing")
    _copy_tree(tiny_dir, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ValueError, match="NOVAPipeline"):
        nova.load(tmp_path / "ckpt")
    _copy_tree(tiny_dir, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    del state["image_encoder.blocks.1.attn.qkv.weight"]
    state["image_decoder.head.weight"] = torch.zeros(3, 3)
    save_file(state, str(weights))
    with pytest.raises(ValueError) as err:
        nova.load(tmp_path / "ckpt")
    assert "image_encoder.blocks.1.attn.qkv.weight" in str(err.value) and "image_decoder.head.weight" in str(err.value)
    with pytest.raises(ValueError, match="dtype"):
        nova.load(tiny_dir, dtype="int8")


# ---------------------------------------------------------------------- the transformer vs an official-style forward
def _sincos_2d(dim: int, h: int, w: int) -> torch.Tensor:
    freq = 1 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    gw, gh = torch.meshgrid(torch.arange(w, dtype=torch.float32), torch.arange(h, dtype=torch.float32), indexing="xy")
    fw, fh = gw.reshape(-1, 1) * freq, gh.reshape(-1, 1) * freq
    return torch.cat([fw.sin(), fw.cos(), fh.sin(), fh.cos()], -1)


def _official_block(block, x):
    """x + LN(attn(x)), x + LN(mlp(x)); attention written out head by head."""
    heads = block.attn.num_heads
    q, k, v = block.attn.qkv(x).chunk(3, -1)
    split = [t.reshape(*t.shape[:2], heads, -1).transpose(1, 2) for t in (q, k, v)]
    weights = torch.softmax(split[0] @ split[1].transpose(-1, -2) / math.sqrt(split[0].shape[-1]), -1)
    attn = block.attn.proj((weights @ split[2]).transpose(1, 2).reshape(x.shape))
    x = x + block.norm1(attn)
    return x + block.norm2(block.mlp.fc2(F.gelu(block.mlp.fc1(x))))


def _official_z(t, text_states, latent, reveal_order, extra_frame=False):
    """NOVA's t2i forward as upstream computes it: conv patch embeds of latent images, the mask applied
    by multiplication, the known tokens gathered in reveal order (prev_ids)."""
    c = t.config
    B, D = latent.shape[0], c.width
    x = t.text_embed.weight[: c.text_token_len].expand(B, -1, -1).clone()
    for i, s in enumerate(text_states):
        x[i, : s.shape[0]] = s
    text = t.text_embed.norm(t.text_embed.proj(x))
    freq = 1 / 10000 ** (torch.arange(128, dtype=torch.float32) / 128)
    frames = 2 if extra_frame else 1
    grid = torch.arange(frames, dtype=torch.float32) / (frames / 1)
    time = t.video_pos_embed.norm(
        t.video_pos_embed.time_proj(
            torch.cat([(grid[:, None, None] * freq).sin(), (grid[:, None, None] * freq).cos()], -1).to(latent.dtype)
        )
    )
    hv, wv = c.video_base_size[1:]
    video = (
        F.conv2d(latent, t.video_encoder.patch_embed.proj.weight, t.video_encoder.patch_embed.proj.bias, stride=c.temporal_patch_size)
        .flatten(2)
        .transpose(1, 2)
    )
    bos = torch.zeros_like(video) + t.mask_embed.bos_token
    frame_tokens = torch.stack([bos, video][:frames], 1) + time + _sincos_2d(D, hv, wv).to(latent.dtype)
    h = torch.cat([text, frame_tokens.flatten(1, 2)], 1)
    for block in t.video_encoder.blocks:
        h = _official_block(block, h)
    cond = t.video_encoder.norm(h[:, text.shape[1] :])
    z = (
        F.conv2d(latent, t.image_encoder.patch_embed.proj.weight, t.image_encoder.patch_embed.proj.bias, stride=c.patch_size)
        .flatten(2)
        .transpose(1, 2)
    )
    mask = torch.ones(B, z.shape[1], 1, dtype=z.dtype).scatter_(1, reveal_order[..., None], 0)
    z = z.mul(1 - mask) + t.mask_embed.mask_token * mask
    z = z + _sincos_2d(D, *c.image_base_size).to(z.dtype)
    ids = reveal_order[..., None].expand(-1, -1, D)
    h = torch.cat([cond, z.gather(1, ids)], 1)
    depth = t.image_encoder.encoder_depth
    for block in t.image_encoder.blocks[:depth]:
        h = _official_block(block, h)
    cond, known = h.split([cond.shape[1], ids.shape[1]], 1)
    h = torch.cat([cond, z.scatter(1, ids, known)], 1)
    for block in t.image_encoder.blocks[depth:]:
        h = _official_block(block, h)
    return t.image_encoder.norm(h[:, cond.shape[1] :])


def _canvas(backbone, gen, batch, known_count):
    """Random patch tokens, the token-space canvas and latent image (zeros where unknown), and a reveal order."""
    N, C = backbone.num_tokens, backbone.token_channels
    tokens = torch.randn(batch, N, C, generator=gen, dtype=torch.float64)
    order = torch.stack([torch.randperm(N, generator=gen) for _ in range(batch)])[:, :known_count]
    known = torch.zeros(batch, N, dtype=torch.bool).scatter_(1, order, True)
    shown = tokens * known[..., None]
    return tokens, known, order, backbone.latent_images(shown)


@pytest.mark.parametrize("known_count", [0, 5, 16])
def test_forward_z_equals_the_official_forward(tiny64, gen, known_count):
    tokens, known, order, latent = _canvas(tiny64, gen, 3, known_count)
    prompts = PROMPTS[:3]
    z = tiny64.forward_z(tiny64.encode_prompts(prompts), tokens, known)  # reads tokens only where known
    expected = _official_z(tiny64.transformer, tiny64.frozen.text_encoder(prompts), latent, order)
    torch.testing.assert_close(z, expected, rtol=1e-10, atol=1e-10)


def test_rows_with_different_known_counts_match_one_by_one(tiny64, gen):
    tokens, known, _, _ = _canvas(tiny64, gen, 3, 9)
    known[1, known[1].nonzero()[:4, 0]] = False  # row 1 knows 5, row 2 knows none
    known[2] = False
    prompts = tiny64.encode_prompts(PROMPTS[:3])
    z = tiny64.forward_z(prompts, tokens, known)
    for row in range(3):
        one = type(prompts)(prompts.embeds[row : row + 1], prompts.mask[row : row + 1])
        torch.testing.assert_close(
            z[row : row + 1], tiny64.forward_z(one, tokens[row : row + 1], known[row : row + 1]), rtol=1e-10, atol=1e-10
        )


def test_extra_temporal_frame_only_in_train_mode(tiny_dir, gen):
    parity = nova.load(tiny_dir, dtype=torch.float64, training_extra_frame=True)
    plain = nova.load(tiny_dir, dtype=torch.float64)
    tokens, known, order, latent = _canvas(parity, gen, 2, 7)
    prompts = PROMPTS[:2]
    rollout_z = parity.forward_z(parity.encode_prompts(prompts), tokens, known)
    torch.testing.assert_close(rollout_z, plain.forward_z(plain.encode_prompts(prompts), tokens, known), rtol=0, atol=0)
    training_z = parity.train().forward_z(parity.encode_prompts(prompts), tokens, known)
    expected = _official_z(parity.transformer, parity.frozen.text_encoder(prompts), latent, order, extra_frame=True)
    torch.testing.assert_close(training_z, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(training_z, rollout_z, atol=1e-3)
    assert torch.equal(plain.train().forward_z(plain.encode_prompts(prompts), tokens, known), rollout_z)


def test_forward_z_rejects_bad_shapes(tiny):
    prompts = tiny.encode_prompts(["a cat"])
    with pytest.raises(ValueError, match=r"canvas: got shape \(1, 15, 16\)"):
        tiny.forward_z(prompts, torch.zeros(1, 15, 16), torch.zeros(1, 15, dtype=torch.bool))
    with pytest.raises(ValueError, match="known: got torch.float32"):
        tiny.forward_z(prompts, torch.zeros(1, 16, 16), torch.zeros(1, 16))
    other = type(prompts)(prompts.embeds[:, :5], prompts.mask[:, :5])
    with pytest.raises(ValueError, match="from this backbone's encode_prompts"):
        tiny.forward_z(other, torch.zeros(1, 16, 16), torch.zeros(1, 16, dtype=torch.bool))


# ---------------------------------------------------------------------- prompts and decoding
def test_prompts_fill_learned_rows_truncate_and_do_not_depend_on_the_batch(tiny64):
    t, length = tiny64.transformer, tiny64.config.text_token_len
    batch = tiny64.encode_prompts(PROMPTS)
    assert batch.embeds.shape == (4, length + tiny64.config.frame_tokens, tiny64.config.width) and batch.mask.all()
    fill = t.text_embed(t.text_embed.weight[:length])
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(batch.embeds[2, :length], fill, **exact)  # "" has no tokens: all learned rows
    torch.testing.assert_close(batch.embeds[0, 9:length], fill[9:], **exact)  # "a red car": 9 byte tokens
    assert not torch.allclose(batch.embeds[0, :9], fill[:9])
    torch.testing.assert_close(batch.embeds[0], batch.embeds[3], **exact)
    alone = tiny64.encode_prompts([PROMPTS[1]])
    torch.testing.assert_close(alone.embeds[0], batch.embeds[1], rtol=1e-12, atol=1e-12)
    longer = tiny64.encode_prompts([PROMPTS[1] + " with many more words after the limit"])
    torch.testing.assert_close(longer.embeds, alone.embeds, rtol=0, atol=0)  # truncated to text_token_len tokens
    for bad in ("a cat", [], ["a cat", 3]):
        with pytest.raises(ValueError, match="prompts"):
            tiny64.encode_prompts(bad)


def test_decode_is_the_vae_on_unscaled_latents(tiny64, gen):
    tokens = torch.randn(2, 16, 16, generator=gen, dtype=torch.float64)
    images = tiny64.decode(tokens)
    # tokens -> latent image by hand: token (row, col) holds p x p pixels x channels in (p_h, p_w, c) order
    p, grid = tiny64.config.patch_size, tiny64.config.image_base_size[0]
    latent = tokens.reshape(2, grid, grid, p, p, 4).permute(0, 5, 1, 3, 2, 4).reshape(2, 4, grid * p, grid * p)
    vae = tiny64.frozen.vae.vae
    expected = (vae.decode(latent / vae.config.scaling_factor).sample + 1).div(2).clamp(0, 1)
    assert images.shape == (2, 3, 64, 64)
    torch.testing.assert_close(images, expected.float(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="tokens: got shape"):
        tiny64.decode(tokens[:, :8])


def test_frozen_parts_move_with_the_backbone_and_are_shared_by_deepcopy(tiny_dir):
    backbone = nova.load(tiny_dir)
    reference = copy.deepcopy(backbone)
    assert reference.frozen is backbone.frozen
    assert reference.transformer.mask_embed.mask_token is not backbone.transformer.mask_embed.mask_token
    backbone.to(torch.float64)
    assert backbone.frozen.text_encoder.model.dtype == torch.float64 and backbone.frozen.vae.vae.dtype == torch.float64
    names = {n for n, _ in backbone.named_parameters()}
    assert all(n.startswith("transformer.") for n in names)  # Phi and the VAE are not policy parameters
    head = {id(p) for p in backbone.head.parameters()}
    trainable = backbone.trainable_parameters()
    assert trainable and not head & {id(p) for p in trainable}
    assert len(trainable) + len(head) == len(list(backbone.parameters()))


# ---------------------------------------------------------------------- rollout and likelihood
def _rollout_config(**changes) -> RolloutConfig:
    base = dict(
        num_mask_steps=4, schedule="nova", cfg_scale=5.0, negative_prompt=None, num_seeds=2, record_mask_steps=2, record_diffusion_steps=2
    )
    return RolloutConfig(**{**base, **changes})


@pytest.mark.parametrize("positions", ["revealed", "unknown"])
def test_generate_and_recompute_the_recorded_logprobs(tiny64, tiny, positions):
    config = _rollout_config(likelihood_positions=positions)
    prompts, seeds = PROMPTS[:2] + ["a blue boat"], [11, 12, 13]
    rollout = generate(tiny64, prompts, config, seeds, sampler=tiny64.make_sampler(5))
    assert rollout.images.shape == (3, 3, 64, 64) and torch.isfinite(rollout.images).all()
    assert 0 <= rollout.images.min() and rollout.images.max() <= 1 and rollout.images.std() > 0
    assert rollout.logp.shape[:2] == (3, 3) and rollout.logp.abs().sum() > 0  # [T, B, L]
    recomputed = rollout_logprob(tiny64, rollout)
    torch.testing.assert_close(recomputed.logp, rollout.logp, rtol=1e-9, atol=1e-9)
    assert recomputed.logp.requires_grad
    # fp32 (noise drawn in fp32, so other samples): recomputed to fp32 tolerance
    rollout32 = generate(tiny, prompts, config, seeds, sampler=tiny.make_sampler(5))
    assert torch.isfinite(rollout32.images).all() and rollout32.logp.abs().sum() > 0
    torch.testing.assert_close(rollout_logprob(tiny, rollout32).logp, rollout32.logp, rtol=2e-5, atol=1e-5)


def test_nova_schedule_has_63_effective_steps_at_the_real_size():
    counts = mask_schedule(nova.PRESETS["nova-0.6b-random"].transformer.num_tokens, 64, "nova")
    assert sum(counts) == 1024 and counts[0] == 0 and len(effective_steps(counts)) == 63


# ---------------------------------------------------------------------- the trainer and the configs
def test_one_grpo_step_through_the_trainer_updates_only_trainable_parameters(tmp_path, tiny_dir):
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    overrides = [
        "backbone.name=nova",
        f"backbone.checkpoint={tiny_dir}",
        "backbone.diffusion_steps=4",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.threads=1",
        "run.device=cpu",
        "rollout.num_mask_steps=4",
        "rollout.cfg_scale=5.0",
        "rollout.num_seeds=2",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=4",
        "grpo.prompts_per_step=1",
        "grpo.mte=true",
        "grpo.kl_beta=0.01",
        "rewards={jpeg_incompressibility: 1.0}",
        "optim.lr=1e-3",
    ]
    trainer = Trainer(load_config(None, overrides), create_run_dir=False)
    policy = trainer.policy
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    frozen = [p.clone() for p in policy.frozen.text_encoder.model.parameters()]
    metrics = trainer.train_step()
    assert "skipped" not in metrics and metrics["grad_norm"] > 0
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and metrics["kl"] == pytest.approx(0.0, abs=1e-8)
    after = policy.state_dict()
    head = [k for k in after if k.startswith("transformer.image_decoder.")]
    assert head and all(torch.equal(after[k], before[k]) for k in head), "the frozen head changed"
    changed = [k for k in after if k not in head and not torch.equal(after[k], before[k])]
    assert any(k.startswith("transformer.image_encoder.blocks.") for k in changed)
    assert any(k.startswith("transformer.video_encoder.blocks.") for k in changed)  # through the prompt embeds
    assert all(torch.equal(a, b) for a, b in zip(frozen, policy.frozen.text_encoder.model.parameters()))
    assert torch.equal(after["transformer.text_embed.weight"], before["transformer.text_embed.weight"])  # a buffer


def test_configs_load_with_the_recipes(tiny_dir):
    from margrpo.train.config import load_config

    sound, parity = load_config(ROOT / "configs" / "nova-512.yaml"), load_config(ROOT / "configs" / "nova-512-parity.yaml")
    for config in (sound, parity):
        assert config.backbone.name == "nova" and config.rewards["hps"]["path"].endswith("HPS_v2.1_compressed.pt")
        r = config.rollout
        got = (r.num_mask_steps, r.schedule, r.cfg_scale, r.cfg_channels, r.negative_prompt, r.num_seeds)
        assert got == (64, "nova", 5.0, "all", "", 3)
        assert config.grpo.head == "frozen" and config.grpo.mte and config.grpo.consistency
    g = parity.grpo
    assert (g.objective, g.kl_type, g.likelihood_cfg, g.minibatch_over, g.minibatches, g.pixels_per_token) == (
        "reinforce",
        "parity_mean_k3",
        "none",
        "mask_steps",
        parity.rollout.record_mask_steps,
        4,
    )
    assert parity.rollout.likelihood_positions == "unknown"
    assert (sound.grpo.objective, sound.grpo.likelihood_cfg) == ("clip", "rollout")
    # the parity preset's model options are nova.load's keywords
    assert nova.load(tiny_dir, **parity.backbone.options).training_extra_frame is True


def test_gpu_benchmark_runs_at_tiny_size(tmp_path):
    module = load_script("benchmarks/gpu/nova.py", "nova_gpu_bench")
    result = module.run(tmp_path, tiny=True)
    assert json.loads((tmp_path / "nova.json").read_text()) == json.loads(json.dumps(result))
    assert {(r["what"], r["path"]) for r in result["rows"]} == {(w, p) for w in ("rollout", "grpo_step") for p in ("fused", "reference")}
    assert all(r["ms"] > 0 and r["images_per_s"] > 0 for r in result["rows"])
    assert result["speedup"]["grpo_step"] > 0 and isinstance(result["meets_target"], bool)
    assert result["settings"]["preset"] == "nova-tiny" and "speedup vs reference" in module.format_table(result)


def test_gpu_benchmark_step_only_reports_paired_rounds(tmp_path):
    """--step-only times the GRPO step alone; the speedup is the median of the rounds' paired ratios."""
    module = load_script("benchmarks/gpu/nova.py", "nova_gpu_bench")
    result = module.run(tmp_path, tiny=True, time_rollout=False, repeats=3)
    assert [(r["what"], r["path"]) for r in result["rows"]] == [("grpo_step", "fused"), ("grpo_step", "reference")]
    times = {r["path"]: r["rounds_ms"] for r in result["rows"]}
    rounds = result["speedup_rounds"]["grpo_step"]
    assert rounds["per_round"] == pytest.approx([ref / fused for ref, fused in zip(times["reference"], times["fused"])])
    assert len(rounds["per_round"]) == 3 and sorted(map(sorted, rounds["order"])) == [["fused", "reference"]] * 3
    assert result["speedup"] == {"grpo_step": pytest.approx(sorted(rounds["per_round"])[1])}
    assert rounds["p20"] <= rounds["p50"] <= rounds["p80"]
    assert result["settings"]["compile_head"] == "auto" and result["settings"]["head_compiled"] is False  # auto, on a CPU


def test_gpu_benchmark_warm_up_compiles_what_the_timed_step_runs(tmp_path):
    """With the head compiled (as on CUDA), the short warm-up schedule builds every graph the timed
    step uses: the JSON records no compile inside a timed call (a compile there would count seconds
    of Inductor as the fused path's cost)."""
    torch._dynamo.reset()
    module = load_script("benchmarks/gpu/nova.py", "nova_gpu_bench")
    result = module.run(tmp_path, tiny=True, time_rollout=False, repeats=1, compile_head=True)
    assert result["settings"]["head_compiled"] is True
    compiled = result["speedup_rounds"]["grpo_step"]["compiles_while_timed"]
    assert compiled == {path: {"triton": 0, "graphs": 0, "kernels": []} for path in ("fused", "reference")}
    assert all(r["compiles_while_timed"] == compiled[r["path"]] for r in result["rows"])
    torch._dynamo.reset()


def test_gpu_benchmark_refuses_a_schedule_without_a_recorded_step():
    from margrpo.bench.models import NovaBenchSettings

    for name in ("mask_steps", "warmup_mask_steps"):
        with pytest.raises(ValueError, match=f"{name}: got 2, expected >= 3"):
            dataclasses.replace(NovaBenchSettings.tiny(), **{name: 2})
    assert NovaBenchSettings.tiny().rollout_config(3).record_mask_steps == 1


def test_gpu_benchmark_passes_compile_head_to_the_trainer(tmp_path):
    from margrpo.bench.models import NovaBenchSettings, nova_bench_config

    for value in (True, False, "auto"):
        settings = dataclasses.replace(NovaBenchSettings.tiny(), compile_head=value)
        assert settings.rollout_config().compile_head == value
        assert nova_bench_config(settings, torch.device("cpu"), tmp_path).rollout.compile_head == value


def test_gpu_benchmark_grpo_step_under_cuda_bf16_autocast(tmp_path):
    """bench_nova as on the GPU: bf16 weights, the trainer's GRPO step under bf16 autocast (optim.bf16),
    with CUDA's autocast rules (float32 LayerNorm outputs: the spatial encoder's scatter met a float32
    block output and bf16 tokens), and the reference-style step beside it."""
    from cuda_autocast import cuda_autocast_rules

    from margrpo.bench.models import NovaBenchSettings, bench_nova

    settings = dataclasses.replace(NovaBenchSettings.tiny(), dtype="bfloat16", bf16=True, mask_steps=3, warmup_mask_steps=3)
    rows = []
    with cuda_autocast_rules():
        result = bench_nova("cpu", settings, on_row=rows.append)
    assert [(r["what"], r["path"]) for r in rows] == [(w, p) for w in ("rollout", "grpo_step") for p in ("fused", "reference")]
    assert rows == result["rows"] and all(r["ms"] > 0 for r in rows)


def test_step_launch_counts_split_the_step_and_see_the_reference_loops(tmp_path):
    """benchmarks/nova_step_launches.py: the rollout's counts are part of the step's, the update's are
    the rest, and the reference-style rollout (one eager chain per trajectory over all N tokens)
    issues more launches than the fused one (all trajectories of a token in one batched pass)."""
    module = load_script("benchmarks/nova_step_launches.py", "nova_step_launches")
    report = module.count_step(mask_steps=4, record_mask_steps=2, group_size=2)
    for path in ("fused", "reference"):
        counts = report[path]
        for kind in ("launches", "syncs", "host_to_device"):
            assert counts["step"][kind] == counts["rollout"][kind] + counts["update"][kind]
        assert counts["rollout"]["launches"] > 0 and counts["update"]["launches"] > 0
    assert report["reference"]["rollout"]["launches"] > report["fused"]["rollout"]["launches"]
    assert "reference / fused launches, step" in module.format_table(report)

"""Every weighted reward on a tiny random-init model of its real architecture, written to a temporary
directory in the official checkpoint layout and key names, then loaded through the reward's own
loading code. Compared with the documented pipeline (PIL preprocessing + the library's processors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from margrpo.rewards import CorruptWeightsError, MissingWeightsError, build_reward, synthetic
from margrpo.rewards.preprocess import CLIP_MEAN, CLIP_STD
from margrpo.rewards.synthetic import OPEN_CLIP_TINY, write_bert_vocab

PROMPTS = ["a red cat", "a cat left of a dog", "two dogs", "a dog"]
METADATA = [
    {"task_type": "color", "nouns": ["cat"], "attr_nouns": ["red cat"]},
    {"task_type": "spatial", "nouns": ["cat", "dog"], "spatial_info": {"obj1": "cat", "obj2": "dog", "locality": "left of"}},
    {"task_type": "numeracy", "nouns": ["dog"], "numeracy_info": [{"obj_name": "dog", "num": 2}]},
    {},
]


def images_u8(batch: int = 4, height: int = 40, width: int = 48, seed: int = 0) -> torch.Tensor:
    """Smooth random images (low-res noise upsampled), uint8 [B, 3, H, W]."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(batch, 3, 5, 6, generator=g)
    return (torch.nn.functional.interpolate(low, size=(height, width), mode="bilinear") * 255).round().to(torch.uint8)


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    return [Image.fromarray(x.permute(1, 2, 0).numpy()) for x in images]


# ---------------------------------------------------------------- tiny checkpoints in official layouts
NEEDS = {
    "hps": ["open_clip"],
    "image_reward": ["timm", "transformers"],
    "pickscore": ["transformers"],
    "clipscore": ["transformers"],
    "aesthetic": ["transformers"],
    "git_vqa": ["transformers"],
    "grounding_dino": ["transformers"],
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Lazily written tiny checkpoints: weights(name) -> the reward's path options."""
    root, made = tmp_path_factory.mktemp("weights"), {}

    def get(name: str) -> dict:
        for module in NEEDS[name]:
            pytest.importorskip(module, reason=f"{name} needs {module} (the rewards extra)")
        if name not in made:
            made[name] = synthetic.write(name, root, "tiny")
        return made[name]

    return get


@pytest.fixture(scope="module")
def built(weights):
    """built(name, dtype) -> a cached reward instance on the CPU."""
    cache = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in cache:
            cache[name, dtype] = build_reward(name, device="cpu", dtype=dtype, **weights(name))
        return cache[name, dtype]

    return get


# ---------------------------------------------------------------- the common contract
@pytest.mark.parametrize("name", list(NEEDS))
def test_shape_determinism_batching_and_input_types(built, name):
    reward = built(name)
    images = images_u8()
    scores = reward(images, PROMPTS, METADATA)
    assert scores.shape == (4,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    torch.testing.assert_close(reward(images, PROMPTS, METADATA), scores, rtol=0, atol=0)  # deterministic
    singles = torch.cat([reward(images[i : i + 1], PROMPTS[i : i + 1], METADATA[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(singles, scores, rtol=1e-4, atol=1e-5)  # batch of 4 == four batches of 1
    torch.testing.assert_close(reward(images.float() / 255, PROMPTS, METADATA), scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(NEEDS))
def test_bfloat16_reward_returns_float32_close_to_float32(built, name):
    images = images_u8()
    low, full = built(name, "bfloat16"), built(name)
    assert low.dtype == torch.bfloat16
    got, want = low(images, PROMPTS, METADATA), full(images, PROMPTS, METADATA)
    assert got.dtype == torch.float32
    scale = want.abs().max().item() + 1e-3
    assert (got - want).abs().max().item() <= 0.1 * scale + 0.02  # detection thresholds may flip a 0.2 step
    if name == "grounding_dino":
        return
    assert (got - want).abs().max().item() <= 0.05 * scale


@pytest.mark.parametrize("name", ["hps", "image_reward", "pickscore", "git_vqa"])  # clipscore: same path as pickscore
def test_scores_depend_on_the_prompt(built, name):
    reward = built(name)
    images = images_u8(batch=2)
    a = reward(images, ["a red cat", "a red cat"], [{"nouns": ["red cat"]}] * 2)  # git_vqa asks about the nouns
    b = reward(images, ["two dogs", "two dogs"], [{"nouns": ["two dogs"]}] * 2)
    assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize(
    "name, spec_file",
    [
        ("hps", "hps/HPS_v2.1_compressed.pt"),
        ("image_reward", "image_reward"),
        ("pickscore", "pickscore"),
        ("clipscore", "clip-vit-large-patch14"),
        ("aesthetic", "aesthetic/sac+logos+ava1-l14-linearMSE.pth"),
        ("git_vqa", "git-large-vqav2"),
        ("grounding_dino", "grounding-dino-tiny"),
    ],
)
def test_missing_weights_raise_the_named_error(tmp_path, monkeypatch, name, spec_file):
    monkeypatch.setenv("MARGRPO_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(MissingWeightsError) as err:
        build_reward(name, device="cpu")
    text = str(err.value)
    assert str(tmp_path / spec_file) in text and "expected layout" in text and "published at: http" in text


# ---------------------------------------------------------------- per-reward checks against the documented pipeline
def _open_clip_hps(weights, pixels: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """HPS as open_clip computes it on already preprocessed pixels: cos(image, text) of the checkpoint."""
    import open_clip

    model = open_clip.create_model("ViT-H-14", pretrained=None, output_dict=True, **OPEN_CLIP_TINY)
    model.load_state_dict(torch.load(weights("hps")["path"], weights_only=True)["state_dict"])
    model.eval()
    with torch.no_grad():
        out = model(pixels, open_clip.get_tokenizer("ViT-H-14")(prompts))
    return (out["image_features"] * out["text_features"]).sum(-1)


def test_hps_letterboxes_like_hpsv2_by_default(built, weights):
    import torchvision.transforms.functional as TF

    reward = built("hps")
    images = images_u8(height=40, width=24)  # portrait: the letterbox pads left and right
    # hpsv2's light-augmentation transform on each PIL image: ToTensor, long edge to 32 bicubic, pad, normalise
    pixels = []
    for pil in to_pil(images):
        x = TF.to_tensor(pil)
        x = TF.resize(x, [32, round(24 * 32 / 40)], TF.InterpolationMode.BICUBIC)
        pixels.append(TF.normalize(TF.pad(x, [6, 0, 7, 0], fill=0), CLIP_MEAN, CLIP_STD))
    pixels = torch.stack(pixels)
    assert (reward.transform(images.float() / 255) - pixels).abs().max() < 1e-5
    torch.testing.assert_close(reward(images, PROMPTS), _open_clip_hps(weights, pixels, PROMPTS), atol=1e-5, rtol=0)


def test_hps_center_crop_option_is_open_clips_validation_transform(weights):
    import open_clip

    reward = build_reward("hps", device="cpu", preprocess="center_crop", **weights("hps"))
    images = images_u8()
    preprocess = open_clip.image_transform(32, is_train=False)
    pixels = torch.stack([preprocess(p) for p in to_pil(images)])
    assert (reward.transform(images.float() / 255) - pixels).abs().max() < 0.03
    torch.testing.assert_close(reward(images, PROMPTS), _open_clip_hps(weights, pixels, PROMPTS), atol=2e-3, rtol=0)
    letterboxed = build_reward("hps", device="cpu", **weights("hps"))
    assert (letterboxed(images, PROMPTS) - reward(images, PROMPTS)).abs().max() > 1e-4  # non-square: they differ
    square = images_u8(height=32, width=32)
    torch.testing.assert_close(letterboxed(square, PROMPTS), reward(square, PROMPTS), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="preprocess: got 'crop', expected one of letterbox, center_crop"):
        build_reward("hps", device="cpu", preprocess="crop", **weights("hps"))


def test_hps_corrupt_and_mismatched_checkpoints(tmp_path, weights):
    spec = weights("hps")
    bad = tmp_path / "HPS_v2.1_compressed.pt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(CorruptWeightsError, match=r"cannot read weights file .*HPS_v2.1_compressed.pt"):
        build_reward("hps", path=str(bad), architecture=spec["architecture"], device="cpu")
    state = torch.load(spec["path"], weights_only=True)["state_dict"]
    state.pop("text_projection")
    torch.save({"state_dict": state}, bad)
    with pytest.raises(CorruptWeightsError, match="1 missing keys: text_projection"):
        build_reward("hps", path=str(bad), architecture=spec["architecture"], device="cpu")


def _hf_clip_reference(directory: str, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, object]:
    """PickScore as its authors compute it: processor on PIL images, CLIPModel logits_per_image."""
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

    processor = CLIPImageProcessor.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = CLIPModel.from_pretrained(directory).eval()
    pixels = processor(images=to_pil(images), return_tensors="pt")["pixel_values"]
    tokens = tokenizer(prompts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        out = model(pixel_values=pixels, input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
    return out.logits_per_image.diag(), (pixels, model, out)


def test_pickscore_and_clipscore_match_the_transformers_pipeline(built, weights):
    images = images_u8()
    expected, (pixels, _, _) = _hf_clip_reference(weights("pickscore")["path"], images, PROMPTS)
    reward = built("pickscore")
    assert (reward.clip.transform(images.float() / 255) - pixels).abs().max() < 0.03
    torch.testing.assert_close(reward(images, PROMPTS), expected, atol=0.03, rtol=0)
    expected_cs, (_, model, out) = _hf_clip_reference(weights("clipscore")["path"], images, PROMPTS)
    cosine = expected_cs / model.logit_scale.exp()
    assert (cosine > 0).any() and (cosine < 0).any()  # this seed exercises both sides of the clamp
    torch.testing.assert_close(built("clipscore")(images, PROMPTS), (100 * cosine).clamp(min=0), atol=0.2, rtol=0)


def test_aesthetic_is_the_head_on_normalised_clip_features(built, weights):
    from margrpo.rewards.mlp_head import ScoreMLP

    images = images_u8()
    _, (_, model, out) = _hf_clip_reference(weights("aesthetic")["clip_path"], images, PROMPTS)
    head = ScoreMLP(16)
    head.load_state_dict(torch.load(weights("aesthetic")["path"], weights_only=True))
    with torch.no_grad():
        expected = head.eval()(out.image_embeds)  # image_embeds are L2-normalised
    got = built("aesthetic")(images, PROMPTS)
    torch.testing.assert_close(got, expected, atol=0.02 * expected.abs().max().item() + 1e-3, rtol=0)
    assert torch.equal(got, built("aesthetic")(images, ["unrelated"] * 4))  # prompt-free


def test_image_reward_checkpoint_keys_and_transform(built, weights, tmp_path):
    import torchvision.transforms as T

    state = torch.load(Path(weights("image_reward")["path"]) / "ImageReward.pt", weights_only=True)
    release_keys = [  # names as in the published ImageReward.pt
        "blip.visual_encoder.cls_token",
        "blip.visual_encoder.pos_embed",
        "blip.visual_encoder.patch_embed.proj.weight",
        "blip.visual_encoder.blocks.0.attn.qkv.weight",
        "blip.visual_encoder.blocks.1.mlp.fc2.bias",
        "blip.visual_encoder.norm.weight",
        "blip.text_encoder.embeddings.word_embeddings.weight",
        "blip.text_encoder.embeddings.LayerNorm.bias",
        "blip.text_encoder.embeddings.position_ids",
        "blip.text_encoder.encoder.layer.0.attention.self.query.weight",
        "blip.text_encoder.encoder.layer.0.crossattention.self.key.weight",
        "blip.text_encoder.encoder.layer.0.crossattention.output.LayerNorm.weight",
        "blip.text_encoder.encoder.layer.0.output.dense.weight",
        "blip.vision_proj.weight",
        "blip.text_proj.bias",
        "mlp.layers.0.weight",
        "mlp.layers.2.weight",
        "mlp.layers.4.weight",
        "mlp.layers.6.weight",
        "mlp.layers.7.bias",
    ]
    assert set(release_keys) <= set(state)
    assert not any(".pooler." in k or "token_type" in k for k in state)
    reward = built("image_reward")
    images = images_u8()
    documented = T.Compose(
        [T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32), T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)]
    )
    pixels = torch.stack([documented(p) for p in to_pil(images)])
    assert (reward.transform(images.float() / 255) - pixels).abs().max() < 0.03
    # loaded non-strictly like the official loader: extra tensors and unused missing ones are named, not refused
    directory = tmp_path / "ir"
    directory.mkdir()
    (directory / "med_config.json").write_text((Path(weights("image_reward")["path"]) / "med_config.json").read_text())
    write_bert_vocab(directory / "bert-base-uncased")
    lenient = {k: v for k, v in state.items() if not k.startswith("blip.vision_proj.")}
    torch.save({**lenient, "blip.text_decoder.cls.bias": torch.zeros(3)}, directory / "ImageReward.pt")
    with pytest.warns(
        UserWarning,
        match=r"1 unexpected keys ignored: blip.text_decoder.cls.bias; 2 missing keys left "
        r"at init \(not used by the score\): blip.vision_proj.bias, blip.vision_proj.weight",
    ):
        loaded = build_reward("image_reward", path=str(directory), device="cpu")
    torch.testing.assert_close(loaded(images, PROMPTS), reward(images, PROMPTS), atol=1e-6, rtol=0)
    torch.save({k: v for k, v in state.items() if k != "mlp.layers.7.bias"}, directory / "ImageReward.pt")
    with pytest.raises(CorruptWeightsError, match="1 missing keys the score needs: mlp.layers.7.bias"):
        build_reward("image_reward", path=str(directory), device="cpu")


def test_git_vqa_matches_the_reference_procedure(built, weights):
    from transformers import AutoTokenizer, CLIPImageProcessor, GitForCausalLM

    directory = weights("git_vqa")["path"]
    reward = built("git_vqa")
    images = images_u8()
    got = reward(images, PROMPTS, METADATA)
    # the MAR-GRPO procedure: one question at a time, softmax over the last position's logits
    processor, tokenizer = CLIPImageProcessor.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    model = GitForCausalLM.from_pretrained(directory).eval()
    yes, no = tokenizer.encode("yes", add_special_tokens=False)[0], tokenizer.encode("no", add_special_tokens=False)[0]
    questions = [["red cat?"], 0.0, 0.0, 1.0]  # spatial/numeracy: 0 unasked; no nouns: 1 unasked (the reference)
    for i, qs in enumerate(questions):
        if isinstance(qs, float):
            assert got[i] == qs
            continue
        pixels = processor(images=to_pil(images[i : i + 1]), return_tensors="pt")["pixel_values"]
        probs = []
        for q in qs:
            ids = torch.tensor([[tokenizer.cls_token_id] + tokenizer.encode(q, add_special_tokens=False)])
            with torch.no_grad():
                p = model(pixel_values=pixels, input_ids=ids).logits[:, -1].softmax(-1)[0]
            probs.append((p[yes] / (p[yes] + p[no])).item())
        assert got[i].item() == pytest.approx(float(np.mean(probs)), abs=0.02)
    two = reward(images[:1].expand(2, -1, -1, -1), ["x", "x"], [{"nouns": ["cat"]}, {"nouns": ["cat", "dog"]}])
    single = reward(images[:1].expand(2, -1, -1, -1), ["x", "x"], [{"nouns": ["cat"]}, {"nouns": ["dog"]}])
    assert two[1].item() == pytest.approx((single[0] + single[1]).item() / 2, abs=1e-5)  # mean over questions
    # no_nouns='ask_prompt': an image without nouns is asked "{prompt}?" instead of scoring 1
    asking = build_reward("git_vqa", device="cpu", no_nouns="ask_prompt", **weights("git_vqa"))
    asked = asking(images, PROMPTS, METADATA)
    torch.testing.assert_close(asked[:3], got[:3], atol=1e-6, rtol=0)
    as_noun = reward(images[3:], ["x"], [{"nouns": ["a dog"]}])  # the same question, asked through the nouns
    assert asked[3].item() == pytest.approx(as_noun.item(), abs=1e-6) and asked[3].item() != 1.0
    with pytest.raises(ValueError, match="no_nouns: got 'zero', expected one of one, ask_prompt"):
        build_reward("git_vqa", device="cpu", no_nouns="zero", **weights("git_vqa"))


def test_grounding_dino_transform_matches_its_processor(built, weights):
    from transformers import GroundingDinoImageProcessor

    processor = GroundingDinoImageProcessor.from_pretrained(weights("grounding_dino")["path"])
    images = images_u8()
    expected = processor(images=to_pil(images), return_tensors="pt")["pixel_values"]
    ours = built("grounding_dino").transform(images.float() / 255)
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() < 0.05


def _cxcywh(xyxy: torch.Tensor) -> torch.Tensor:
    return torch.cat([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], -1)


def test_grounding_dino_scores_follow_detections(built, weights):
    from margrpo.rewards.compbench import CompBenchItem

    reward = built("grounding_dino")
    scores = reward(images_u8(), PROMPTS, METADATA)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert scores[3] == 1.0  # no nouns: nothing to violate
    # the scoring rules on hand-made detections (phrase scores [queries], boxes (cx, cy, w, h) [queries, 4])
    boxes = _cxcywh(torch.tensor([[0.05, 0.4, 0.25, 0.6], [0.06, 0.41, 0.26, 0.61], [0.7, 0.4, 0.9, 0.6]]))
    found = {"cat": torch.tensor([0.9, 0.1, 0.1]), "dog": torch.tensor([0.1, 0.2, 0.8])}
    item = CompBenchItem.from_metadata(METADATA[1], 1)
    assert reward._score_item(item, found, boxes) == pytest.approx(0.9)  # both found, cat left of dog
    flipped = CompBenchItem.from_metadata({**METADATA[1], "spatial_info": {"obj1": "dog", "obj2": "cat", "locality": "left of"}}, 1)
    assert reward._score_item(flipped, found, boxes) == pytest.approx(0.4)
    counted = CompBenchItem.from_metadata({"task_type": "numeracy", "numeracy_info": [{"obj_name": "cat", "num": 1}]}, 0)
    two_cats = {"cat": torch.tensor([0.9, 0.8, 0.1])}  # two overlapping boxes: NMS on corners keeps one
    corner_nms = build_reward("grounding_dino", device="cpu", nms_boxes="xyxy", **weights("grounding_dino"))
    assert corner_nms._score_item(counted, two_cats, boxes) == pytest.approx(1.0)
    counted2 = CompBenchItem.from_metadata({"task_type": "numeracy", "numeracy_info": [{"obj_name": "cat", "num": 2}]}, 0)
    assert corner_nms._score_item(counted2, two_cats, boxes) == pytest.approx(0.2)
    objects = CompBenchItem.from_metadata({"nouns": ["cat", "dog", "bird"]}, 0)
    found["bird"] = torch.tensor([0.1, 0.1, 0.2])
    assert reward._score_item(objects, found, boxes) == pytest.approx(2 / 3)
    # the reference reads (cx, cy, w, h) as corners: a box narrower than its centre's offset then has
    # x2 < x1 and overlaps nothing, so two detections of one small cat are both kept
    duplicate = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.51, 0.5, 0.2, 0.2]])  # (cx, cy, w, h): IoU 0.9
    cats = {"cat": torch.tensor([0.9, 0.8])}
    assert corner_nms._score_item(counted, cats, duplicate) == pytest.approx(1.0)  # one cat
    assert reward._score_item(counted, cats, duplicate) == pytest.approx(0.2)  # reference: two kept
    assert reward._score_item(counted2, cats, duplicate) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="nms_boxes: got 'xywh', expected one of cxcywh, xyxy"):
        build_reward("grounding_dino", device="cpu", nms_boxes="xywh", **weights("grounding_dino"))


@pytest.mark.parametrize("as_corners", [True, False])
def test_nms_count_is_torchvisions_nms(gen, as_corners):
    from torchvision.ops import nms

    from margrpo.rewards.grounding_dino import corners, nms_count

    for trial in range(200):
        n = int(torch.randint(1, 12, (), generator=gen))
        boxes = torch.rand(n, 4, generator=gen) * torch.tensor([1.0, 1.0, 0.5, 0.5]) + torch.tensor([0, 0, 0.05, 0.05])
        scores = torch.rand(n, generator=gen)
        boxes = corners(boxes) if as_corners else boxes  # the reference's (cx, cy, w, h) boxes, read as corners
        assert nms_count(boxes, scores) == len(nms(boxes, scores, 0.5)), (trial, boxes, scores)


def test_grounding_dino_phrases_are_scored_on_their_first_and_last_word(built, weights):
    from margrpo.rewards.grounding_dino import caption_for

    caption, spans = caption_for(["cat", "big red car", "blue sky"])
    assert caption == "cat . big red car . blue sky ."
    assert [[caption[a:b] for a, b in phrase] for phrase in spans] == [["cat"], ["big", "car"], ["blue", "sky"]]
    _, whole = caption_for(["cat", "big red car"], first_last=False)
    assert [[caption[a:b] for a, b in phrase] for phrase in whole] == [["cat"], ["big red car"]]
    # on the detector: the phrase "red cat dog" is the mean of the token probabilities of "red" and "dog"
    reward = built("grounding_dino")
    images = images_u8(batch=1).float() / 255  # detect() takes the unit-float images score() gets
    tokens = reward.tokenizer(["red cat dog . cat ."], return_tensors="pt")
    assert reward.tokenizer.convert_ids_to_tokens(tokens["input_ids"][0])[1:4] == ["red", "cat", "dog"]
    with torch.no_grad():
        out = reward.model(pixel_values=reward.transform(images), **tokens)
    probs = out.logits[0].sigmoid()  # [queries, tokens]; token 0 is [CLS]
    got = reward.detect(images, [["red cat dog", "cat"]])[0][0]
    torch.testing.assert_close(got[0], (probs[:, 1] + probs[:, 3]) / 2, atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], probs[:, 5], atol=1e-5, rtol=0)
    every = build_reward("grounding_dino", device="cpu", phrase_tokens="all", **weights("grounding_dino"))
    torch.testing.assert_close(every.detect(images, [["red cat dog", "cat"]])[0][0][0], probs[:, 1:4].mean(1), atol=1e-5, rtol=0)


def test_grounding_dino_original_checkpoint_layout_is_refused_with_the_conversion(tmp_path):
    original = tmp_path / "groundingdino_swint_ogc.pth"
    torch.save({"model": {"backbone.0.patch_embed.proj.weight": torch.zeros(1)}}, original)
    for path in (original, tmp_path):
        with pytest.raises(CorruptWeightsError) as err:
            build_reward("grounding_dino", device="cpu", path=str(path))
        text = str(err.value)
        assert "original GroundingDINO release layout" in text and "convert_grounding_dino_to_hf.py" in text
        assert "--model_name grounding-dino-tiny" in text and "IDEA-Research/grounding-dino-tiny" in text


def test_clipscore_torchmetrics_mode_cuts_token_ids_and_leaves_the_clamp_to_the_batch(built, weights):
    from transformers import AutoTokenizer, CLIPModel

    directory = weights("clipscore")["path"]
    images = images_u8()
    prompts = ["a red cat", "a red cat sitting on a dog left of a red dog", "a dog", "red"]  # 2nd: over 16 tokens
    tm = build_reward("clipscore", device="cpu", mode="torchmetrics", **weights("clipscore"))
    got = tm(images, prompts)
    # torchmetrics' procedure: pad without truncation, then cut ids and mask to the text context
    tokenizer, model = AutoTokenizer.from_pretrained(directory), CLIPModel.from_pretrained(directory).eval()
    tokens = tokenizer(prompts, padding=True, return_tensors="pt")
    context = model.config.text_config.max_position_embeddings
    assert tokens["input_ids"].shape[1] > context
    with torch.no_grad():
        text = model.get_text_features(input_ids=tokens["input_ids"][:, :context], attention_mask=tokens["attention_mask"][:, :context])
    text = torch.nn.functional.normalize(getattr(text, "pooler_output", text), dim=-1)
    image = tm.clip.image_embeddings(images.float() / 255)  # normalised, as the reward sees it
    torch.testing.assert_close(got, 100 * (image * text).sum(-1), atol=1e-4, rtol=0)
    per_image = built("clipscore")(images, prompts)
    assert (got < 0).any() and (per_image >= 0).all()  # no per-image clamp in torchmetrics mode
    short = [0, 2, 3]  # within the context both modes read the same text embedding
    torch.testing.assert_close(per_image[short], got[short].clamp(min=0), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="mode: got 'tm', expected one of per_image, torchmetrics"):
        build_reward("clipscore", device="cpu", mode="tm", **weights("clipscore"))


def test_errors_name_the_option_and_the_expected_layout(weights, tmp_path):
    import shutil

    checkpoint = Path(weights("image_reward")["path"]) / "ImageReward.pt"
    with pytest.raises(
        MissingWeightsError,
        match=r"image_reward: option path=.*ImageReward\.pt is a file, expected "
        r"a dir \(expected layout: a directory with ImageReward\.pt",
    ):
        build_reward("image_reward", path=str(checkpoint), device="cpu")
    clip_dir = tmp_path / "clip-as-git"
    shutil.copytree(weights("clipscore")["path"], clip_dir)
    shutil.copy(Path(weights("git_vqa")["path"]) / "vocab.txt", clip_dir)
    with pytest.raises(
        CorruptWeightsError,
        match=r"git_vqa: option path=.*clip-as-git holds a 'clip' model "
        r"\(config.json model_type\), expected 'git' for GitForCausalLM "
        r"\(expected layout: a Hugging Face GIT directory",
    ):
        build_reward("git_vqa", path=str(clip_dir), device="cpu")
    model_only = tmp_path / "pickscore-model"
    model_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(weights("pickscore")["path"]) / name, model_only)
    with pytest.raises(
        MissingWeightsError,
        match=r"missing file .*preprocessor_config.json \(option path \(or "
        r"processor_path, a directory with the tokenizer files",
    ):
        build_reward("pickscore", path=str(model_only), device="cpu")
    with pytest.raises(MissingWeightsError, match=r"missing file .*preprocessor_config.json \(option processor_path;"):
        build_reward("pickscore", path=str(model_only), processor_path=str(tmp_path), device="cpu")
    built = build_reward("pickscore", path=str(model_only), processor_path=weights("pickscore")["path"], device="cpu")
    assert torch.isfinite(built(images_u8(), PROMPTS)).all()


def test_hf_directory_corrupt_or_incomplete(weights, tmp_path):
    import shutil

    directory = tmp_path / "pickscore"
    shutil.copytree(weights("pickscore")["path"], directory)
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json header.")
    with pytest.raises(CorruptWeightsError, match=r"cannot load CLIPModel from .*pickscore"):
        build_reward("pickscore", path=str(directory), device="cpu")
    (directory / "model.safetensors").unlink()
    with pytest.raises(MissingWeightsError, match=r"missing file .*model.safetensors or .*pytorch_model.bin"):
        build_reward("pickscore", path=str(directory), device="cpu")
    shutil.copy(Path(weights("pickscore")["path"]) / "model.safetensors", directory)
    (directory / "preprocessor_config.json").unlink()
    with pytest.raises(MissingWeightsError, match=r"missing file .*preprocessor_config.json"):
        build_reward("pickscore", path=str(directory), device="cpu")

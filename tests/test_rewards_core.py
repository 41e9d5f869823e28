"""margrpo.rewards without model weights: protocol, registry, weights errors, weighting, transforms, JPEG, shapes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import margrpo.rewards as rewards
from margrpo.rewards import weights as W
from margrpo.rewards.base import Reward, to_unit_float
from margrpo.rewards.preprocess import CLIP_MEAN, CLIP_STD, ImageTransform, center_crop, resized_hw
from margrpo.rewards.weighting import RewardTerm, RunningStats, WeightedReward


class Brightness(Reward):
    """Test reward: mean pixel value times a factor (exact, cheap, batch-independent)."""

    name = "brightness"

    def __init__(self, factor: float = 1.0, device: str | None = "cpu", dtype=torch.float32, batch_size=None):
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        self.factor = factor
        self.calls = []

    def score(self, images, prompts, metadata):
        self.calls.append(images.shape[0])
        return self.factor * images.double().mean((1, 2, 3))


def random_images(batch=4, height=20, width=24, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, height, width), generator=g, dtype=torch.uint8)


# ---------------------------------------------------------------- protocol
def test_uint8_and_float_inputs_give_the_same_scores():
    images = random_images()
    reward = Brightness()
    a = reward(images, ["p"] * 4)
    b = reward(images.float() / 255, ["p"] * 4)
    assert a.dtype == torch.float32 and a.shape == (4,)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, images.double().mean((1, 2, 3)).float() / 255)


def test_batch_size_chunks_and_concatenates_in_order():
    images = random_images(batch=5)
    whole = Brightness()(images, ["p"] * 5)
    chunked = Brightness(batch_size=2)
    torch.testing.assert_close(chunked(images, ["p"] * 5), whole)
    assert chunked.calls == [2, 2, 1]


@pytest.mark.parametrize(
    "images, prompts, metadata, match",
    [
        (torch.zeros(2, 20, 20, 3), ["a", "b"], None, r"images: got shape \(2, 20, 20, 3\)"),
        (torch.zeros(2, 3, 8, 8, dtype=torch.int32), ["a", "b"], None, "images: got dtype torch.int32"),
        (torch.full((2, 3, 8, 8), -1.0), ["a", "b"], None, r"must lie in \[0, 1\]; got min -1"),
        (torch.full((2, 3, 8, 8), float("nan")), ["a", "b"], None, r"must lie in \[0, 1\]"),
        (torch.zeros(2, 3, 8, 8), ["a"], None, "prompts: got 1 prompts, expected a list of 2"),
        (torch.zeros(2, 3, 8, 8), "ab", None, "prompts: got a single string"),
        (torch.zeros(2, 3, 8, 8), ["a", "b"], [{}], "metadata: got 1 entries, expected 2"),
    ],
)
def test_bad_inputs_name_the_argument(images, prompts, metadata, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Brightness()(images, prompts, metadata)


def test_to_unit_float_clamps_rounding_slack_only():
    x = torch.tensor([0.0, 1.0005, -0.0004, 0.5]).view(1, 1, 1, 4).expand(1, 3, 1, 4)
    out = to_unit_float(x)
    assert out.min() >= 0 and out.max() <= 1
    assert out[0, 0, 0, 3] == 0.5


# ---------------------------------------------------------------- registry
def test_registry_builds_by_name_and_rejects_unknown_names_and_options():
    assert {
        "hps",
        "image_reward",
        "pickscore",
        "clipscore",
        "aesthetic",
        "git_vqa",
        "grounding_dino",
        "jpeg_compressibility",
        "jpeg_incompressibility",
        "shapes",
        "remote",
    } <= set(rewards.available_rewards())
    reward = rewards.build_reward("jpeg_compressibility", quality=80)
    assert reward.quality == 80 and reward.name == "jpeg_compressibility"
    with pytest.raises(KeyError, match="unknown name 'nope'"):
        rewards.build_reward("nope")
    with pytest.raises(ValueError, match="unknown option.*qualty.*accepted: quality"):
        rewards.build_reward("jpeg_compressibility", qualty=80)


def test_registering_a_taken_name_is_an_error():
    with pytest.raises(ValueError, match="already taken"):
        rewards.register("hps")(Brightness)


# ---------------------------------------------------------------- weights
SPEC = W.WeightsSpec("demo", "demo/weights.pt", "one file weights.pt", "https://example.org/demo")


def test_missing_weights_name_file_layout_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv(W.WEIGHTS_DIR_ENV, str(tmp_path))
    with pytest.raises(W.MissingWeightsError) as err:
        W.resolve(SPEC, None)
    text = str(err.value)
    assert str(tmp_path / "demo" / "weights.pt") in text and "one file weights.pt" in text
    assert "https://example.org/demo" in text
    monkeypatch.delenv(W.WEIGHTS_DIR_ENV)
    with pytest.raises(W.MissingWeightsError, match="MARGRPO_WEIGHTS_DIR is not set"):
        W.resolve(SPEC, None)
    with pytest.raises(W.MissingWeightsError, match=r"weights dir not found: .*absent \(option path;"):
        W.resolve(SPEC, tmp_path / "absent", kind="dir")


def test_a_file_where_a_directory_is_expected_names_the_option(tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"x")
    spec = W.WeightsSpec("demo", "demo", "a directory with weights.pt", "https://example.org/demo", option="clip_path")
    with pytest.raises(
        W.MissingWeightsError,
        match=r"option clip_path=.*weights\.pt is a file, expected a dir "
        r"\(expected layout: a directory with weights\.pt",
    ):
        W.resolve(spec, tmp_path / "weights.pt", kind="dir")
    with pytest.raises(W.MissingWeightsError, match="option clip_path=.* is a directory, expected a file"):
        W.resolve(spec, tmp_path, kind="file")


def test_weights_dir_env_is_used(tmp_path, monkeypatch):
    (tmp_path / "demo").mkdir()
    torch.save({"w": torch.ones(2)}, tmp_path / "demo" / "weights.pt")
    monkeypatch.setenv(W.WEIGHTS_DIR_ENV, str(tmp_path))
    assert W.resolve(SPEC, None) == tmp_path / "demo" / "weights.pt"


def test_read_state_dict_unwraps_containers_and_rejects_garbage(tmp_path):
    net = torch.nn.Linear(3, 2)
    state = {f"module.{k}": v for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "a.pt")
    loaded = W.read_state_dict(SPEC, tmp_path / "a.pt")
    assert set(loaded) == {"weight", "bias"}
    (tmp_path / "b.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(W.CorruptWeightsError, match=r"cannot read weights file .*b\.pt"):
        W.read_state_dict(SPEC, tmp_path / "b.pt")
    (tmp_path / "c.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(W.CorruptWeightsError, match="c.safetensors"):
        W.read_state_dict(SPEC, tmp_path / "c.safetensors")


def test_load_exact_reports_missing_unexpected_and_shape_mismatch(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    good = net.state_dict()
    W.load_exact(SPEC, net, dict(good), tmp_path / "x.pt")  # exact: fine
    bad = dict(good)
    del bad["1.bias"]
    bad["extra"] = torch.zeros(1)
    bad["0.weight"] = torch.zeros(5, 5)
    with pytest.raises(W.CorruptWeightsError) as err:
        W.load_exact(SPEC, net, bad, tmp_path / "x.pt")
    text = str(err.value)
    assert "1 missing keys: 1.bias" in text and "1 unexpected keys: extra" in text
    assert "0.weight: file (5, 5) vs model (2, 3)" in text
    W.load_exact(SPEC, net, {**good, "skip.me": torch.zeros(1)}, tmp_path / "x.pt", ignore_prefixes=("skip.",))


def test_load_reporting_names_skipped_keys_and_refuses_missing_essentials(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    source = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).state_dict()
    partial = {k: v for k, v in source.items() if k != "1.bias"}
    before = net[1].bias.clone()
    with pytest.warns(UserWarning, match=r"1 unexpected keys ignored: extra; 1 missing keys left at init .*: 1\.bias"):
        W.load_reporting(SPEC, net, {**partial, "extra": torch.zeros(1)}, tmp_path / "x.pt", essential_prefixes=("0.",))
    assert torch.equal(net[0].weight, source["0.weight"]) and torch.equal(net[1].bias, before)
    with pytest.raises(W.CorruptWeightsError, match="1 missing keys the score needs: 0.bias"):
        W.load_reporting(SPEC, net, {k: v for k, v in source.items() if k != "0.bias"}, tmp_path / "x.pt", essential_prefixes=("0.",))
    with pytest.raises(W.CorruptWeightsError, match=r"1 shape mismatches: 1.weight: file \(1, 5\)"):
        W.load_reporting(SPEC, net, {**source, "1.weight": torch.zeros(1, 5)}, tmp_path / "x.pt", essential_prefixes=("0.",))


# ---------------------------------------------------------------- weighting
def test_weighted_sum_raw_normalized_and_logging():
    images = random_images(batch=6)
    mix = WeightedReward(
        [
            RewardTerm("a", Brightness(factor=1.0), weight=2.0),
            RewardTerm("b", Brightness(factor=10.0), weight=0.5, normalize="batch"),
        ]
    )
    result = mix(images, ["p"] * 6)
    base = images.double().mean((1, 2, 3)) / 255
    torch.testing.assert_close(result.raw["a"], base.float())
    z = (10 * base - (10 * base).mean()) / ((10 * base).std(unbiased=False) + 1e-6)
    torch.testing.assert_close(result.normalized["b"], z.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.total, (2 * base + 0.5 * z).float(), atol=1e-5, rtol=1e-5)
    logs = result.log_values()
    assert logs["reward/b/raw_mean"] == pytest.approx((10 * base).mean().item(), rel=1e-5)
    assert abs(logs["reward/b/normalized_mean"]) < 1e-5
    assert logs["reward/total_mean"] == pytest.approx(result.total.mean().item())


def test_running_normalization_tracks_ema_statistics():
    stats = RunningStats(momentum=0.5)
    first, second = torch.tensor([1.0, 3.0]), torch.tensor([5.0, 9.0])
    stats.update(first)
    assert stats.mean == 2.0 and stats.var == 1.0
    stats.update(second)
    # mixture of two equally weighted batches: mean 4.5, var = (1 + 4) / 2 + 0.25 * 5^2
    all_values = torch.cat([first, second]).double()
    assert stats.mean == pytest.approx(all_values.mean().item())
    assert stats.var == pytest.approx(all_values.var(unbiased=False).item())


def test_build_rewards_from_config(tmp_path):
    mix = rewards.build_rewards(
        {"jpeg_compressibility": 1.0, "big": {"reward": "jpeg_incompressibility", "weight": 0.25, "quality": 50, "normalize": "running"}},
        device="cpu",
    )
    assert [t.name for t in mix.terms] == ["jpeg_compressibility", "big"]
    assert mix.terms[1].reward.quality == 50 and mix.terms[1].normalize == "running"
    images = random_images(batch=3, height=32, width=32)
    result = mix(images, ["p"] * 3)
    torch.testing.assert_close(
        result.raw["big"], rewards.build_reward("jpeg_incompressibility", quality=50, device="cpu")(images, ["p"] * 3)
    )
    with pytest.raises(ValueError, match="normalize got 'zscore'"):
        rewards.build_rewards({"jpeg_compressibility": {"normalize": "zscore"}}, device="cpu")
    with pytest.raises(TypeError, match="rewards.jpeg_compressibility: got 'x'"):
        rewards.build_rewards({"jpeg_compressibility": "x"})


# ---------------------------------------------------------------- transforms
def _pil_clip_reference(images: torch.Tensor, size: int) -> torch.Tensor:
    """The documented CLIP transform on PIL images: Resize(size, BICUBIC), CenterCrop, ToTensor, Normalize."""
    out = []
    for image in images:
        pil = Image.fromarray(image.permute(1, 2, 0).numpy())
        w, h = pil.size
        (new_h, new_w) = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
        pil = pil.resize((new_w, new_h), Image.BICUBIC)
        left, top = int(round((new_w - size) / 2.0)), int(round((new_h - size) / 2.0))
        pil = pil.crop((left, top, left + size, top + size))
        x = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255
        out.append((x - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1))
    return torch.stack(out)


def smooth_images(batch=3, height=90, width=70, seed=1) -> torch.Tensor:
    """Natural-ish uint8 images (smooth gradients + blobs): resampling filters agree on these."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(batch, 3, 6, 5, generator=g)
    x = torch.nn.functional.interpolate(low, size=(height, width), mode="bilinear", align_corners=False)
    return (x * 255).round().to(torch.uint8)


@pytest.mark.parametrize("hw", [(90, 70), (48, 64), (300, 260)])
def test_clip_transform_matches_the_pil_pipeline(hw):
    images = smooth_images(height=hw[0], width=hw[1])
    ours = ImageTransform.clip(32)(images.float() / 255)
    ref = _pil_clip_reference(images, 32)
    assert ours.shape == ref.shape == (3, 3, 32, 32)
    diff = (ours - ref).abs()
    assert diff.max() < 0.03 and diff.mean() < 0.006  # uint8 rounding is 0.0146 in these units


@pytest.mark.parametrize("hw", [(480, 640), (512, 384), (100, 150), (61, 200), (224, 224), (500, 500), (224, 168)])
def test_letterbox_matches_torchvision_resize_and_pad_on_float_tensors(hw):
    """hpsv2's ResizeMaxSize on a ToTensor() image: long edge to 224 (short edge round()ed), bicubic on
    the float tensor with torchvision's tensor antialiasing, zero padding centred, then normalised."""
    import torchvision.transforms.functional as TF

    images = smooth_images(batch=2, height=hw[0], width=hw[1], seed=hw[0] + hw[1])
    x = images.float() / 255
    ours = ImageTransform.clip_letterbox(224)(x)
    scale = 224 / max(hw)
    new = [round(d * scale) for d in hw]
    pad_h, pad_w = 224 - new[0], 224 - new[1]
    ref = TF.resize(x.double(), new, TF.InterpolationMode.BICUBIC, antialias=True) if scale != 1 else x.double()
    ref = TF.pad(ref, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    ref = TF.normalize(ref, CLIP_MEAN, CLIP_STD)
    assert ours.shape == ref.shape == (2, 3, 224, 224)
    torch.testing.assert_close(ours.double(), ref, atol=2e-5, rtol=0)
    if hw[0] != hw[1]:  # the padding is black before normalisation
        black = -torch.tensor(CLIP_MEAN, dtype=torch.float64) / torch.tensor(CLIP_STD, dtype=torch.float64)
        corner = ours[0, :, 0, 0].double()
        torch.testing.assert_close(corner, black.float().double(), atol=1e-6, rtol=0)


def test_letterbox_refuses_a_crop():
    with pytest.raises(ValueError, match=r"letterbox pads to 224x224; got crop=\(224, 224\)"):
        ImageTransform(224, (224, 224), CLIP_MEAN, CLIP_STD, letterbox=True)


def test_resize_rules():
    assert resized_hw(512, 512, 224) == (224, 224)
    assert resized_hw(300, 200, 224) == (336, 224)
    assert resized_hw(200, 300, 800, longest=1000) == (667, 1000)  # long side capped: 800 -> round(1000 * 200 / 300)
    x = torch.arange(2 * 5 * 6.0).view(1, 2, 5, 6)
    assert torch.equal(center_crop(x, 3, 2), x[..., 1:4, 2:4])
    with pytest.raises(ValueError, match="crop 6x6 is larger than the image 5x6"):
        center_crop(x, 6, 6)


def test_transform_from_hf_config(tmp_path):
    path = tmp_path / "preprocessor_config.json"
    path.write_text(
        '{"size": {"shortest_edge": 800, "longest_edge": 1333}, "resample": 2, '
        '"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}'
    )
    t = ImageTransform.from_hf_config(path)
    assert (t.size, t.max_size, t.mode, t.crop) == (800, 1333, "bilinear", None)
    path.write_text('{"size": {"height": 3}}')
    with pytest.raises(ValueError, match="expected 'shortest_edge'"):
        ImageTransform.from_hf_config(path)


# ---------------------------------------------------------------- JPEG
def test_jpeg_rewards_are_the_encoded_size():
    images = torch.cat([torch.full((1, 3, 32, 32), 128, dtype=torch.uint8), random_images(1, 32, 32)])
    comp = rewards.build_reward("jpeg_compressibility", device="cpu")(images, ["a", "b"])
    incomp = rewards.build_reward("jpeg_incompressibility", device="cpu")(images, ["a", "b"])
    for i in range(2):
        buffer = io.BytesIO()
        Image.fromarray(images[i].permute(1, 2, 0).numpy()).save(buffer, format="JPEG", quality=95)
        assert incomp[i].item() == pytest.approx(buffer.tell() / 1000)
    torch.testing.assert_close(comp, -incomp)
    assert comp[0] > comp[1]  # a flat image compresses better than noise
    with pytest.raises(ValueError, match="quality: got 0"):
        rewards.build_reward("jpeg_compressibility", quality=0)


# ---------------------------------------------------------------- ShapesWorld
def test_shapes_reward_wraps_the_verifier():
    verifier = pytest.importorskip("margrpo.testbed.verifier")
    from margrpo.testbed.grammar import enumerate_prompts
    from margrpo.testbed.render import render_batch

    prompts = [enumerate_prompts("single")[0], enumerate_prompts("spatial")[3]]
    images = render_batch(prompts, 0)
    swapped = prompts[::-1]  # each image scored against the other's prompt
    expected = verifier.score(images, swapped)
    for category in ("overall", "color", "shape", "count", "spatial"):
        got = rewards.build_reward("shapes", category=category, device="cpu")(images, swapped)
        torch.testing.assert_close(got, expected[category].float())
    matched = rewards.build_reward("shapes", device="cpu")(images, prompts)
    torch.testing.assert_close(matched, torch.ones(2))  # rendered scenes satisfy their own prompts
    assert (rewards.build_reward("shapes", device="cpu")(images, swapped) < 1).all()
    with pytest.raises(ValueError, match="category: got 'size'"):
        rewards.build_reward("shapes", category="size")

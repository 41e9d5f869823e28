"""Reward oracle: margrpo's rewards against the official packages, same random weights, same pixels.

    .venv/bin/python scripts/reward_oracle.py [--cache-dir DIR] [--rewards hps,image_reward,...]
                                              [--hps-size small|full] [--markdown FILE] [--json FILE]

For each reward, random-init weights are written in the official file layout (margrpo.rewards.synthetic),
then scored by margrpo and by the official code on the same images (several sizes and aspect ratios,
saved as PNG so both sides read the same uint8 pixels) and prompts of several lengths:
  hps           hpsv2.score (hpsv2==1.2.0)                  in venv-oracle-hpsv2
  image_reward  ImageReward.load(...).score (image-reward==1.5) in venv-oracle-image_reward
  clipscore     torchmetrics' CLIPScore (torchmetrics==1.9.0)  in venv-oracle-torchmetrics
  pickscore     the model card's procedure (transformers AutoProcessor/AutoModel on PIL images)
  aesthetic     the predictor's procedure (CLIP image features, L2-normalised, the published MLP)
  git_vqa       the MAR-GRPO reference's procedure (processor, one question at a time, softmax)
The official packages pin versions that conflict with margrpo's (hpsv2: pytest==7.2.0, protobuf<4;
image-reward: timm==0.6.13, fairscale==0.4.13, transformers<5), so each runs in its own venv under
--cache-dir, built on first use and reused. Their downloads are intercepted: the functions that
fetch weights or tokenizers are replaced by ones returning the local random-init files, and any
other hub call fails. This file runs in two roles: the driver (margrpo's venv) and, with --worker,
the official side inside an oracle venv, where only the official package is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# torch/torchvision: the builds this machine keeps on disk (pip takes them without a download).
# setuptools: torch wants >= 77; openai-clip (below) imports pkg_resources, which 81 removed
TORCH = ["torch==2.14.1", "torchvision==0.29.1", "setuptools>=77,<81"]
VENVS = {
    "hpsv2": ["hpsv2==1.2.0"],
    # image-reward's med.py imports helpers from transformers.modeling_utils that 4.45+ moved or removed;
    # its __init__ imports diffusers (for ReFL; recent releases need a newer transformers) and OpenAI's
    # `clip` (for its CLIP/aesthetic baselines, not declared)
    "image_reward": ["image-reward==1.5", "transformers==4.44.2", "diffusers==0.30.3", "openai-clip==1.0.1"],
    # torchmetrics 1.9.0 normalises get_image_features' output as a tensor, which transformers 5 no longer returns
    "torchmetrics": ["torchmetrics[multimodal]==1.9.0", "transformers<5"],
}
REWARDS = ("hps", "image_reward", "clipscore", "pickscore", "aesthetic", "git_vqa")
VENV_OF = {"hps": "hpsv2", "image_reward": "image_reward", "clipscore": "torchmetrics"}
# (height, width): square, landscape, portrait, small, already 224 on the long edge, very wide
SIZES = [(224, 224), (480, 640), (512, 384), (100, 150), (224, 168), (300, 1000)]
PROMPTS = [
    "a red cat",
    "a photograph of two dogs playing in a sunny park next to a small lake, highly detailed",
    "an intricate oil painting of an old lighthouse on a rocky cliff at dusk, waves crashing below, seagulls "
    "circling overhead, warm light spilling from the lantern room, storm clouds gathering over the horizon, "
    "a small fishing boat returning to the harbour, the village roofs glowing orange, reflections on the wet "
    "stones, a lonely figure walking along the path with a lantern, in the style of the nineteenth century "
    "romantic seascape painters, rich texture, dramatic contrast, and fine brushwork throughout the scene",
]
# GIT VQA metadata: attribute phrases, nouns only, nothing (scores 1), spatial (not scored: 0)
GIT_METADATA = [
    {"task_type": "color", "nouns": ["cat"], "attr_nouns": ["red cat"]},
    {"task_type": "object", "nouns": ["dog", "cat"]},
    {},
    {"task_type": "spatial", "nouns": ["cat", "dog"], "spatial_info": {"obj1": "cat", "obj2": "dog", "locality": "left of"}},
]
HPS_SMALL = {
    "embed_dim": 64,  # ViT-H-14's layout (patch 14 at 224 px), two layers of each tower
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


# ------------------------------------------------------------------------- venvs
def ensure_venv(cache_dir: Path, name: str) -> Path:
    """cache_dir/venv-oracle-NAME with its packages at their pins; returns its python (reused when built)."""
    venv = cache_dir / f"venv-oracle-{name}"
    python = venv / "bin" / "python"
    stamp = venv / "oracle-installed.txt"
    wanted = " ".join(TORCH + VENVS[name])
    if stamp.is_file() and stamp.read_text() == wanted:
        return python
    print(f"building {venv} ({wanted})", flush=True)
    if not python.exists():
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--upgrade", "pip", "wheel"], check=True)
    subprocess.run(pip + TORCH, check=True)
    # no build isolation: fairscale's sdist builds against the torch installed above
    subprocess.run(pip + ["--no-build-isolation"] + TORCH + VENVS[name], check=True)
    if name == "hpsv2":  # the hpsv2 1.2.0 wheel lacks its tokenizer's vocabulary: CLIP's, as open_clip ships it
        import open_clip

        bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
        target = subprocess.run(
            [str(python), "-c", "import importlib.util as u; print(u.find_spec('hpsv2').submodule_search_locations[0])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (Path(target) / "src" / "open_clip" / bpe.name).write_bytes(bpe.read_bytes())
    stamp.write_text(wanted)
    return python


def venv_versions(python: Path, packages: list[str]) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    out = subprocess.run([str(python), "-c", code, *packages], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


# ------------------------------------------------------------------------- official side (workers)
def _no_hub(*args, **kwargs):
    raise RuntimeError(f"reward_oracle: a hub download was attempted ({args}, {kwargs}); everything must be local")


def worker_hps(job: dict) -> list[float]:
    """hpsv2.score on each case, the laion download and the hub replaced by the local checkpoint."""
    from PIL import Image

    import hpsv2.src.open_clip.factory as factory

    if job["model_cfg"] is not None:  # a small model of ViT-H-14's layout under ViT-H-14's name
        factory._MODEL_CONFIGS["ViT-H-14"] = job["model_cfg"]
    factory.download_pretrained = lambda cfg, cache_dir=None: job["checkpoint"]  # 'laion2B-s32B-b79K'
    factory.download_pretrained_from_hf = _no_hub
    import hpsv2.img_score as img_score

    img_score.huggingface_hub.hf_hub_download = _no_hub
    scores = []
    for image, prompt in zip(job["images"], job["prompts"]):
        try:
            scores.append(float(img_score.score(Image.open(image), prompt, cp=job["checkpoint"], hps_version="v2.1")[0]))
        except RuntimeError as err:  # e.g. a non-square image whose long edge is already 224: left unpadded
            scores.append(f"{type(err).__name__}: {err}")
    return scores


def worker_image_reward(job: dict) -> list[float]:
    """ImageReward.load(file, med_config=...).score per case; bert-base-uncased from the local copy."""
    from PIL import Image
    from transformers import BertTokenizer

    import ImageReward as RM
    import ImageReward.models.BLIP.blip as blip
    import ImageReward.utils as utils

    class LocalBertTokenizer(BertTokenizer):
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            if name != "bert-base-uncased":
                raise RuntimeError(f"reward_oracle: unexpected tokenizer {name!r}")
            return BertTokenizer.from_pretrained(job["bert"], *args, local_files_only=True, **kwargs)

    blip.BertTokenizer = LocalBertTokenizer
    utils.hf_hub_download = _no_hub
    model = RM.load(job["checkpoint"], device="cpu", med_config=job["med_config"])
    return [float(model.score(prompt, Image.open(image))) for image, prompt in zip(job["images"], job["prompts"])]


def worker_clipscore(job: dict) -> dict:
    """torchmetrics' CLIPScore: per case the score its update step accumulates (100 * cos, before the
    clamp), and the metric over all cases as one batch (max(mean, 0))."""
    import numpy as np
    import torch
    from PIL import Image
    from torchmetrics.functional.multimodal.clip_score import _clip_score_update
    from torchmetrics.multimodal.clip_score import CLIPScore

    metric = CLIPScore(model_name_or_path=job["model"])
    images = [torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1) for p in job["images"]]
    single = [
        float(_clip_score_update(image, prompt, metric.model, metric.processor)[0][0]) for image, prompt in zip(images, job["prompts"])
    ]
    metric.update(images, job["prompts"])
    return {"single": single, "batch": float(metric.compute())}


WORKERS = {"hps": worker_hps, "image_reward": worker_image_reward, "clipscore": worker_clipscore}


# ------------------------------------------------------------------------- official procedures in margrpo's venv
def official_pickscore(options: dict, images: list[Path], prompts: list[str]) -> list[float]:
    """PickScore as its model card computes it: processor on the PIL image and prompt, logit_scale.exp() * cos."""
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    processor = AutoProcessor.from_pretrained(options["path"], local_files_only=True)
    model = AutoModel.from_pretrained(options["path"], local_files_only=True).eval()
    context = model.config.text_config.max_position_embeddings  # 77 for PickScore_v1
    scores = []
    with torch.no_grad():
        for image, prompt in zip(images, prompts):
            pixels = processor(images=Image.open(image), return_tensors="pt")
            text = processor(text=prompt, padding=True, truncation=True, max_length=context, return_tensors="pt")
            image_embs = _features(model.get_image_features(**pixels))
            text_embs = _features(model.get_text_features(**text))
            image_embs = image_embs / image_embs.norm(dim=-1, keepdim=True)
            text_embs = text_embs / text_embs.norm(dim=-1, keepdim=True)
            scores.append(float(model.logit_scale.exp() * (text_embs @ image_embs.T)[0, 0]))
    return scores


def official_aesthetic(options: dict, images: list[Path], prompts: list[str]) -> list[float]:
    """The LAION predictor's inference: CLIP ViT-L/14 image features, L2-normalised, then its MLP (the
    published layer layout, ReLUs commented out, loaded from the same .pth)."""
    import torch
    from PIL import Image
    from torch import nn
    from transformers import CLIPImageProcessor, CLIPModel

    state = torch.load(options["path"], map_location="cpu", weights_only=True)
    width = state["layers.0.weight"].shape[1]
    head = nn.Module()
    head.layers = nn.Sequential(
        nn.Linear(width, 1024),
        nn.Dropout(0.2),
        nn.Linear(1024, 128),
        nn.Dropout(0.2),
        nn.Linear(128, 64),
        nn.Dropout(0.1),
        nn.Linear(64, 16),
        nn.Linear(16, 1),
    )
    head.load_state_dict(state)
    head.eval()
    processor = CLIPImageProcessor.from_pretrained(options["clip_path"], local_files_only=True)
    model = CLIPModel.from_pretrained(options["clip_path"], local_files_only=True).eval()
    scores = []
    with torch.no_grad():
        for image in images:
            features = _features(model.get_image_features(**processor(images=Image.open(image), return_tensors="pt")))
            features = features / features.norm(dim=-1, keepdim=True)
            scores.append(float(head.layers(features.float())[0, 0]))
    return scores


def official_git(options: dict, images: list[Path], prompts: list[str], metadata: list[dict]) -> list[float]:
    """The MAR-GRPO reference's GIT VQA reward: per image, 0 for spatial/numeracy tasks; the attribute
    phrases if given, else the nouns, else 1; for each "{phrase}?" the softmax of the last logits,
    P(yes) / (P(yes) + P(no)); the mean over the phrases."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, GitForCausalLM

    processor = AutoProcessor.from_pretrained(options["path"], local_files_only=True)
    model = GitForCausalLM.from_pretrained(options["path"], local_files_only=True).eval()
    yes, no = processor.tokenizer.encode("yes")[1], processor.tokenizer.encode("no")[1]
    scores = []
    with torch.no_grad():
        for image, meta in zip(images, metadata):
            if meta.get("task_type") in ("spatial", "numeracy"):
                scores.append(0.0)
                continue
            phrases = meta.get("attr_nouns") if meta.get("attr_nouns") is not None else meta.get("nouns")
            if not phrases:
                scores.append(1.0)
                continue
            pixels = processor(images=Image.open(image), return_tensors="pt").pixel_values
            per_phrase = []
            for phrase in phrases:
                ids = [processor.tokenizer.cls_token_id] + processor(text=f"{phrase}?", add_special_tokens=False).input_ids
                probs = model(pixel_values=pixels, input_ids=torch.tensor([ids])).logits[:, -1].softmax(-1)[0]
                per_phrase.append(float(probs[yes] / (probs[yes] + probs[no])))
            scores.append(sum(per_phrase) / len(per_phrase))
    return scores


def margrpo_on_processor_pixels(name: str, options: dict, images: list[Path], prompts: list[str]) -> list[float]:
    """margrpo's pickscore / aesthetic / clipscore (mode='torchmetrics') network fed the Hugging Face
    processor's pixels (PIL resize on uint8) instead of its own tensor transform: isolates the
    preprocessing part of a difference."""
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from transformers import CLIPImageProcessor

    from margrpo.rewards import build_reward

    reward = build_reward(name, device="cpu", **options)
    processor = CLIPImageProcessor.from_pretrained(options["clip_path" if name == "aesthetic" else "path"])
    scores = []
    with torch.no_grad():
        for image, prompt in zip(images, prompts):
            pixels = processor(images=Image.open(image), return_tensors="pt")["pixel_values"]
            features = F.normalize(_features(reward.clip.model.get_image_features(pixel_values=pixels)), dim=-1)
            if name == "aesthetic":
                scores.append(float(reward.head(features)[0]))
            elif name == "clipscore":
                cosine = (features * reward.clip.text_embeddings([prompt], cut_after_tokenizing=True)).sum(-1)
                scores.append(float(reward.scale * cosine[0]))
            else:
                cosine = (features * reward.clip.text_embeddings([prompt])).sum(-1)
                scores.append(float(reward.clip.model.logit_scale.exp() * cosine[0]))
    return scores


def _features(output):
    # transformers 5 returns a model output from get_*_features, 4.x the projected tensor
    return output if hasattr(output, "norm") else output.pooler_output


# ------------------------------------------------------------------------- driver
def make_images(directory: Path) -> list[Path]:
    """Smooth random RGB images (low-res noise upsampled) of each size in SIZES, as PNG files."""
    import torch
    from PIL import Image

    paths = []
    generator = torch.Generator().manual_seed(0)
    for height, width in SIZES:
        low = torch.rand(1, 3, 6, 8, generator=generator)
        pixels = torch.nn.functional.interpolate(low, size=(height, width), mode="bicubic", align_corners=False)
        pixels = (pixels.clamp(0, 1)[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        path = directory / f"image-{height}x{width}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def read_uint8(path: Path):
    import numpy as np
    import torch
    from PIL import Image

    return torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)[None]


def margrpo_scores(name: str, options: dict, images: list[Path], prompts: list[str], metadata: list[dict] | None = None) -> list[float]:
    """margrpo's reward on each case, one image at a time (the sizes differ)."""
    from margrpo.rewards import build_reward

    reward = build_reward(name, device="cpu", **options)
    metadata = metadata or [{} for _ in images]
    return [float(reward(read_uint8(image), [prompt], [meta])[0]) for image, prompt, meta in zip(images, prompts, metadata)]


def run_worker(python: Path, name: str, job: dict, scratch: Path):
    job_file, out_file = scratch / f"{name}-job.json", scratch / f"{name}-out.json"
    job_file.write_text(json.dumps(job))
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a hub call fails, never fetches
    subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--worker", name, "--job", str(job_file), "--out", str(out_file)],
        check=True,
        env=offline,
    )
    return json.loads(out_file.read_text())


def cases(images: list[Path]) -> tuple[list[Path], list[str]]:
    """Every image with every prompt."""
    pairs = [(image, prompt) for image in images for prompt in PROMPTS]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def compare(
    name: str, official: list[float], ours: list[float], images: list[Path], prompts: list[str], **alternatives: list[float]
) -> dict:
    """Rows per case; an official score that is a string is the error the official code raised."""
    rows = []
    for i, (a, b) in enumerate(zip(official, ours)):
        row = {
            "image": images[i].stem.removeprefix("image-"),
            "prompt_words": len(prompts[i].split()),
            "official": a,
            "margrpo": b,
            "abs_diff": abs(a - b) if isinstance(a, float) else None,
        }
        row.update({k: v[i] for k, v in alternatives.items()})
        rows.append(row)
    scored = [r for r in rows if r["abs_diff"] is not None]
    result = {
        "reward": name,
        "rows": rows,
        "max_abs_diff": max(r["abs_diff"] for r in scored),
        "max_abs_official": max(abs(r["official"]) for r in scored),
        "official_failed": len(rows) - len(scored),
    }
    if "on_processor_pixels" in alternatives:
        result["max_abs_diff_on_processor_pixels"] = max(abs(r["official"] - r["on_processor_pixels"]) for r in scored)
    return result


def oracle(name: str, scratch: Path, cache_dir: Path, hps_size: str) -> dict:
    from margrpo.rewards import synthetic

    images = make_images(scratch)
    started = time.perf_counter()
    if name == "hps":
        options = synthetic.write("hps", scratch, "full") if hps_size == "full" else _small_hps(scratch)
        imgs, prompts = cases(images)
        job = {
            "checkpoint": options["path"],
            "images": [str(p) for p in imgs],
            "prompts": prompts,
            "model_cfg": None if hps_size == "full" else HPS_SMALL,
        }
        official = run_worker(ensure_venv(cache_dir, "hpsv2"), "hps", job, scratch)
        result = compare(
            name,
            official,
            margrpo_scores("hps", options, imgs, prompts),
            imgs,
            prompts,
            center_crop=margrpo_scores("hps", {**options, "preprocess": "center_crop"}, imgs, prompts),
        )
        result["model"] = f"ViT-H-14 layout, {'full size' if hps_size == 'full' else 'small (2+2 layers, width 64)'}"
    elif name == "image_reward":
        options = synthetic.write("image_reward", scratch, "full")  # the package hard-codes ViT-L and a 768 head
        directory = Path(options["path"])
        imgs, prompts = images, [PROMPTS[i % len(PROMPTS)] for i in range(len(images))]
        job = {
            "checkpoint": str(directory / "ImageReward.pt"),
            "med_config": str(directory / "med_config.json"),
            "bert": str(directory / "bert-base-uncased"),
            "images": [str(p) for p in imgs],
            "prompts": prompts,
        }
        official = run_worker(ensure_venv(cache_dir, "image_reward"), "image_reward", job, scratch)
        result = compare(name, official, margrpo_scores("image_reward", options, imgs, prompts), imgs, prompts)
        result["model"] = "full size (BLIP ViT-L/16 + BERT-base with cross-attention)"
    elif name == "clipscore":
        # torchmetrics accepts only hub names; its "openai" branch loads any path containing "openai"
        options = synthetic.write("clipscore", scratch / "openai", "tiny")
        imgs, prompts = cases(images)
        job = {"model": options["path"], "images": [str(p) for p in imgs], "prompts": prompts}
        official = run_worker(ensure_venv(cache_dir, "torchmetrics"), "clipscore", job, scratch)
        tm = margrpo_scores("clipscore", {**options, "mode": "torchmetrics"}, imgs, prompts)
        result = compare(
            name,
            official["single"],
            tm,
            imgs,
            prompts,
            per_image=margrpo_scores("clipscore", options, imgs, prompts),
            on_processor_pixels=margrpo_on_processor_pixels("clipscore", {**options, "mode": "torchmetrics"}, imgs, prompts),
        )
        result["batch"] = {"official": official["batch"], "margrpo": max(sum(tm) / len(tm), 0.0)}
        result["model"] = "tiny CLIP (16-token context, so prompts over 16 tokens are cut), mode='torchmetrics'"
    elif name in ("pickscore", "aesthetic"):  # CLIP-based: compared on our pixels and the processor's
        options = synthetic.write(name, scratch, "tiny")
        imgs, prompts = cases(images) if name == "pickscore" else (images, [PROMPTS[0]] * len(images))
        official = official_pickscore if name == "pickscore" else official_aesthetic
        result = compare(
            name,
            official(options, imgs, prompts),
            margrpo_scores(name, options, imgs, prompts),
            imgs,
            prompts,
            on_processor_pixels=margrpo_on_processor_pixels(name, options, imgs, prompts),
        )
        result["model"] = "tiny CLIP (16-token context)" if name == "pickscore" else "tiny CLIP + the published head layout"
    elif name == "git_vqa":
        options = synthetic.write("git_vqa", scratch, "tiny")
        imgs = [image for image in images for _ in GIT_METADATA]
        metadata = [meta for _ in images for meta in GIT_METADATA]
        prompts = [PROMPTS[0]] * len(imgs)
        result = compare(
            name,
            official_git(options, imgs, prompts, metadata),
            margrpo_scores("git_vqa", options, imgs, prompts, metadata),
            imgs,
            prompts,
            ask_prompt=margrpo_scores("git_vqa", {**options, "no_nouns": "ask_prompt"}, imgs, prompts, metadata),
        )
        for row, meta in zip(result["rows"], metadata):
            row["metadata"] = meta.get("task_type", "none") + ("+attr" if meta.get("attr_nouns") else "")
        result["model"] = "tiny GIT"
    else:
        raise KeyError(f"--rewards: got {name!r}, expected one of {', '.join(REWARDS)}")
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _small_hps(scratch: Path) -> dict:
    """A small ViT-H-14-layout HPS checkpoint (open_clip state dict under 'state_dict') and its config."""
    import open_clip
    import torch

    directory = scratch / "hps"
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "small-ViT-H-14.json"
    config.write_text(json.dumps(HPS_SMALL))
    torch.manual_seed(1)
    model = open_clip.create_model("ViT-H-14", pretrained=None, **HPS_SMALL)
    path = directory / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, path)
    return {"path": str(path), "architecture": str(config)}


def markdown(results: list[dict], versions: dict, machine: str) -> str:
    lines = [
        "# Reward oracle: margrpo against the official packages (2026-12-02)",
        "",
        f"Machine: {machine}. Command: `python scripts/reward_oracle.py --cache-dir /work` "
        "(margrpo's venv; the official packages in their own venvs).",
        "",
        "Same random-init weights in the official file layouts, same uint8 pixels (PNG files), "
        f"images {', '.join(f'{h}x{w}' for h, w in SIZES)} (height x width), prompts of "
        f"{', '.join(str(len(p.split())) for p in PROMPTS)} words.",
        "",
        "| reward | official side | model | cases | official failed | max abs diff | max abs score | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['reward']} | {r['official_side']} | {r['model']} | {len(r['rows'])} | "
            f"{r['official_failed']} | {r['max_abs_diff']:.2e} | {r['max_abs_official']:.4g} | {r['seconds']} |"
        )
    lines += [
        "",
        "Package versions in the oracle venvs: "
        + "; ".join(f"{venv}: " + ", ".join(f"{k} {v}" for k, v in pkgs.items()) for venv, pkgs in versions.items()),
        "",
    ]
    same_pixels = [f"{r['reward']} {r['max_abs_diff_on_processor_pixels']:.1e}" for r in results if "max_abs_diff_on_processor_pixels" in r]
    if same_pixels:
        lines += [
            "pickscore, aesthetic, clipscore: the official code resizes with PIL on uint8, margrpo on float "
            "tensors; fed the processor's pixels instead (column on_processor_pixels), margrpo's networks "
            "differ from the official scores by at most " + ", ".join(same_pixels) + ".",
            "",
        ]
    for r in results:
        extra = [k for k in r["rows"][0] if k not in ("image", "prompt_words", "official", "margrpo", "abs_diff")]
        lines += [f"## {r['reward']}", ""]
        if "batch" in r:
            lines += [
                f"Batch of all {len(r['rows'])} cases: torchmetrics {r['batch']['official']:.6f}, margrpo "
                f"max(mean, 0) {r['batch']['margrpo']:.6f}.",
                "",
            ]
        lines += [
            "| image | prompt words | " + " | ".join(extra) + (" | " if extra else "") + "official | margrpo | abs diff |",
            "|---|---:|" + "---:|" * (len(extra) + 3),
        ]
        for row in r["rows"]:
            cells = [row["image"], str(row["prompt_words"])] + [
                f"{row[k]:.6f}" if isinstance(row[k], float) else str(row[k]) for k in extra
            ]
            if row["abs_diff"] is None:
                cells += [f"fails: {row['official'][:90]}", f"{row['margrpo']:.6f}", "-"]
            else:
                cells += [f"{row['official']:.6f}", f"{row['margrpo']:.6f}", f"{row['abs_diff']:.1e}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


OFFICIAL_SIDE = {
    "hps": "hpsv2.score",
    "image_reward": "ImageReward.load().score",
    "clipscore": "torchmetrics CLIPScore",
    "pickscore": "model-card procedure",
    "aesthetic": "predictor procedure",
    "git_vqa": "MAR-GRPO reference procedure",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=Path.home() / ".cache" / "margrpo-oracle", help="where the oracle venvs live (venv-oracle-NAME)"
    )
    parser.add_argument("--rewards", default=",".join(REWARDS))
    parser.add_argument("--hps-size", choices=("small", "full"), default="small")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.out.write_text(json.dumps(WORKERS[args.worker](json.loads(args.job.read_text()))))
        return 0
    names = [n for n in args.rewards.split(",") if n]
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        parser.error(f"--rewards: unknown {unknown}, expected names from {', '.join(REWARDS)}")
    import torch

    from margrpo.bench.machine import machine_description

    results, versions = [], {}
    with tempfile.TemporaryDirectory(prefix="reward-oracle-") as tmp:
        for name in names:
            scratch = Path(tmp) / name
            scratch.mkdir()
            result = oracle(name, scratch, args.cache_dir, args.hps_size)
            result["official_side"] = OFFICIAL_SIDE[name]
            results.append(result)
            print(
                f"{name}: max abs diff {result['max_abs_diff']:.2e} over {len(result['rows'])} cases, "
                f"{result['official_failed']} failed on the official side ({result['seconds']} s)",
                flush=True,
            )
    for name in names:
        if name in VENV_OF:
            venv = VENV_OF[name]
            packages = ["torch", "torchvision"] + [re.split(r"[=<>\[]", p)[0] for p in VENVS[venv]]
            versions[venv] = venv_versions(args.cache_dir / f"venv-oracle-{venv}" / "bin" / "python", packages)
    info = machine_description(torch.device("cpu"))
    machine = f"{info['cpu_count']}-core {info['machine']} CPU ({info['cpu']}), torch {info['torch']}, no GPU"
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "versions": versions, "results": results}, indent=1))
    text = markdown(results, versions, machine)
    if args.markdown:
        args.markdown.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

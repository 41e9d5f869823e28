"""The metric models of the T2I-CompBench suite, each a transformers model read from a local directory
in its Hugging Face layout (nothing is downloaded; a missing file is an error naming it, the option
and where the authors publish the weights).

    --blip      BLIP-VQA (BlipForQuestionAnswering): attribute binding and the complex score's attribute part
    --clip      CLIP ViT-B/32 (CLIPModel): non-spatial and the complex score's action part
    --detector  GroundingDINO (GroundingDinoForObjectDetection): 2D / 3D spatial, numeracy and the complex
                score's spatial part. SUBSTITUTE: the benchmark uses UniDet (a detectron2 model, which
                does not run on this library's dependencies); GroundingDINO is queried with the object
                words of each prompt instead of reading them from UniDet's label space
    --depth     DPT-Hybrid MiDaS (DPTForDepthEstimation): 3D spatial
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from margrpo.rewards.preprocess import CLIP_MEAN, CLIP_STD
from margrpo.rewards.weights import CorruptWeightsError, WeightsSpec, load_hf_model, require_files, resolve

from .geneval_score import Box

HF_FILES = "config.json, model.safetensors or pytorch_model.bin"
BLIP_SPEC = WeightsSpec(
    "t2i-compbench BLIP-VQA",
    "blip-vqa-base",
    f"a Hugging Face BlipForQuestionAnswering directory: {HF_FILES}, tokenizer files (vocab.txt or "
    "tokenizer.json) and preprocessor_config.json",
    "https://huggingface.co/Salesforce/blip-vqa-base (the Hugging Face conversion of BLIP's "
    "model_base_vqa_capfilt_large.pth, which the benchmark's BLIPvqa_eval loads)",
    option="--blip",
)
CLIP_SPEC = WeightsSpec(
    "t2i-compbench CLIP",
    "clip-vit-base-patch32",
    f"a Hugging Face CLIPModel directory: {HF_FILES}, tokenizer files and preprocessor_config.json",
    "https://huggingface.co/openai/clip-vit-base-patch32 (OpenAI's ViT-B/32, which the benchmark's CLIPScore_eval loads)",
    option="--clip",
)
DEPTH_SPEC = WeightsSpec(
    "t2i-compbench depth",
    "dpt-hybrid-midas",
    f"a Hugging Face DPTForDepthEstimation directory: {HF_FILES} and preprocessor_config.json",
    "https://huggingface.co/Intel/dpt-hybrid-midas (the Hugging Face conversion of "
    "dpt_hybrid-midas-501f0c75.pt, the depth model of the benchmark's 3D spatial script)",
    option="--depth",
)
BLIP_IMAGE_SIZE = 480  # the benchmark's vqa.yaml: images resized to 480 x 480, position embeddings interpolated


def clean_question(question: str) -> str:
    """BLIP's question cleaning: lowercased, the characters .!"()*#:;~ removed, at most 50 words."""
    text = re.sub(r"[.!\"()*#:;~]", "", question.lower()).rstrip(" ")
    return " ".join(text.split(" ")[:50])


class BlipVQA:
    """P(yes) / (P(yes) + P(no)) of BLIP's answer decoder's first token, as the benchmark's 'vqa_prob'
    inference: the question encoded against the image with BLIP's [ENC] token first, the decoder
    started from [DEC]."""

    def __init__(self, path: str | Path | None, device: torch.device, dtype: torch.dtype, image_size: int = BLIP_IMAGE_SIZE) -> None:
        directory = resolve(BLIP_SPEC, path, kind="dir")
        require_files(BLIP_SPEC, directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        from transformers import AutoTokenizer, BlipForQuestionAnswering

        self.model = load_hf_model(BLIP_SPEC, BlipForQuestionAnswering, directory).to(device, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        processor = json.loads((directory / "preprocessor_config.json").read_text())
        self.mean = torch.tensor(processor.get("image_mean", CLIP_MEAN), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(processor.get("image_std", CLIP_STD), device=device).view(1, 3, 1, 1)
        text = self.model.config.text_config
        ids = {w: self.tokenizer.encode(w, add_special_tokens=False) for w in ("yes", "no")}
        if any(len(v) != 1 for v in ids.values()):
            raise CorruptWeightsError(
                f"{BLIP_SPEC.reward}: the tokenizer in {directory} does not hold 'yes' and 'no' "
                f"as single tokens (got {ids}); {BLIP_SPEC.describe()}"
            )
        self.yes_id, self.no_id = ids["yes"][0], ids["no"][0]
        vocab = self.tokenizer.get_vocab()
        # BLIP's tokenizer adds [DEC] (the decoder's start) and then [ENC]: [ENC] is bos + 1 when the
        # converted tokenizer does not list it
        self.enc_id = vocab.get("[ENC]", text.bos_token_id + 1)
        if self.enc_id >= text.vocab_size:
            raise CorruptWeightsError(
                f"{BLIP_SPEC.reward}: {directory}: no [ENC] token in the tokenizer and id "
                f"{self.enc_id} is outside the text vocabulary ({text.vocab_size}); "
                f"{BLIP_SPEC.describe()}"
            )
        self.bos_id = text.bos_token_id
        self.interpolate = image_size != self.model.config.vision_config.image_size
        self.image_size, self.device, self.dtype = image_size, device, dtype

    @torch.no_grad()
    def p_yes(self, images: torch.Tensor, questions: list[str], image_index: list[int]) -> torch.Tensor:
        """float32 [Q]: P(yes) of questions[q] about images[image_index[q]] (images [B, 3, H, W] in [0, 1])."""
        if not questions:
            return torch.zeros(0)
        x = F.interpolate(
            images.to(self.device).float(), size=(self.image_size, self.image_size), mode="bicubic", align_corners=False, antialias=True
        ).clamp_(0, 1)
        pixels = ((x - self.mean) / self.std).to(self.dtype)
        image_states = self.model.vision_model(pixel_values=pixels, interpolate_pos_encoding=self.interpolate).last_hidden_state
        image_states = image_states[torch.tensor(image_index, device=self.device)]
        tokens = self.tokenizer(
            [clean_question(q) for q in questions], padding="longest", truncation=True, max_length=35, return_tensors="pt"
        )
        input_ids, mask = tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)
        input_ids[:, 0] = self.enc_id
        image_mask = torch.ones(image_states.shape[:-1], dtype=torch.long, device=self.device)
        states = self.model.text_encoder(
            input_ids=input_ids, attention_mask=mask, encoder_hidden_states=image_states, encoder_attention_mask=image_mask
        )[0]
        start = torch.full((len(questions), 1), self.bos_id, device=self.device)
        logits = self.model.text_decoder(input_ids=start, encoder_hidden_states=states, encoder_attention_mask=mask).logits[:, 0].float()
        # P(yes) / (P(yes) + P(no)) of the softmax = sigmoid of the logit difference
        return torch.sigmoid(logits[:, self.yes_id] - logits[:, self.no_id]).cpu()


class Clip:
    """Cosine similarity of image and text embeddings (the benchmark's CLIPScore_eval, not scaled)."""

    def __init__(self, path: str | Path | None, device: torch.device, dtype: torch.dtype) -> None:
        from margrpo.rewards.hf_clip import HFClip

        directory = resolve(CLIP_SPEC, path, kind="dir")
        require_files(CLIP_SPEC, directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.json")])
        self.clip = HFClip(CLIP_SPEC, directory, None, device, dtype)

    @torch.no_grad()
    def cosine(self, images: torch.Tensor, texts: list[str]) -> torch.Tensor:
        """float32 [B] on the CPU."""
        pixels = images.to(self.clip.device).float()
        return (self.clip.image_embeddings(pixels) * self.clip.text_embeddings(texts)).sum(-1).cpu()


class Detector:
    """GroundingDINO queried with each image's object words (the substitute for UniDet): per word, the
    boxes whose phrase score exceeds box_threshold, duplicates (IoU > nms_iou) suppressed, most
    confident first, in image-normalised corners."""

    def __init__(
        self, path: str | Path | None, device: torch.device, dtype: torch.dtype, box_threshold: float = 0.3, nms_iou: float = 0.5
    ) -> None:
        from margrpo.rewards.grounding_dino import SPEC, GroundingDinoReward

        spec = replace(SPEC, reward="t2i-compbench detector (GroundingDINO, substitute for UniDet)", option="--detector")
        directory = resolve(spec, path, kind="dir")
        require_files(spec, directory, ["config.json", "preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        self.model = GroundingDinoReward(
            path=str(directory), box_threshold=box_threshold, phrase_tokens="all", device=str(device), dtype=dtype
        )
        self.box_threshold, self.nms_iou, self.device = box_threshold, nms_iou, device

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, words: list[list[str]]) -> list[dict[str, list[Box]]]:
        from margrpo.rewards.grounding_dino import box_iou, corners

        found: list[dict[str, list[Box]]] = [{} for _ in words]
        todo = [i for i, w in enumerate(words) if w]
        if not todo:
            return found
        pixels = images[todo].to(self.device).float()
        queries = [list(dict.fromkeys(w.lower() for w in words[i])) for i in todo]
        for i, names, (scores, boxes) in zip(todo, queries, self.model.detect(pixels, queries)):
            xyxy = corners(boxes).clamp(0, 1)
            for k, name in enumerate(names):
                keep = (scores[k] > self.box_threshold).nonzero().flatten()
                keep = keep[scores[k][keep].argsort(descending=True, stable=True)]
                kept: list[int] = []
                for q in keep.tolist():  # greedy suppression, most confident first
                    if not kept or box_iou(xyxy[q][None], xyxy[kept]).max() <= self.nms_iou:
                        kept.append(q)
                found[i][name] = [Box(*xyxy[q].tolist(), score=float(scores[k][q])) for q in kept]
        return found


class Depth:
    """Relative inverse depth (larger = nearer) per pixel, min-max normalised per image as the
    benchmark's 3D script stores it."""

    def __init__(self, path: str | Path | None, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import DPTForDepthEstimation

        directory = resolve(DEPTH_SPEC, path, kind="dir")
        require_files(DEPTH_SPEC, directory, ["preprocessor_config.json"])
        self.model = load_hf_model(DEPTH_SPEC, DPTForDepthEstimation, directory).to(device, dtype)
        processor = json.loads((directory / "preprocessor_config.json").read_text())
        size = processor.get("size", {"height": 384, "width": 384})
        self.size = (size["height"], size["width"]) if isinstance(size, dict) else (int(size), int(size))
        self.mean = torch.tensor(processor.get("image_mean", [0.5] * 3), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(processor.get("image_std", [0.5] * 3), device=device).view(1, 3, 1, 1)
        self.device, self.dtype = device, dtype

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [0, 1] -> float32 [B, H, W] in [0, 1] on the CPU."""
        x = F.interpolate(images.to(self.device).float(), size=self.size, mode="bicubic", align_corners=False, antialias=True).clamp_(0, 1)
        depth = self.model(pixel_values=((x - self.mean) / self.std).to(self.dtype)).predicted_depth.float()
        depth = F.interpolate(depth[:, None], size=images.shape[-2:], mode="bilinear", align_corners=True)[:, 0]
        low = depth.amin(dim=(1, 2), keepdim=True)
        high = depth.amax(dim=(1, 2), keepdim=True)
        return ((depth - low) / (high - low).clamp(min=1e-12)).cpu()


def mean_in_box(depth: torch.Tensor, box: Box) -> float:
    """Mean of depth [H, W] over the box's pixels (corners truncated to integers as the script does;
    rows are y here, where the script indexes the map with x first). NaN for an empty box."""
    h, w = depth.shape
    region = depth[int(box.y1 * h) : int(box.y2 * h), int(box.x1 * w) : int(box.x2 * w)]
    return float(region.mean()) if region.numel() else float("nan")

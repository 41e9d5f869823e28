"""The GenEval suite's scorer: an open-vocabulary detector for presence, counts and positions, and CLIP
for colours, both transformers models loaded from local directories (nothing is downloaded).

Detector: GroundingDINO (transformers GroundingDinoForObjectDetection, e.g. IDEA-Research/
grounding-dino-tiny in the Hugging Face layout), read through the grounding_dino reward's detection
code, each image queried with the classes its prompt names ("cat . dog ."). A query box detects a
class when the class phrase's mean token score exceeds `box_threshold`; duplicates of a class are
removed by non-maximum suppression on box corners (IoU > `nms_iou`).
Colour: the most confident box of each class whose colour is asked is cropped from the image and
classified zero-shot by a CLIP model (transformers CLIPModel, e.g. openai/clip-vit-large-patch14)
among GenEval's colours, with the texts "a photo of a {color} {class}".
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from margrpo.rewards.base import as_dtype, default_device, to_unit_float
from margrpo.rewards.weights import WeightsSpec, require_files, resolve

from .geneval_prompts import COLORS
from .geneval_score import Box, judge

CLIP_SPEC = WeightsSpec(
    "geneval colour classifier",
    "clip-vit-large-patch14",
    "a Hugging Face CLIPModel directory: config.json, model.safetensors, tokenizer files and preprocessor_config.json",
    "https://huggingface.co/openai/clip-vit-large-patch14",
    option="--clip",
)


def corners(box: torch.Tensor) -> torch.Tensor:
    """(cx, cy, w, h) [..., 4] -> (x1, y1, x2, y2)."""
    cx, cy, w, h = box.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def crop(image: torch.Tensor, box: Box, size: int) -> torch.Tensor:
    """The box's pixels of image [3, H, W] (at least one pixel), resized to size x size."""
    h, w = image.shape[-2:]
    x1 = min(max(round(box.x1 * w), 0), w - 1)
    y1 = min(max(round(box.y1 * h), 0), h - 1)
    x2 = max(min(round(box.x2 * w), w), x1 + 1)
    y2 = max(min(round(box.y2 * h), h), y1 + 1)
    region = image[None, :, y1:y2, x1:x2]
    return F.interpolate(region, size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


class GenEvalScorer:
    """Detect and judge GenEval-style images. detector: the GroundingDINO directory (--detector);
    clip: the CLIP directory (--clip); margin: position margin (fraction of the image side)."""

    def __init__(
        self,
        detector: str | Path,
        clip: str | Path,
        box_threshold: float = 0.3,
        nms_iou: float = 0.5,
        margin: float = 0.05,
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
    ) -> None:
        from margrpo.rewards.grounding_dino import SPEC, GroundingDinoReward
        from margrpo.rewards.hf_clip import HFClip

        self.device, self.dtype = torch.device(device or default_device()), as_dtype(dtype)
        detector_spec = replace(SPEC, reward="geneval detector", option="--detector")
        directory = resolve(detector_spec, detector, kind="dir")
        require_files(detector_spec, directory, ["config.json", "preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        # both directories checked before either model loads (the detector takes minutes)
        clip_dir = resolve(CLIP_SPEC, clip, kind="dir")
        require_files(CLIP_SPEC, clip_dir, ["config.json", "preprocessor_config.json", ("tokenizer.json", "vocab.json")])
        # every word of a class name counts ("hot dog": hot and dog), as the class is one query
        self.detector = GroundingDinoReward(
            path=str(directory), box_threshold=box_threshold, phrase_tokens="all", device=str(self.device), dtype=self.dtype
        )
        self.clip = HFClip(CLIP_SPEC, clip_dir, None, self.device, self.dtype)
        self.box_threshold, self.nms_iou, self.margin = box_threshold, nms_iou, margin
        self._color_texts: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def detections(self, images: torch.Tensor, metadata: list[dict]) -> list[dict[str, list[Box]]]:
        """Per image: {class: boxes, most confident first}, the top box of each coloured class with its colour."""
        from margrpo.rewards.grounding_dino import box_iou

        pixels = to_unit_float(images, self.device)
        classes = [list(dict.fromkeys(o["class"] for o in m.get("objects", []))) for m in metadata]
        todo = [i for i, c in enumerate(classes) if c]
        found: list[dict[str, list[Box]]] = [{} for _ in metadata]
        if not todo:
            return found
        for i, (phrase_scores, boxes) in zip(todo, self.detector.detect(pixels[todo], [classes[i] for i in todo])):
            xyxy = corners(boxes).clamp(0, 1)
            for k, name in enumerate(classes[i]):
                keep = (phrase_scores[k] > self.box_threshold).nonzero().flatten()
                keep = keep[phrase_scores[k][keep].argsort(descending=True, stable=True)]
                kept: list[int] = []
                for q in keep.tolist():  # greedy NMS, most confident first
                    if not kept or box_iou(xyxy[q][None], xyxy[kept]).max() <= self.nms_iou:
                        kept.append(q)
                found[i][name] = [Box(*xyxy[q].tolist(), score=float(phrase_scores[k][q])) for q in kept]
        self._read_colors(pixels, metadata, found)
        return found

    def _read_colors(self, pixels: torch.Tensor, metadata: list[dict], found: list[dict[str, list[Box]]]) -> None:
        """Set the colour of each asked-for coloured class's top box (CLIP zero-shot over COLORS)."""
        asks = [(i, o["class"]) for i, m in enumerate(metadata) for o in m.get("objects", []) if "color" in o and found[i].get(o["class"])]
        if not asks:
            return
        size = self.clip.transform.crop[0] if self.clip.transform.crop else self.clip.transform.size
        crops = torch.stack([crop(pixels[i], found[i][name][0], size) for i, name in asks])
        images = self.clip.image_embeddings(crops)  # [A, D]
        for row, (i, name) in enumerate(asks):
            best = int((self._color_embeddings(name) @ images[row]).argmax())
            found[i][name][0] = replace(found[i][name][0], color=COLORS[best])

    def _color_embeddings(self, name: str) -> torch.Tensor:
        if name not in self._color_texts:
            self._color_texts[name] = self.clip.text_embeddings([f"a photo of a {c} {name}" for c in COLORS])
        return self._color_texts[name]

    def __call__(self, images: torch.Tensor, metadata: list[dict]) -> list[tuple[bool, str]]:
        """(correct, why) per image (margrpo.eval_suites.geneval_score.judge)."""
        return [judge(m, f, self.margin) for m, f in zip(metadata, self.detections(images, metadata))]

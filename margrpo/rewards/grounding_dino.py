"""GroundingDINO reward: object presence, counts and spatial relations from open-set detection.

The detector (transformers GroundingDinoForObjectDetection; SwinT-OGC = IDEA-Research/grounding-dino-tiny)
reads the image and a caption "noun1 . noun2 ." built from the image's metadata (compbench.py). A
query detects a phrase when the mean sigmoid score over the phrase's caption tokens exceeds
`box_threshold` (0.3), as GroundingDINO's phrase-span scoring does. Scores per image, by task_type:
  numeracy  per (object, n): 1 if the boxes left after NMS (IoU 0.5) number n, 0.2 if some but
            not n, 0 if none; averaged over the objects.
  spatial   0.2 per object of the relation found, and, when both are, + 0.5 * position score of
            their most confident boxes (max 0.9).
  others    fraction of the nouns detected (1 when there are none).
Position score of "obj1 <locality> obj2" from box centres in image-normalised coordinates (y down):
left/right/above/below need the offset mostly along that axis and score 1, or 0.1 / IoU when the
boxes overlap by IoU >= 0.1; near / next to / on side of score 1 within `near_distance` on either
axis, else near_distance / max offset. Departures from the reference code, which compared
normalised offsets with a 150-pixel threshold (so "near" always scored 1) and scored "above" and
"on top of" as 0: here every locality word of its vocabulary is handled.
"""
from __future__ import annotations

import torch

from .base import Metadata, Reward
from .compbench import CompBenchItem, SpatialInfo
from .preprocess import ImageTransform
from .registry import register
from .weights import WeightsSpec, load_hf_model, require_files, resolve

SPEC = WeightsSpec("grounding_dino", "grounding-dino-tiny",
                   "a Hugging Face GroundingDINO directory: config.json, model.safetensors, tokenizer files "
                   "and preprocessor_config.json", "https://huggingface.co/IDEA-Research/grounding-dino-tiny")
LEFT, RIGHT = ("on the left of", "left of"), ("on the right of", "right of")
BELOW = ("on the bottom of", "below")
ABOVE = ("on the top of", "top of", "on top of", "above")
NEAR = ("next to", "near", "on side of")
LOCALITIES = LEFT + RIGHT + BELOW + ABOVE + NEAR


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of xyxy boxes a [N, 4] and b [M, 4] -> [N, M]."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-12)


def nms_count(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float = 0.5) -> int:
    """How many boxes greedy non-maximum suppression keeps."""
    order = scores.argsort(descending=True)
    boxes = boxes[order]
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    overlaps = box_iou(boxes, boxes) > iou_threshold
    kept = 0
    for i in range(len(boxes)):
        if not suppressed[i]:
            kept += 1
            suppressed |= overlaps[i].cpu()
    return kept


def position_score(locality: str, box1: torch.Tensor, box2: torch.Tensor, iou_threshold: float = 0.1,
                   near_distance: float = 0.3) -> float:
    """How well xyxy box1 stands `locality` of box2 (normalised coordinates, y down), in [0, 1]."""
    if locality not in LOCALITIES:
        raise ValueError(f"spatial_info['locality']: got {locality!r}, expected one of {', '.join(LOCALITIES)}")
    dx = float((box2[0] + box2[2] - box1[0] - box1[2]) / 2)
    dy = float((box2[1] + box2[3] - box1[1] - box1[3]) / 2)
    if locality in NEAR:
        if abs(dx) < near_distance or abs(dy) < near_distance:
            return 1.0
        return near_distance / max(abs(dx), abs(dy))
    # obj1 left of obj2 <=> obj2's centre lies to the right (dx > 0), mostly horizontally, and so on
    along, across = (dx, dy) if locality in LEFT + RIGHT else (dy, dx)
    wanted_sign = 1.0 if locality in LEFT + ABOVE else -1.0
    if along * wanted_sign <= 0 or abs(along) <= abs(across):
        return 0.0
    iou = float(box_iou(box1[None], box2[None])[0, 0])
    return 1.0 if iou < iou_threshold else iou_threshold / iou


def caption_for(phrases: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """'a . b .' and the character span of each phrase in it."""
    spans, pieces, pointer = [], [], 0
    for phrase in phrases:
        spans.append((pointer, pointer + len(phrase)))
        pieces.append(phrase)
        pointer += len(phrase) + 3  # " . "
    return " . ".join(pieces) + " .", spans


def phrases_of(item: CompBenchItem) -> list[str]:
    """Every object name an image's scoring needs, in first-seen order."""
    names = list(item.nouns)
    if item.spatial is not None:
        names += [item.spatial.obj1, item.spatial.obj2]
    names += [name for name, _ in item.counts]
    return list(dict.fromkeys(n.strip().lower() for n in names if n.strip()))


@register("grounding_dino")
class GroundingDinoReward(Reward):
    """T2I-CompBench-style detection score in [0, 1]. path: the GroundingDINO directory."""

    def __init__(self, path: str | None = None, box_threshold: float = 0.3, near_distance: float = 0.3,
                 device: str | None = None, dtype: torch.dtype | str = torch.float32,
                 batch_size: int | None = None) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        directory = resolve(SPEC, path, kind="dir")
        require_files(SPEC, directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        from transformers import AutoTokenizer, GroundingDinoForObjectDetection  # the rewards extra; needed from here on

        self.model = load_hf_model(SPEC, GroundingDinoForObjectDetection, directory).to(self.device, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.transform = ImageTransform.from_hf_config(directory / "preprocessor_config.json")
        self.box_threshold, self.near_distance = box_threshold, near_distance

    def detect(self, images: torch.Tensor, phrases: list[list[str]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image: (phrase scores [P, queries], boxes xyxy [queries, 4]) for its phrases."""
        captions, spans = zip(*(caption_for(p) for p in phrases))
        tokens = self.tokenizer(list(captions), padding=True, truncation=True,
                                max_length=self.model.config.max_text_len, return_offsets_mapping=True,
                                return_tensors="pt")
        offsets = tokens.pop("offset_mapping")
        tokens = {k: v.to(self.device) for k, v in tokens.items()}
        pixels = self.transform(images, self.dtype)
        mask = torch.ones(pixels.shape[0], *pixels.shape[-2:], dtype=torch.long, device=self.device)
        out = self.model(pixel_values=pixels, pixel_mask=mask, **tokens)
        probs = out.logits.float().sigmoid()  # [B, queries, text positions]
        cx, cy, w, h = out.pred_boxes.float().unbind(-1)
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
        results = []
        for b, image_spans in enumerate(spans):
            start, end = offsets[b, :, 0], offsets[b, :, 1]
            real = (end > start)[None, :]
            in_span = torch.stack([(start >= s) & (end <= e) for s, e in image_spans]) & real  # [P, L]
            weights = in_span.float() / in_span.sum(1, keepdim=True).clamp(min=1)
            text_len = min(weights.shape[1], probs.shape[-1])
            results.append((weights[:, :text_len].to(self.device) @ probs[b, :, :text_len].T, boxes[b]))
        return results

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        items = [CompBenchItem.from_metadata(m, i) for i, m in enumerate(metadata)]
        phrases = [phrases_of(item) for item in items]
        scores = torch.ones(len(items))  # nothing to detect: nothing violated
        todo = [i for i, p in enumerate(phrases) if p]
        if todo:
            detections = self.detect(images[todo], [phrases[i] for i in todo])
            for i, (phrase_scores, boxes) in zip(todo, detections):
                found = {name: phrase_scores[k] for k, name in enumerate(phrases[i])}
                scores[i] = self._score_item(items[i], found, boxes)
        return scores.to(self.device)

    def _score_item(self, item: CompBenchItem, found: dict[str, torch.Tensor], boxes: torch.Tensor) -> float:
        hits = {name: s > self.box_threshold for name, s in found.items()}
        if item.task_type == "numeracy" and item.counts:
            total = 0.0
            for name, wanted in item.counts:
                keep = hits[name.strip().lower()]
                if keep.any():
                    n = nms_count(boxes[keep], found[name.strip().lower()][keep])
                    total += 1.0 if n == wanted else 0.2
            return total / len(item.counts)
        if item.task_type == "spatial" and item.spatial is not None:
            return self._spatial(item.spatial, found, hits, boxes)
        nouns = [n.strip().lower() for n in item.nouns if n.strip()]
        if not nouns:
            return 1.0
        return sum(bool(hits[n].any()) for n in nouns) / len(nouns)

    def _spatial(self, info: SpatialInfo, found, hits, boxes: torch.Tensor) -> float:
        names = (info.obj1.strip().lower(), info.obj2.strip().lower())
        present = [bool(hits[n].any()) for n in names]
        score = 0.2 * sum(present)
        if all(present):
            best = [boxes[int(found[n].argmax())] for n in names]  # the most confident box of each
            score += 0.5 * position_score(info.locality, best[0], best[1], near_distance=self.near_distance)
        return score

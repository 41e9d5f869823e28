"""GroundingDINO reward: object presence, counts and spatial relations from open-set detection.

The detector (transformers GroundingDinoForObjectDetection; SwinT-OGC = IDEA-Research/grounding-dino-tiny)
reads the image and a caption "noun1 . noun2 ." built from the image's metadata (compbench.py). A
query detects a phrase when the mean sigmoid score over the phrase's caption tokens exceeds
`box_threshold` (0.3), as GroundingDINO's phrase-span scoring does. Which tokens: with
phrase_tokens='first_last' (default, the MAR-GRPO reference) a phrase of several words is scored on
its first and last word only ("big red car" -> "big", "car"); 'all' uses every word. (The reference
then compares the detected "big car" with the name "big red car", so it never finds a phrase of 3+
words; here the phrase counts as found.) Scores per image, by task_type:
  numeracy  per (object, n): 1 if the boxes left after NMS (IoU 0.5) number n, 0.2 if some but
            not n, 0 if none; averaged over the objects. nms_boxes='cxcywh' (default, the
            reference) runs NMS on the detector's (cx, cy, w, h) boxes read as if they were
            corners, as the reference's call of torchvision's nms does; 'xyxy' converts them to
            corners first, the geometrically meaningful suppression.
  spatial   0.2 per object of the relation found, and, when both are, + 0.5 * position score of
            their most confident boxes (max 0.9).
  others    fraction of the nouns detected (1 when there are none).
Position score of "obj1 <locality> obj2" from box centres in image-normalised coordinates (y down):
left/right/above/below need the offset mostly along that axis and score 1, or 0.1 / IoU when the
boxes overlap by IoU >= 0.1; near / next to / on side of score 1 within `near_distance` on either
axis, else near_distance / max offset. Departures from the reference code, which compared
normalised offsets with a 150-pixel threshold (so "near" always scored 1) and scored "above" and
"on top of" as 0: here every locality word of its vocabulary is handled.
Weights: the Hugging Face layout only. The original release file groundingdino_swint_ogc.pth
(IDEA-Research/GroundingDINO key names) is recognised and refused with the conversion to run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .base import Metadata, Reward
from .compbench import CompBenchItem, SpatialInfo
from .preprocess import ImageTransform
from .registry import register
from .weights import CorruptWeightsError, WeightsSpec, load_hf_model, require_files, resolve

SPEC = WeightsSpec(
    "grounding_dino",
    "grounding-dino-tiny",
    "a Hugging Face GroundingDINO directory: config.json, model.safetensors, tokenizer files and preprocessor_config.json",
    "https://huggingface.co/IDEA-Research/grounding-dino-tiny",
)
ORIGINAL_FILES = ("groundingdino_swint_ogc.pth", "groundingdino_swinb_cogcoor.pth")
CONVERT = (
    "convert it to the Hugging Face layout with transformers' script "
    "src/transformers/models/grounding_dino/convert_grounding_dino_to_hf.py "
    "(--model_name grounding-dino-tiny for SwinT-OGC, grounding-dino-base for SwinB; "
    "--pytorch_dump_folder_path DIR; it fetches the release file itself), or use the converted "
    "SwinT-OGC weights published at https://huggingface.co/IDEA-Research/grounding-dino-tiny, "
    "then set path=DIR"
)
NMS_BOXES = ("cxcywh", "xyxy")
PHRASE_TOKENS = ("first_last", "all")
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
    """How many boxes greedy non-maximum suppression keeps: torchvision.ops.nms's rule (boxes
    read as x1, y1, x2, y2; a box is dropped when its IoU with a kept higher-scoring box exceeds
    the threshold), areas and union not clamped, so boxes that are not corners behave as there."""
    order = scores.argsort(descending=True, stable=True)
    x1, y1, x2, y2 = boxes[order].float().unbind(-1)
    area = (x2 - x1) * (y2 - y1)
    inter_w = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)
    inter_h = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)
    inter = inter_w * inter_h
    overlaps = (inter / (area[:, None] + area[None] - inter) > iou_threshold).cpu()
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    kept = 0
    for i in range(len(order)):
        if not suppressed[i]:
            kept += 1
            suppressed[i + 1 :] |= overlaps[i, i + 1 :]
    return kept


def corners(boxes: torch.Tensor) -> torch.Tensor:
    """(cx, cy, w, h) -> (x1, y1, x2, y2)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def position_score(locality: str, box1: torch.Tensor, box2: torch.Tensor, iou_threshold: float = 0.1, near_distance: float = 0.3) -> float:
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


def caption_for(phrases: list[str], first_last: bool = True) -> tuple[str, list[list[tuple[int, int]]]]:
    """'a . b .' and, per phrase, the character spans its score is read from: the whole phrase, or
    with `first_last` its first and last word when it has several (the reference's token spans)."""
    spans, pointer = [], 0
    for phrase in phrases:
        words = phrase.split(" ")
        end = pointer + len(phrase)
        if first_last and len(words) > 1:
            spans.append([(pointer, pointer + len(words[0])), (end - len(words[-1]), end)])
        else:
            spans.append([(pointer, end)])
        pointer = end + 3  # " . "
    return " . ".join(phrases) + " .", spans


def phrases_of(item: CompBenchItem) -> list[str]:
    """Every object name an image's scoring needs, in first-seen order."""
    names = list(item.nouns)
    if item.spatial is not None:
        names += [item.spatial.obj1, item.spatial.obj2]
    names += [name for name, _ in item.counts]
    return list(dict.fromkeys(n.strip().lower() for n in names if n.strip()))


@register("grounding_dino")
class GroundingDinoReward(Reward):
    """T2I-CompBench-style detection score in [0, 1]. path: the GroundingDINO directory;
    nms_boxes: 'cxcywh' (reference) or 'xyxy'; phrase_tokens: 'first_last' (reference) or 'all'."""

    needs_metadata = True

    def __init__(
        self,
        path: str | None = None,
        box_threshold: float = 0.3,
        near_distance: float = 0.3,
        nms_boxes: str = "cxcywh",
        phrase_tokens: str = "first_last",
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if nms_boxes not in NMS_BOXES:
            raise ValueError(f"nms_boxes: got {nms_boxes!r}, expected one of {', '.join(NMS_BOXES)}")
        if phrase_tokens not in PHRASE_TOKENS:
            raise ValueError(f"phrase_tokens: got {phrase_tokens!r}, expected one of {', '.join(PHRASE_TOKENS)}")
        refuse_original_layout(path)
        directory = resolve(SPEC, path, kind="dir")
        refuse_original_layout(directory)
        require_files(SPEC, directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        from transformers import AutoTokenizer, GroundingDinoForObjectDetection  # the rewards extra; needed from here on

        self.model = load_hf_model(SPEC, GroundingDinoForObjectDetection, directory).to(self.device, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.transform = ImageTransform.from_hf_config(directory / "preprocessor_config.json")
        self.box_threshold, self.near_distance = box_threshold, near_distance
        self.nms_boxes, self.first_last = nms_boxes, phrase_tokens == "first_last"

    def detect(self, images: torch.Tensor, phrases: list[list[str]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image: (phrase scores [P, queries], boxes (cx, cy, w, h) [queries, 4]) for its phrases."""
        captions, spans = zip(*(caption_for(p, self.first_last) for p in phrases))
        tokens = self.tokenizer(
            list(captions),
            padding=True,
            truncation=True,
            max_length=self.model.config.max_text_len,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        offsets = tokens.pop("offset_mapping")
        tokens = {k: v.to(self.device) for k, v in tokens.items()}
        pixels = self.transform(images, self.dtype)
        mask = torch.ones(pixels.shape[0], *pixels.shape[-2:], dtype=torch.long, device=self.device)
        out = self.model(pixel_values=pixels, pixel_mask=mask, **tokens)
        probs = out.logits.float().sigmoid()  # [B, queries, text positions]
        boxes = out.pred_boxes.float()
        results = []
        for b, image_spans in enumerate(spans):
            start, end = offsets[b, :, 0], offsets[b, :, 1]
            real = (end > start)[None, :]
            in_span = (
                torch.stack([torch.stack([(start >= s) & (end <= e) for s, e in phrase_spans]).any(0) for phrase_spans in image_spans])
                & real
            )  # [P, L]
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
        """One image's score from its phrase scores [queries] and boxes (cx, cy, w, h) [queries, 4]."""
        hits = {name: s > self.box_threshold for name, s in found.items()}
        if item.task_type == "numeracy" and item.counts:
            total = 0.0
            for name, wanted in item.counts:
                keep = hits[name.strip().lower()]
                if keep.any():
                    kept_boxes = boxes[keep] if self.nms_boxes == "cxcywh" else corners(boxes[keep])
                    n = nms_count(kept_boxes, found[name.strip().lower()][keep])
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
            best = [corners(boxes[int(found[n].argmax())]) for n in names]  # the most confident box of each
            score += 0.5 * position_score(info.locality, best[0], best[1], near_distance=self.near_distance)
        return score


def refuse_original_layout(path) -> None:
    """Raise CorruptWeightsError naming the conversion when `path` is a .pth file, or a directory
    without config.json holding a release file name: the original GroundingDINO layout
    (IDEA-Research key names such as backbone.0.patch_embed.*), which this reward does not read."""
    if path is None:
        return
    path = Path(path).expanduser()
    if path.is_file():
        found = path if path.suffix == ".pth" else None
    else:
        found = next((path / n for n in ORIGINAL_FILES if (path / n).is_file()), None)
        found = None if (path / "config.json").is_file() else found
    if found is not None:
        raise CorruptWeightsError(
            f"grounding_dino: option path={path} points at {found.name}, the original GroundingDINO release layout "
            f"(IDEA-Research key names, no config.json); this reward loads the Hugging Face layout "
            f"({SPEC.layout}): {CONVERT}"
        )

"""A transformers CLIPModel loaded from a local Hugging Face directory, with batched embeddings.

Used by PickScore, CLIPScore and the aesthetic predictor. The directory holds config.json,
model.safetensors (or pytorch_model.bin), the tokenizer files and preprocessor_config.json.
Needs transformers (imported when a reward is built).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .preprocess import ImageTransform
from .weights import CorruptWeightsError, WeightsSpec, load_hf_model, require_files


def _pooled(output) -> torch.Tensor:
    # transformers 4.x returns the projected features; 5.x a model output whose pooler_output holds them
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class HFClip:
    """CLIPModel + tokenizer + image transform from `directory` (processor files may live in
    `processor_directory`, e.g. PickScore's model with the laion ViT-H-14 processor)."""

    def __init__(
        self, spec: WeightsSpec, directory: Path, processor_directory: Path | None, device: torch.device, dtype: torch.dtype
    ) -> None:
        from transformers import AutoTokenizer, CLIPModel

        # the processor files' option: processor_path when given, else path (where they may be missing)
        processor_spec = replace(
            spec,
            option="processor_path"
            if processor_directory
            else f"{spec.option} (or processor_path, a directory with the tokenizer files and preprocessor_config.json)",
        )
        processor_directory = processor_directory or directory
        require_files(processor_spec, processor_directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.json")])
        self.model = load_hf_model(spec, CLIPModel, directory).to(device, dtype)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(processor_directory), local_files_only=True)
        except Exception as err:
            raise CorruptWeightsError(
                f"{spec.reward}: cannot load the tokenizer from {processor_directory}: {err} ({spec.describe()})"
            ) from err
        self.transform = ImageTransform.from_hf_config(processor_directory / "preprocessor_config.json")
        self.max_length = self.model.config.text_config.max_position_embeddings
        self.device, self.dtype = device, dtype

    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """float [B, 3, H, W] in [0, 1] -> L2-normalised float32 [B, D]."""
        pixels = self.transform(images, self.dtype)
        return F.normalize(_pooled(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)

    def text_embeddings(self, prompts: list[str], cut_after_tokenizing: bool = False) -> torch.Tensor:
        """prompts -> L2-normalised float32 [B, D], truncated to the text model's context: by the
        tokenizer (which keeps the end token), or with cut_after_tokenizing by slicing the token ids
        as torchmetrics does (a prompt longer than the context then loses its end token)."""
        if cut_after_tokenizing:
            tokens = self.tokenizer(prompts, padding=True, return_tensors="pt")
            tokens = {k: v[:, : self.max_length] for k, v in tokens.items()}
        else:
            tokens = self.tokenizer(prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        input_ids, mask = tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)
        output = self.model.get_text_features(input_ids=input_ids, attention_mask=mask)
        return F.normalize(_pooled(output).float(), dim=-1)

"""Tiny random-init metric models of the T2I-CompBench suite, written in the Hugging Face layouts the
suite loads (tests): BLIP-VQA and DPT here; CLIP and GroundingDINO from margrpo.rewards.synthetic.
The architectures are the real ones at a few layers and 32-pixel images; the scores mean nothing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from margrpo.rewards.synthetic import BERT_WORDS, write_clip_processor, write_grounding_dino, write_hf_clip

BLIP_WORDS = BERT_WORDS + ["green", "blue", "bench", "bowl", "[DEC]", "[ENC]"]  # BLIP's tokenizer ends with these


def write_blip_vqa(directory: Path, seed: int = 21) -> Path:
    """A BlipForQuestionAnswering directory: config.json, model.safetensors, vocab.txt (BERT words plus
    [DEC] and [ENC]) and preprocessor_config.json."""
    from transformers import BlipConfig, BlipForQuestionAnswering

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(BLIP_WORDS) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    write_clip_processor(directory, 32)
    config = BlipConfig(
        text_config=dict(
            vocab_size=len(BLIP_WORDS),
            hidden_size=32,
            encoder_hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=40,
            bos_token_id=BLIP_WORDS.index("[DEC]"),
            pad_token_id=0,
            sep_token_id=BLIP_WORDS.index("[SEP]"),
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8),
    )
    torch.manual_seed(seed)
    model = BlipForQuestionAnswering(config)
    with torch.no_grad():  # BLIP's vision init is near zero (initializer_range 1e-10): widen it so images matter
        for name, p in model.vision_model.named_parameters():
            if p.dim() > 1 or "embedding" in name:
                p.normal_(std=0.2)
    model.save_pretrained(directory)
    return directory


def write_dpt(directory: Path, seed: int = 22) -> Path:
    """A DPTForDepthEstimation directory (non-hybrid ViT backbone at tiny size) with a DPT image processor."""
    from transformers import DPTConfig, DPTForDepthEstimation

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "DPTImageProcessor",
                "do_resize": True,
                "size": {"height": 32, "width": 32},
                "resample": 3,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )
    config = DPTConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 32, 32],
        fusion_hidden_size=16,
        head_in_index=-1,
    )
    torch.manual_seed(seed)
    DPTForDepthEstimation(config).save_pretrained(directory)
    return directory


def write_compbench_models(root: str | Path) -> dict[str, str]:
    """Every metric model of the suite under root; returns the suite's options (blip, clip, detector, depth)."""
    root = Path(root)
    detector = Path(write_grounding_dino(root)["path"])
    # 128-pixel inputs: at the tiny preset's 64 the last feature level is 1 x 1, which GroupNorm refuses
    # for a batch of one image
    processor = json.loads((detector / "preprocessor_config.json").read_text())
    processor["size"] = {"shortest_edge": 128, "longest_edge": 200}
    (detector / "preprocessor_config.json").write_text(json.dumps(processor))
    return {
        "blip": str(write_blip_vqa(root / "blip-vqa-base")),
        "clip": str(write_hf_clip(root / "clip-vit-base-patch32", "tiny", seed=23)),
        "detector": str(detector),
        "depth": str(write_dpt(root / "dpt-hybrid-midas")),
    }

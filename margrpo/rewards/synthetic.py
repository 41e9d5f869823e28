"""Random-init reward checkpoints written in the official layouts and key names (tests, benchmarks).

`write(name, root, size)` creates what the reward `name` loads (same files, same key names, same
configuration formats as the published weights) under `root` and returns the reward's path
options. size 'tiny' builds a few-layer model of the same architecture (CPU tests); 'full' builds
the published sizes (GPU speed benchmarks; the scores are meaningless, the cost is real). `device`
is where the random init runs (a GPU draws a 1 B-parameter model in well under a second, a CPU takes
half a minute); `dtype` stores the hps and CLIP weights in that dtype (bf16 halves the file a bf16
benchmark writes and reads back).
Tokenizer vocabularies are always small; the models' embedding tables keep the real sizes at 'full'.
Random inits are widened where a library zero-initialises tensors, so every layer affects the score.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .preprocess import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD

SIZES = ("tiny", "full")
BERT_WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "yes",
    "no",
    "a",
    "red",
    "cat",
    "dog",
    "dogs",
    "two",
    "left",
    "of",
    "?",
    ".",
    "is",
    "there",
]
# open_clip model configs (the built-in ViT-H-14 is 'full')
OPEN_CLIP_TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size: got {size!r}, expected one of {', '.join(SIZES)}")


def _bytes_to_unicode() -> list[str]:
    """The byte-level alphabet that opens every CLIP vocab.json."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_clip_tokenizer(directory: Path) -> dict[str, int]:
    """A small CLIP BPE tokenizer (vocab.json + merges.txt) that spells any text byte by byte."""
    chars = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(chars + [c + "</w>" for c in chars])}
    for tok in ["ca", "cat</w>", "do", "dog</w>", "re", "red</w>", "<|startoftext|>", "<|endoftext|>"]:
        vocab.setdefault(tok, len(vocab))
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\nc a\nca t</w>\nd o\ndo g</w>\nr e\nre d</w>\n")
    return vocab


def write_clip_processor(directory: Path, size: int) -> None:
    """preprocessor_config.json of a CLIPImageProcessor (bicubic shortest-edge resize, crop, CLIP stats)."""
    (directory / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "do_resize": True,
                "size": {"shortest_edge": size},
                "resample": 3,
                "do_center_crop": True,
                "crop_size": {"height": size, "width": size},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": list(CLIP_MEAN),
                "image_std": list(CLIP_STD),
                "do_convert_rgb": True,
            }
        )
    )


def write_bert_vocab(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(BERT_WORDS) + "\n")


def write_hf_clip(directory: Path, size: str, seed: int, large: bool = False, dtype: torch.dtype | None = None) -> Path:
    """A CLIPModel directory: tiny, ViT-L/14 (large=False) or ViT-H/14 (large=True) at 'full'."""
    from transformers import CLIPConfig, CLIPModel

    directory.mkdir(parents=True, exist_ok=True)
    vocab = write_clip_tokenizer(directory)
    eos, bos = vocab["<|endoftext|>"], vocab["<|startoftext|>"]
    special = dict(eos_token_id=eos, bos_token_id=bos, pad_token_id=eos)
    text: dict[str, Any]  # config values of every type (ints, strings, lists)
    vision: dict[str, Any]
    if size == "tiny":
        text = dict(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            **special,
        )
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8)
        projection, image_size = 16, 32
    elif large:  # ViT-H-14 (PickScore)
        text = dict(
            vocab_size=49408,
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            max_position_embeddings=77,
            hidden_act="gelu",
            **special,
        )
        vision = dict(
            hidden_size=1280,
            intermediate_size=5120,
            num_hidden_layers=32,
            num_attention_heads=16,
            image_size=224,
            patch_size=14,
            hidden_act="gelu",
        )
        projection, image_size = 1024, 224
    else:  # ViT-L/14 (openai/clip-vit-large-patch14)
        text = dict(
            vocab_size=49408,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            max_position_embeddings=77,
            **special,
        )
        vision = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, image_size=224, patch_size=14)
        projection, image_size = 768, 224
    write_clip_processor(directory, image_size)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection))
    model.to(device="cpu", dtype=dtype).save_pretrained(directory)
    return directory


def write_hps(root: Path, size: str = "tiny", dtype: torch.dtype | None = None) -> dict:
    """hps/HPS_v2.1_compressed.pt: an open_clip state dict under 'state_dict' (as hpsv2 loads it)."""
    import open_clip

    _check_size(size)
    (root / "hps").mkdir(parents=True, exist_ok=True)
    options = {"path": str(root / "hps" / "HPS_v2.1_compressed.pt")}
    torch.manual_seed(1)
    if size == "tiny":
        arch = root / "hps" / "tiny-ViT-H-14.json"
        arch.write_text(json.dumps(OPEN_CLIP_TINY))
        options["architecture"] = str(arch)
        model = open_clip.create_model("ViT-H-14", pretrained=None, **OPEN_CLIP_TINY)
    else:
        model = open_clip.create_model("ViT-H-14", pretrained=None)
    state = {
        k: v.to(device="cpu", dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype)
        for k, v in model.state_dict().items()
    }
    torch.save({"state_dict": state}, options["path"])
    return options


def write_image_reward(root: Path, size: str = "tiny") -> dict:
    """image_reward/: ImageReward.pt (release key names), med_config.json, bert-base-uncased/vocab.txt."""
    from .image_reward import ImageRewardNet

    _check_size(size)
    directory = root / "image_reward"
    write_bert_vocab(directory / "bert-base-uncased")
    med: dict[str, Any]  # updated below with lists, floats and strings
    if size == "tiny":
        med = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 40,
            "vocab_size": len(BERT_WORDS) + 2,
        }
        vit = {"embed_dim": 64, "depth": 2, "patch_size": 8, "img_size": 32, "num_heads": 1}
    else:  # BLIP ViT-L/16 at 224 and BERT-base with cross-attention (the release's med_config.json)
        med = {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 512,
            "vocab_size": 30524,
        }
        vit = {"embed_dim": 1024, "depth": 24, "patch_size": 16, "img_size": 224, "num_heads": 16}
    med.update(
        {
            "architectures": ["BertModel"],
            "layer_norm_eps": 1e-12,
            "hidden_act": "gelu",
            "model_type": "bert",
            "add_cross_attention": True,
            "encoder_width": vit["embed_dim"],
        }
    )
    (directory / "med_config.json").write_text(json.dumps(med))
    torch.manual_seed(2)
    net = ImageRewardNet(vit, med)
    with torch.no_grad():
        # timm zero-initialises tokens and biases: make every tensor matter. LayerNorm scales stay near 1
        # and the score head keeps unit gain, so the score spreads with the image and the prompt
        std = 0.2 if size == "tiny" else 0.02
        norms = {f"{name}.weight" for name, m in net.named_modules() if isinstance(m, torch.nn.LayerNorm)}
        for name, p in net.named_parameters():
            if name in norms:
                p.normal_(mean=1.0, std=0.1)
            elif name.startswith("mlp.") and p.dim() == 2:
                p.normal_(std=p.shape[1] ** -0.5)
            else:
                p.normal_(std=std)
    state = net.state_dict()
    positions = med["max_position_embeddings"]
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(positions).expand(1, -1)  # med.py keeps it
    torch.save({k: v.cpu() for k, v in state.items()}, directory / "ImageReward.pt")
    return {"path": str(directory)}


def write_aesthetic(root: Path, size: str = "tiny", dtype: torch.dtype | None = None) -> dict:
    """aesthetic/: the head sac+logos+ava1-l14-linearMSE.pth and a CLIP ViT-L/14 directory."""
    from .mlp_head import ScoreMLP

    _check_size(size)
    clip = write_hf_clip(root / "aesthetic" / "clip-vit-large-patch14", size, seed=3, dtype=dtype)
    torch.manual_seed(4)
    head = ScoreMLP(16 if size == "tiny" else 768)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(std=0.3)
    torch.save({k: v.cpu() for k, v in head.state_dict().items()}, root / "aesthetic" / "sac+logos+ava1-l14-linearMSE.pth")
    return {"path": str(root / "aesthetic" / "sac+logos+ava1-l14-linearMSE.pth"), "clip_path": str(clip)}


def write_pickscore(root: Path, size: str = "tiny", dtype: torch.dtype | None = None) -> dict:
    _check_size(size)
    return {"path": str(write_hf_clip(root / "pickscore", size, seed=5, large=True, dtype=dtype))}


def write_clipscore(root: Path, size: str = "tiny", dtype: torch.dtype | None = None) -> dict:
    _check_size(size)
    return {"path": str(write_hf_clip(root / "clip-vit-large-patch14", size, seed=6, dtype=dtype))}


def write_git(root: Path, size: str = "tiny") -> dict:
    """git-large-vqav2/: a GitForCausalLM directory with a BERT vocab and a CLIP image processor."""
    from transformers import GitConfig, GitForCausalLM

    _check_size(size)
    directory = root / "git-large-vqav2"
    write_bert_vocab(directory)
    special = dict(bos_token_id=2, eos_token_id=3, pad_token_id=0)
    if size == "tiny":
        config = GitConfig(
            vision_config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
            ),
            vocab_size=len(BERT_WORDS),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            **special,
        )
        image_size = 32
    else:  # GIT-large: CLIP ViT-L/14 image encoder, 6-layer BERT-base-width decoder
        config = GitConfig(
            vision_config=dict(
                hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, image_size=420, patch_size=14
            ),
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=1024,
            **special,
        )
        image_size = 420
    write_clip_processor(directory, image_size)
    torch.manual_seed(7)
    model = GitForCausalLM(config)
    if size == "tiny":
        with torch.no_grad():  # larger logits so P(yes) differs visibly between questions
            model.output.weight.mul_(20)
    model.to("cpu").save_pretrained(directory)
    return {"path": str(directory)}


def write_grounding_dino(root: Path, size: str = "tiny") -> dict:
    """grounding-dino-tiny/: a GroundingDinoForObjectDetection directory (SwinT-OGC sizes at 'full')."""
    from transformers import BertConfig, GroundingDinoConfig, GroundingDinoForObjectDetection, SwinConfig

    _check_size(size)
    directory = root / "grounding-dino-tiny"
    write_bert_vocab(directory)
    shortest, longest = (64, 100) if size == "tiny" else (800, 1333)
    (directory / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "GroundingDinoImageProcessor",
                "do_resize": True,
                "resample": 2,
                "size": {"shortest_edge": shortest, "longest_edge": longest},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": list(IMAGENET_MEAN),
                "image_std": list(IMAGENET_STD),
                "do_pad": True,
            }
        )
    )
    if size == "tiny":
        config = GroundingDinoConfig(
            backbone_config=SwinConfig(
                embed_dim=16,
                depths=[1, 1, 1, 1],
                num_heads=[1, 1, 2, 2],
                window_size=4,
                image_size=64,
                out_features=["stage2", "stage3", "stage4"],
            ),
            text_config=BertConfig(
                vocab_size=len(BERT_WORDS),
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            d_model=32,
            encoder_layers=1,
            decoder_layers=2,
            num_queries=12,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            max_text_len=32,
            use_pretrained_backbone=False,
            use_timm_backbone=False,
        )
    else:  # the library defaults are grounding-dino-tiny: Swin-T, BERT-base, 6+6 layers, 900 queries
        config = GroundingDinoConfig(use_pretrained_backbone=False, use_timm_backbone=False)
    torch.manual_seed(8)
    GroundingDinoForObjectDetection(config).to("cpu").save_pretrained(directory)
    return {"path": str(directory)}


WRITERS: dict[str, Callable[..., dict]] = {
    "hps": write_hps,
    "image_reward": write_image_reward,
    "pickscore": write_pickscore,
    "clipscore": write_clipscore,
    "aesthetic": write_aesthetic,
    "git_vqa": write_git,
    "grounding_dino": write_grounding_dino,
}


DTYPED = ("hps", "pickscore", "clipscore", "aesthetic")  # writers that store the weights in a given dtype


def write(
    name: str, root: str | Path, size: str = "tiny", device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None
) -> dict:
    """Write random-init weights for reward `name` under `root`; returns its path options. The model
    is drawn on `device` (the files hold CPU tensors either way); dtype (hps and the CLIP rewards):
    the stored weights' dtype (None: float32)."""
    if name not in WRITERS:
        raise KeyError(f"name: got {name!r}, expected one of {', '.join(WRITERS)}")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with torch.device(device):
        if name in DTYPED:
            return WRITERS[name](Path(root), size, dtype=dtype)
        return WRITERS[name](Path(root), size)

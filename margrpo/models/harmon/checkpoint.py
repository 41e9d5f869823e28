"""Loading Harmon from its official checkpoint files (parameter names unchanged), and writing them.

Two layouts of a local directory are recognised:

1. Hugging Face release (wusize/Harmon-1_5B, wusize/Harmon-0_5B; what the reference GRPO code loads):
       config.json                     {"llm": Qwen2 config, "mar": MAR arguments + "type", ...}
       model.safetensors               or model-XXXXX-of-YYYYY.safetensors + model.safetensors.index.json,
                                       or pytorch_model.bin; keys vae.*, llm.*, mar.*, proj_in.*, proj_out.*
       tokenizer.json / vocab.json + merges.txt, tokenizer_config.json   (the Qwen2.5 tokenizer)
   Get it with: huggingface-cli download wusize/Harmon-1_5B --local-dir DIR

2. GitHub release (wusize/harmon on the Hub, used by github.com/wusize/Harmon):
       harmon_1.5b.pth (or harmon_0.5b.pth, harmon_1.5b-o.pth)   torch state dict: llm.*, mar.*, proj_*
       kl16.ckpt                        {"model": KL-16 VAE state dict}
       Qwen2.5-1.5B-Instruct/           the LLM's config.json + tokenizer (and its weights, used only
                                        when the .pth has no llm.* entries)
   Get them with: huggingface-cli download wusize/harmon --local-dir DIR and
   huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir DIR/Qwen2.5-1.5B-Instruct

Every key and shape is checked; missing pieces raise errors that name the file and where to get it.
Weights are read with safetensors or torch.load(weights_only=True); nothing is downloaded.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from .config import HarmonConfig
from .model import Harmon
from .presets import preset

GITHUB_FILES = {"harmon_1.5b.pth": "harmon-1.5b", "harmon_1.5b-o.pth": "harmon-1.5b", "harmon_0.5b.pth": "harmon-0.5b"}
QWEN_DIRS = {"harmon-1.5b": "Qwen2.5-1.5B-Instruct", "harmon-0.5b": "Qwen2.5-0.5B-Instruct"}
VAE_FILE = "kl16.ckpt"
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
HF_GET = "huggingface-cli download wusize/Harmon-1_5B --local-dir {dir}  (or wusize/Harmon-0_5B)"
INIT_MODEL = "; to try the pipeline without weights, `margrpo init-model harmon-tiny DIR` writes a random-init one"


class MissingCheckpointError(FileNotFoundError):
    """A part of the Harmon checkpoint is not in the directory; the message says where to get it."""


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    image_size: int | None = None,
    preset_name: str | None = None,
    **options,
) -> Harmon:
    """Harmon from a local directory in one of the official layouts (module docstring), in eval mode.

    dtype: cast after loading (None keeps the checkpoint's floats as float32). image_size: the
    generation resolution (default 512, or the config's). preset_name: the architecture of a GitHub
    layout whose .pth file name is not one of GITHUB_FILES. options: Harmon's keyword arguments
    (trainable, reference_behaviour, gradient_checkpointing, lora_rank)."""
    root = Path(path)
    if not root.is_dir():
        raise MissingCheckpointError(
            f"Harmon checkpoint: {root} is not a directory. Get the model with {HF_GET.format(dir=root)}{INIT_MODEL}"
        )
    if (root / "config.json").is_file():
        config, state, tokenizer_dir = _read_hf_layout(root, image_size)
    else:
        config, state, tokenizer_dir = _read_github_layout(root, image_size, preset_name)
    tokenizer = _load_tokenizer(tokenizer_dir)
    with torch.device(device):
        model = Harmon(config, tokenizer, **options)
    load_state_dict(model, state)
    if dtype is not None:
        model.to(dtype)
    if model.trainable == "mar+lora":
        model.enable_lora()
    return model.eval()


def load_state_dict(model: Harmon, state: dict[str, torch.Tensor]) -> None:
    """Load official weights, after checking every key and shape (a tied lm_head may be absent)."""
    expected = model.state_dict()
    optional = {"llm.lm_head.weight"} if model.llm.config.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = []
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", wrong)):
        if items:
            more = f" ... ({len(items)} in all)" if len(items) > 8 else ""
            problems.append(f"{label}: {items[:8]}{more}")
    if problems:
        raise ValueError("Harmon checkpoint does not fit the architecture its config describes: " + "; ".join(problems))
    model.load_state_dict(state, strict=False)


# ---------------------------------------------------------------------- layouts
def _read_hf_layout(root: Path, image_size: int | None):
    values = json.loads((root / "config.json").read_text())
    if "llm" not in values or "mar" not in values:
        raise ValueError(
            f"{root / 'config.json'}: not a Harmon config (expected 'llm' and 'mar' sections, got keys "
            f"{sorted(values)[:10]}); get the model with {HF_GET.format(dir=root)}"
        )
    config = HarmonConfig.from_official(values, image_size)
    return config, _read_weights(root), root


def _read_github_layout(root: Path, image_size: int | None, preset_name: str | None):
    found = sorted(p.name for p in root.glob("harmon*.pth"))
    if not found:
        raise MissingCheckpointError(
            f"Harmon checkpoint: {root} has neither config.json (the Hugging Face layout; get it with "
            f"{HF_GET.format(dir=root)}) nor harmon_1.5b.pth (the GitHub layout; get it with "
            f"huggingface-cli download wusize/harmon --local-dir {root}){INIT_MODEL}"
        )
    weights_file = root / found[0]
    name = preset_name or GITHUB_FILES.get(weights_file.name)
    if name is None:
        raise ValueError(
            f"{weights_file}: unknown file name, expected one of {sorted(GITHUB_FILES)}, or pass "
            "preset_name= to say which architecture it holds"
        )
    config = preset(name)
    if image_size is not None:
        config = HarmonConfig(config.llm, config.mar, config.vae, config.vae_scale, image_size)
    qwen_dir = _llm_dir(root, QWEN_DIRS.get(name, QWEN_DIRS["harmon-1.5b"]))
    missing = []
    if not (root / VAE_FILE).is_file():
        missing.append(f"{root / VAE_FILE} (the KL-16 VAE: huggingface-cli download wusize/harmon {VAE_FILE} --local-dir {root})")
    if not (qwen_dir / "config.json").is_file():
        missing.append(
            f"{qwen_dir}/config.json and tokenizer (the LLM: huggingface-cli download Qwen/{qwen_dir.name} --local-dir {qwen_dir})"
        )
    if missing:
        raise MissingCheckpointError(f"Harmon checkpoint ({weights_file.name}): missing " + "; ".join(missing))
    llm_values = json.loads((qwen_dir / "config.json").read_text())
    config = HarmonConfig({**config.llm, **llm_values}, config.mar, config.vae, config.vae_scale, config.image_size)
    state = dict(_torch_load(weights_file))
    vae = _torch_load(root / VAE_FILE)
    vae = vae.get("model", vae)
    state.update({f"vae.{k}": v for k, v in vae.items() if not k.startswith("loss.")})
    if not any(k.startswith("llm.") for k in state):
        state.update({f"llm.{k}": v for k, v in _read_weights(qwen_dir).items()})
    return config, state, qwen_dir


# ---------------------------------------------------------------------- files
def _llm_dir(root: Path, expected: str) -> Path:
    """The LLM directory of a GitHub layout: `expected` (e.g. Qwen2.5-1.5B-Instruct), else the one
    Qwen2.5-* directory with a config.json (the expected path when there is none, for the error)."""
    if (root / expected / "config.json").is_file():
        return root / expected
    found = sorted(p.parent for p in root.glob("Qwen2.5-*/config.json"))
    return found[0] if len(found) == 1 else root / expected


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path}: holds Python objects besides tensors, which torch.load(weights_only=True) refuses. If you "
            f"trust the file, re-save its tensors once: torch.save(torch.load(path, weights_only=False), path)"
        ) from err


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    """The state dict of a Hugging Face model directory (single or sharded safetensors, or a .bin)."""
    from safetensors.torch import load_file

    index = root / "model.safetensors.index.json"
    if (root / "model.safetensors").is_file():
        return load_file(str(root / "model.safetensors"))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        absent = [s for s in shards if not (root / s).is_file()]
        if absent:
            raise MissingCheckpointError(
                f"{index} lists shard(s) not in the directory: {absent}; download the whole model ({HF_GET.format(dir=root)})"
            )
        state = {}
        for shard in shards:
            state.update(load_file(str(root / shard)))
        return state
    if (root / "pytorch_model.bin").is_file():
        return _torch_load(root / "pytorch_model.bin")
    raise MissingCheckpointError(
        f"{root}: no weights (model.safetensors, model.safetensors.index.json or "
        f"pytorch_model.bin); get them with {HF_GET.format(dir=root)}"
    )


def _load_tokenizer(root: Path):
    from transformers import AutoTokenizer

    if not any(all((root / f).is_file() for f in files) for files in TOKENIZER_FILES):
        raise MissingCheckpointError(
            f"{root}: no tokenizer (tokenizer.json, or vocab.json + merges.txt); it comes with the model: {HF_GET.format(dir=root)}"
        )
    return AutoTokenizer.from_pretrained(str(root), local_files_only=True)


# ---------------------------------------------------------------------- writing
def save_pretrained(model: Harmon, path: str | Path, layout: str = "hf") -> Path:
    """Write `model` in an official layout ("hf": config.json + model.safetensors + tokenizer;
    "github": harmon_1.5b.pth + kl16.ckpt + Qwen2.5-1.5B-Instruct/). Used for tests and benchmarks
    (e.g. random-init models at tiny sizes saved exactly as the released files are laid out)."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.llm.config.tie_word_embeddings:
        state.pop("llm.lm_head.weight", None)  # tied to the input embeddings, as the released files store it
    if layout == "hf":
        (root / "config.json").write_text(json.dumps(model.config.to_official(), indent=2) + "\n")
        save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
        model.tokenizer.save_pretrained(str(root))
    elif layout == "github":
        qwen_dir = root / QWEN_DIRS["harmon-1.5b"]
        qwen_dir.mkdir(exist_ok=True)
        (qwen_dir / "config.json").write_text(json.dumps(model.config.llm, indent=2) + "\n")
        model.tokenizer.save_pretrained(str(qwen_dir))
        torch.save({"model": {k[4:]: v for k, v in state.items() if k.startswith("vae.")}}, root / VAE_FILE)
        torch.save({k: v for k, v in state.items() if not k.startswith("vae.")}, root / "harmon_1.5b.pth")
    else:
        raise ValueError(f"layout: got {layout!r}, expected 'hf' or 'github'")
    return root

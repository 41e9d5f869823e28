"""The official NOVA checkpoint directory (diffusers pipeline layout), checked before anything loads:

    model_index.json
    transformer/config.json + diffusion_pytorch_model.safetensors   (NOVATransformer3DModel)
    vae/config.json + diffusion_pytorch_model.safetensors           (AutoencoderKL)
    text_encoder/config.json + model.safetensors                    (Phi-2)
    tokenizer/tokenizer_config.json + tokenizer.json or vocab.json
    scheduler/scheduler_config.json

Weights may also be sharded (<name>.safetensors.index.json) or a .bin pickle (loaded with
weights_only=True). A missing piece raises FileNotFoundError listing everything that is missing and
where the checkpoint comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO_ID = "BAAI/nova-d48w1024-sd512"
SOURCE = (
    f"the official checkpoint is the Hugging Face repo {REPO_ID} (e.g. `huggingface-cli download {REPO_ID} "
    "--local-dir DIR`); `margrpo init-model nova-tiny DIR` writes a random-init one to try the pipeline"
)
MODEL_INDEX = "model_index.json"
TRANSFORMER_WEIGHTS, VAE_WEIGHTS, TEXT_WEIGHTS = "diffusion_pytorch_model", "diffusion_pytorch_model", "model"


def weight_files(directory: Path, stem: str) -> list[Path]:
    """The files holding `stem`'s weights: one .safetensors, the shards of an index, or one .bin."""
    single, index, pickle = directory / f"{stem}.safetensors", directory / f"{stem}.safetensors.index.json", directory / f"{stem}.bin"
    if single.is_file():
        return [single]
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / shard for shard in shards]
    return [pickle] if pickle.is_file() else []


def read_weights(directory: Path, stem: str) -> dict[str, torch.Tensor]:
    """Every tensor of `stem`'s weight files in `directory`, on CPU."""
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(directory, stem):
        if not file.is_file():
            raise FileNotFoundError(f"{file}: a shard listed in {directory / (stem + '.safetensors.index.json')} is missing; {SOURCE}")
        state.update(load_file(str(file)) if file.suffix == ".safetensors" else torch.load(file, map_location="cpu", weights_only=True))
    return state


def check_layout(path: Path) -> None:
    """Raise FileNotFoundError naming every missing part of the official layout under `path`."""
    if not path.is_dir():
        raise FileNotFoundError(f"NOVA checkpoint: {path} is not a directory; {SOURCE}")
    missing = [
        name
        for name in (
            MODEL_INDEX,
            "transformer/config.json",
            "vae/config.json",
            "text_encoder/config.json",
            "tokenizer/tokenizer_config.json",
            "scheduler/scheduler_config.json",
        )
        if not (path / name).is_file()
    ]
    for component, stem in (("transformer", TRANSFORMER_WEIGHTS), ("vae", VAE_WEIGHTS), ("text_encoder", TEXT_WEIGHTS)):
        if not weight_files(path / component, stem):
            missing.append(f"{component}/{stem}.safetensors (or a sharded .safetensors.index.json, or .bin)")
    tokenizer = path / "tokenizer"
    if not any((tokenizer / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        missing.append("tokenizer/tokenizer.json (or vocab.json + merges.txt)")
    if missing:
        raise FileNotFoundError(f"NOVA checkpoint {path} is incomplete: missing {', '.join(missing)}; {SOURCE}")
    index = json.loads((path / MODEL_INDEX).read_text())
    if "NOVA" not in str(index.get("_class_name", "")):
        raise ValueError(
            f"{path / MODEL_INDEX}: _class_name is {index.get('_class_name')!r}, expected a NOVA pipeline (NOVAPipeline); {SOURCE}"
        )


def write_json(file: Path, data: dict) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(data, indent=2) + "\n")


def write_weights(file: Path, state: dict[str, torch.Tensor]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(file), metadata={"format": "pt"})

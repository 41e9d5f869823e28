"""Sample grids: images in rows with their prompts as captions, saved as one PNG."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image, ImageDraw


def save_grid(
    images: torch.Tensor, captions: list[str], path: str | Path, columns: int = 8, scale: int = 3, caption_height: int = 22
) -> Path:
    """images float [B, 3, H, W] in [0, 1] -> a PNG grid; each tile upscaled `scale`x with its caption."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images: expected [B, 3, H, W], got shape {tuple(images.shape)}")
    if len(captions) != images.shape[0]:
        raise ValueError(f"captions: got {len(captions)} for {images.shape[0]} images, expected one each")
    B, _, H, W = images.shape
    columns = max(1, min(columns, B))
    rows = (B + columns - 1) // columns
    tile_w, tile_h = W * scale, H * scale + caption_height
    canvas = Image.new("RGB", (columns * tile_w, rows * tile_h), "white")
    draw = ImageDraw.Draw(canvas)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    for i in range(B):
        x, y = (i % columns) * tile_w, (i // columns) * tile_h
        tile = Image.fromarray(pixels[i]).resize((tile_w, H * scale), Image.NEAREST)
        canvas.paste(tile, (x, y))
        words, lines = captions[i].split(), [""]
        for word in words:  # wrap to the tile width (about 6 px per character)
            if len(lines[-1]) + len(word) + 1 > tile_w // 6:
                lines.append(word)
            else:
                lines[-1] = f"{lines[-1]} {word}".strip()
        draw.multiline_text((x + 2, y + H * scale + 1), "\n".join(lines[:2]), fill="black", spacing=0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path

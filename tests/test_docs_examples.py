"""The Python examples of docs/USING.md run as written: every ```python block, in order, in one
namespace (a later block may use names an earlier one defined)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

USING = Path(__file__).resolve().parents[1] / "docs" / "USING.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_the_extractor_finds_blocks_and_only_python_ones():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x + 1\n"]


def test_using_md_examples_run():
    blocks = python_blocks(USING.read_text())
    assert len(blocks) >= 4, "docs/USING.md lost its examples"
    namespace: dict = {"__name__": "using_md"}
    with torch.random.fork_rng():
        for i, code in enumerate(blocks):
            try:
                exec(compile(code, f"{USING.name} block {i + 1}", "exec"), namespace)
            except Exception as err:  # name the block that failed
                pytest.fail(f"docs/USING.md python block {i + 1} failed: {type(err).__name__}: {err}")

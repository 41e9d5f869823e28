"""Every code block of docs/USING.md runs as written: the ```python blocks in order, in one namespace
(a later block may use names an earlier one defined; `mar` and `vae`, which the page says are the
reader's own LTH14/mar model, are tests/mar_standin.py), the ```json lines through margrpo's prompt
file reader, and every `margrpo` command of the ```bash blocks, expanded by bash itself, through that
command's own argument parser and, with --config, the config loader (the commands need weights and
checkpoints that CI does not have; their options and keys must still exist)."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
from pathlib import Path

import mar_standin
import pytest
import torch

from margrpo import cli
from margrpo.prompt_files import read_prompt_records
from margrpo.train.config import TrainerConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
USING = ROOT / "docs" / "USING.md"


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return blocks(text, "python")


def test_the_extractor_finds_blocks_and_only_python_ones():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x + 1\n"]
    assert blocks(text, "bash") == ["ls\n"]


def test_every_code_block_has_a_runner():
    languages = set(re.findall(r"^```(\w*)\n", USING.read_text(), re.M)) - {""}  # "" closes a block
    assert languages <= {"python", "json", "bash"}, f"docs/USING.md: no test runs {languages - {'python', 'json', 'bash'}} blocks"


def test_using_md_examples_run():
    code = python_blocks(USING.read_text())
    assert len(code) >= 6, "docs/USING.md lost its examples"
    with torch.random.fork_rng():
        mar, vae = mar_standin.standins()
        namespace: dict = {"__name__": "using_md", "mar": mar, "vae": vae}
        for i, block in enumerate(code):
            try:
                exec(compile(block, f"{USING.name} block {i + 1}", "exec"), namespace)
            except Exception as err:  # name the block that failed
                pytest.fail(f"docs/USING.md python block {i + 1} failed: {type(err).__name__}: {err}")


def test_the_bring_your_own_mar_recipe_is_under_30_lines():
    recipe = next(b for b in python_blocks(USING.read_text()) if "class MARPolicy" in b)
    body = recipe.split('"""')
    code = body[0] + body[2] if len(body) == 3 else recipe  # without the class docstring
    lines = [line for line in code.splitlines() if line.strip() and not line.startswith(("import ", "from "))]
    assert len(lines) < 30, len(lines)


def test_using_md_json_lines_are_valid_prompt_records(tmp_path):
    lines = [line for block in blocks(USING.read_text(), "json") for line in block.splitlines() if line.strip()]
    assert lines, "docs/USING.md lost its prompt-file example"
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = read_prompt_records(path)  # raises naming the line and key of anything invalid
    assert len(records) == len(lines) and all(r.meta.get("objects") for r in records)


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def _commands(tmp_path) -> list[list[str]]:
    """argv of every `margrpo` call in the bash blocks, as bash expands them (margrpo a recording function)."""
    record = tmp_path / "argv"
    script = 'margrpo() { printf \'%s\\0\' "$@" >> "$RECORD"; printf \'\\n\' >> "$RECORD"; }\n'
    script += "\n".join(blocks(USING.read_text(), "bash"))
    subprocess.run(["bash", "-euc", script], cwd=ROOT, env={"RECORD": str(record), "PATH": "/usr/bin:/bin"}, check=True)
    return [line.rstrip("\0").split("\0") for line in record.read_text().split("\0\n") if line]


def test_using_md_commands_parse(tmp_path, monkeypatch):
    commands = _commands(tmp_path)
    assert len(commands) >= 3, commands

    def parsed(parse):
        def stop(self, *args, **kwargs):
            raise _Parsed(parse(self, *args, **kwargs))

        return stop

    for name in ("parse_args", "parse_intermixed_args"):
        monkeypatch.setattr(argparse.ArgumentParser, name, parsed(getattr(argparse.ArgumentParser, name)))
    monkeypatch.chdir(ROOT)
    for argv in commands:
        assert argv[0] in cli.COMMANDS, f"margrpo {argv[0]}: no such command"
        try:
            importlib.import_module(cli.COMMANDS[argv[0]][0]).main(argv[1:])
        except _Parsed as done:
            args = done.namespace
        except SystemExit as err:  # argparse's own error (printed above)
            pytest.fail(f"docs/USING.md: `margrpo {' '.join(argv)}` does not parse (exit {err.code})")
        else:
            pytest.fail(f"margrpo {argv[0]}: parsed no arguments")
        if getattr(args, "config", None):  # the config file and every key=value override must load
            assert isinstance(load_config(args.config, list(getattr(args, "overrides", None) or [])), TrainerConfig)

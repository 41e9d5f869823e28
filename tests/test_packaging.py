"""What a wheel of margrpo contains, checked from the source tree in a second (CI also builds and
installs one: scripts/wheel_smoke.sh). setuptools' find_packages only finds directories with an
__init__.py, and package_data only ships files its globs match."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_files(under: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", under], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines()]


def package_data() -> dict[str, list[str]]:
    """setup.py's PACKAGE_DATA literal."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PACKAGE_DATA":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py: no PACKAGE_DATA assignment")


def test_every_directory_with_modules_is_a_package():
    dirs = {p.parent for p in tracked_files("margrpo") if p.suffix == ".py"}
    missing = sorted(str(d.relative_to(ROOT)) for d in dirs if not (d / "__init__.py").is_file())
    assert missing == [], f"not packages (no __init__.py), so left out of a wheel: {missing}"


def test_every_data_file_in_the_package_is_package_data():
    data = package_data()
    unshipped = []
    for path in tracked_files("margrpo"):
        if path.suffix == ".py":
            continue
        rel = path.relative_to(ROOT)
        shipped = False
        for package, globs in data.items():
            base = Path(*package.split("."))
            if base in rel.parents:
                inner = str(rel.relative_to(base))
                shipped = shipped or any(fnmatch.fnmatch(inner, g) for g in globs)
        if not shipped:
            unshipped.append(str(rel))
    assert unshipped == [], f"files under margrpo/ that no package_data glob ships: {unshipped}"
    assert any("shapes-tiny/model.safetensors" in str(p) for p in tracked_files("margrpo/checkpoints"))


def test_the_top_level_kernels_folder_is_no_package():
    """kernels/ holds margrpo.kernels' sources but no __init__.py: from the checkout root a package
    there would import as `kernels` and shadow the PyPI package that transformers and peft import."""
    assert not (ROOT / "kernels" / "__init__.py").exists()
    assert (ROOT / "margrpo" / "kernels" / "__init__.py").is_file()
    code = "import importlib.util, margrpo.kernels; print(importlib.util.find_spec('margrpo.kernels.topk').origin)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).resolve() == (ROOT / "kernels" / "topk.py").resolve()


def test_peft_and_transformers_import_from_the_checkout_root():
    """`python -c` from the root puts the root first on sys.path, as `python -m margrpo.cli` does."""
    for name in ("peft", "transformers"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    code = (
        "import peft, kernels; from transformers import CLIPModel; import os; "
        "assert os.path.dirname(kernels.__file__ or '') != os.path.abspath('kernels'), kernels.__file__"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_wheel_gets_margrpo_kernels_from_the_top_level_folder(tmp_path):
    """setup.py's build_py (what a wheel holds) copies kernels/*.py beside margrpo/kernels/__init__.py."""
    env = {**os.environ, "MARGRPO_NO_EXTENSION": "1"}
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT, env=env, check=True, capture_output=True
    )
    built = {p.name for p in (tmp_path / "margrpo" / "kernels").glob("*.py")}
    assert built == {"__init__.py"} | {p.name for p in (ROOT / "kernels").glob("*.py")}
    assert not (tmp_path / "kernels").exists()

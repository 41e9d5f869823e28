"""Packaging of the rewards: importable without heavy deps, and the `rewards` extra leaves the core
test environment's pytest, protobuf and timm alone (hpsv2 pins pytest==7.2.0 and protobuf<4;
image-reward pins timm==0.6.13 and fairscale, so neither may enter the extra's dependency tree)."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"hpsv2", "image-reward", "fairscale"}
GUARDED = ("pytest", "protobuf", "timm")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def rewards_extra() -> list[str]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    assert "rewards" in extras, "pyproject.toml must define the optional extra 'rewards'"
    assert {"transformers", "open-clip-torch", "timm"} <= {_norm(r.split(">")[0].split("=")[0].split("<")[0]) for r in extras["rewards"]}
    return extras["rewards"]


def dependency_closure(requirements: list[str]):
    """(installed distribution names reached, requirements met on the way) from the installed metadata."""
    requirements_module = pytest.importorskip("packaging.requirements", reason="needs the packaging library")
    Requirement = requirements_module.Requirement
    seen, edges, todo = set(), [], [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        edges.append(req)
        if name in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.skip(f"{req.name} is not installed: install the rewards extra to run this check")
        seen.add(name)
        for text in dist.requires or []:
            child = Requirement(text)
            if child.marker is None or child.marker.evaluate({"extra": ""}):
                todo.append(child)
    return seen, edges


def test_rewards_extra_keeps_core_test_pins():
    SpecifierSet = pytest.importorskip("packaging.specifiers", reason="needs the packaging library").SpecifierSet
    extra = rewards_extra()
    names, edges = dependency_closure(extra)
    assert not (names & FORBIDDEN), f"the rewards extra pulls in {sorted(names & FORBIDDEN)}"
    for req in edges:
        name = _norm(req.name)
        if name not in GUARDED:
            continue
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            continue  # not in the core environment: nothing to change
        assert SpecifierSet(str(req.specifier)).contains(installed, prereleases=True), (
            f"{req} (needed via the rewards extra) would change {name} {installed} of the core test environment"
        )
    assert SpecifierSet(">=8").contains(md.version("pytest"))  # the core test extra's floor still holds


def test_import_needs_no_heavy_dependency():
    code = (
        "import sys\n"
        "for m in ('open_clip', 'transformers', 'timm', 'torchvision'): sys.modules[m] = None\n"
        "import margrpo.rewards as r\n"
        "assert 'hps' in r.available_rewards()\n"
        "try:\n    r.build_reward('hps', path='/nonexistent.pt')\nexcept r.MissingWeightsError as e:\n"
        "    print('missing-ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "missing-ok" in out.stdout

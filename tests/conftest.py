"""Shared test setup.

Without CUDA, Triton kernels run in the interpreter on CPU tensors: TRITON_INTERPRET must be set
before anything imports triton (importing torch does not).
"""

from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

# `python -m pytest` puts the checkout's root on sys.path. margrpo is installed, so the tests take the
# root off the path and import only what the installation provides (the top-level kernels/ folder no
# longer shadows the PyPI package `kernels`: it has no __init__.py, tests/test_packaging.py).
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests use small tensors: one intra-op thread avoids OpenMP spin-waits, which made small ops
# ~20x slower on a loaded 2-core machine. MARGRPO_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("MARGRPO_TEST_THREADS", "1")))

import margrpo.ops as ops  # noqa: E402
from margrpo.ops import _backend, _kernels  # noqa: E402

# Tolerances against a float64 reference. Half-precision inputs are compared against the
# reference evaluated on the same (already rounded) values, so these cover kernel arithmetic only.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 2e-2}


def pytest_addoption(parser):
    parser.addoption(
        "--oracle", action="store_true", help="run the reward oracle tests (build venvs with the official reward packages; minutes)"
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--oracle"):
        return
    skip = pytest.mark.skip(reason="reward oracle: builds venvs with the official packages; run with --oracle")
    for item in items:
        if "oracle" in item.keywords:
            item.add_marker(skip)


def backends_under_test() -> list[str]:
    """Every backend this installation runs, plus triton whenever the interpreter is on."""
    names = list(ops.available_backends())
    if _backend.triton_interpreted() and "triton" not in names:
        names.append("triton")
    return names


def device_for(backend: str) -> torch.device:
    """The device a backend's kernels run on here: cpp on CPU, cuda on CUDA, triton on CUDA when
    there is one (else the interpreter on CPU), the reference on CPU."""
    if backend == "cuda" or (backend == "triton" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


@dataclass(frozen=True)
class Backend:
    """A backend under test, selected for the duration of the test."""

    name: str
    device: torch.device

    def require(self, module: str, *kernels: str) -> None:
        """Skip the test when this backend lacks one of the kernels (not built / not landed yet)."""
        if self.name == "triton" and not _backend._has_triton():
            pytest.skip("triton: the triton package is not installed")
        for kernel in kernels:
            if _kernels.find(self.name, module, kernel) is None:
                where = f"margrpo.kernels.{module}" if self.name == "triton" else "torch.ops.margrpo"
                pytest.skip(f"{self.name}: kernel {where}.{kernel} is not built in this installation")


@pytest.fixture(params=backends_under_test())
def backend(request) -> Backend:
    """Each available backend in turn, selected with ops.use_backend for the test's duration."""
    with ops.use_backend(request.param):
        yield Backend(request.param, device_for(request.param))


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the test id: fresh data per test, reproducible per run."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def poison_uninitialized():
    """Make torch.empty & co (Python and C++ at::empty) return NaN / max-int / True-filled memory,
    so a kernel that leaves output elements unwritten fails the comparison instead of passing on
    zeroed memory by luck."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.utils.deterministic.fill_uninitialized_memory = was_fill
    torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    """Compare with the float64 expectation at `dtype`'s tolerance (relative, and absolute times
    `scale`, the magnitude of the summands behind each value where cancellation can occur)."""
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().cpu().double(), rtol=tol, atol=tol * scale, equal_nan=True)


def randn(gen: torch.Generator, *shape: int, dtype=torch.float64, device="cpu", scale: float = 1.0, shift: float = 0.0):
    """Normal samples drawn on CPU from `gen` (same data on every device), then moved."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(device=device, dtype=dtype)


def tiny_float64_mar(seed: int, train_backbone: bool = False):
    """A seeded 16-token TinyMAR (16 px images, 4 px patches, one block, 6 diffusion steps) in float64
    and eval mode for exact tests, its head's adaLN-zero layers re-initialised (else the head ignores
    z). train_backbone: the AR model's parameters require grad (the head's never); else none does."""
    from margrpo.heads import reinit_zero_layers_
    from margrpo.models.tiny import TinyMAR, TinyMARConfig

    torch.manual_seed(seed)
    model = TinyMAR(
        TinyMARConfig(image_size=16, patch_size=4, width=32, depth=1, num_heads=2, head_width=32, head_depth=1, diffusion_steps=6)
    )
    with torch.no_grad():
        reinit_zero_layers_(model.head, std=0.2)
    model = model.double().eval().requires_grad_(False)
    for p in model.trainable_parameters():
        p.requires_grad_(train_backbone)
    return model


def make_tiny_checkpoint(tmp_path_factory, depth: int) -> Path:
    """A seeded random-init TinyMAR small enough for trainer tests (seconds), saved as a checkpoint dir."""
    from margrpo.heads import reinit_zero_layers_
    from margrpo.models.tiny import TinyMAR, TinyMARConfig

    torch.manual_seed(0)
    config = TinyMARConfig(patch_size=8, width=32, depth=depth, num_heads=2, head_width=32, head_depth=1, diffusion_steps=6)
    model = TinyMAR(config)
    reinit_zero_layers_(model.head, std=0.02)  # adaLN-zero would make the head ignore z
    path = tmp_path_factory.mktemp("tiny") / "ckpt"
    model.save(path)
    return path


def make_small_trainer(tmp_path, checkpoint, *overrides):
    """A Trainer on a tiny checkpoint that logs, saves and evaluates nothing, on one thread; the caller's
    overrides (rollout, grpo, rewards) come after these."""
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    base = [
        f"backbone.checkpoint={checkpoint}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=1",
    ]
    return Trainer(load_config(None, [*base, *overrides]), create_run_dir=False)


ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, name: str):
    """The module of a script under the repository root (scripts/, benchmarks/: folders, not
    packages), registered in sys.modules as `name` (dataclasses look their module up while built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    assert spec is not None and spec.loader is not None, relative_path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

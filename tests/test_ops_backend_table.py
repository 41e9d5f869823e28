"""The measured backend order of `auto` (margrpo/ops/_table.py): the shipped table, auto following
a table given by path or env var, the fallback where it has no figures, `bench ops --write-table`,
and clear errors for bad tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import margrpo.ops as ops
from margrpo.bench import table as bench_table
from margrpo.ops import _backend, _kernels, _table

CPU = torch.device("cpu")
GAUSS = ("gaussian_logprob", "gaussian_logprob", ("gaussian_logprob_fwd", "gaussian_logprob_bwd"))
NOVA_ELEMENTS = {
    "gaussian_logprob": 3 * 4 * 1024 * 16,
    "trajectory_std": 3 * 4 * 1024 * 16,
    "topk_mask": 4 * 1024,
    "consistency_mask": 3 * 4 * 1024 * 16,
    "grpo_surrogate": 3 * 4 * 1024,
}
needs_cpp = pytest.mark.skipif("cpp" not in ops.available_backends(), reason="margrpo._C is not built")


def write_table(path, entries):
    path.write_text(json.dumps({"format": 1, "entries": entries}))
    return path


def entry(op="gaussian_logprob", device="cpu", lo=0, hi=None, order=("cpp", "torch")):
    return {"op": op, "device": device, "min_elements": lo, "max_elements": hi, "order": list(order)}


def eager_pick(elements: int) -> str:
    op, module, names = GAUSS
    return _kernels.for_eager(CPU, op, module, names, elements=elements)[0]


# ------------------------------------------------------------------ the shipped table
def test_shipped_table_puts_cuda_before_triton_on_nvidia_gpus():
    """Seeded from the 2026-12-04 H200 runs: cuda beats triton for every op at the NOVA shape, and
    triton is slower than eager for gaussian_logprob, so it never comes first."""
    table = _table.load(_table.PACKAGED)
    for kind in ("nvidia-h200", "nvidia-h100", "other-cuda"):
        for op, elements in NOVA_ELEMENTS.items():
            order = table.order(op, kind, elements)
            assert order is not None and order[0] == "cuda", (kind, op, order)
            assert order.index("cuda") < order.index("triton")
    data = json.loads(_table.PACKAGED.read_text())
    h200 = [e for e in data["entries"] if e["device"] == "nvidia-h200" and e["op"] == "gaussian_logprob"]
    nova = next(e for e in h200 if e["measured"]["dims"] == [[3, 4, 1024, 16]])
    speedups = nova["measured"]["speedup_vs_eager"]
    assert speedups["margrpo[triton]"] < 1.0 < speedups["margrpo[cuda]"]
    assert all("assumed_from" in e for e in data["entries"] if e["device"] in ("nvidia-h100", "other-cuda"))
    assert table.order("topk_indices", "nvidia-h200", 4096) is None  # not measured: the built-in rule


def test_device_kinds():
    assert _table.kind_from_name("cpu") == "cpu"
    assert _table.kind_from_name("cuda", "NVIDIA H200") == "nvidia-h200"
    assert _table.kind_from_name("cuda", "NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert _table.kind_from_name("cuda", "NVIDIA A100-SXM4-80GB") == "other-cuda"
    assert _table.kind_from_name("meta") is None
    assert _table.device_kind(CPU) == "cpu"


# ------------------------------------------------------------------ auto follows the table
@needs_cpp
def test_auto_follows_the_table_per_size_bucket(tmp_path):
    path = write_table(tmp_path / "t.json", [entry(hi=100, order=["torch"]), entry(lo=100, hi=1000, order=["cpp"])])
    with _table.use_backend_table(path), ops.use_backend("auto"):
        assert eager_pick(64) == "torch" and eager_pick(99) == "torch"
        assert eager_pick(100) == "cpp" and eager_pick(999) == "cpp"
        assert eager_pick(5000) == "cpp"  # past the table: the built-in rule (cpp first on CPU)
        op, module, names = GAUSS
        assert _kernels.pick(CPU, op, module, *names, elements=64) == "torch"
        assert _kernels.pick(CPU, op, module, *names, elements=500) == "cpp"
        assert _kernels.pick(CPU, op, module, *names, elements=None) == "cpp"  # buckets disagree: built-in rule
        # both buckets give the same values through the public op
        x, mean = torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
        small = ops.gaussian_logprob(x, mean, 0.7)
        big = ops.gaussian_logprob(x.repeat(8, 1), mean.repeat(8, 1), 0.7)
        torch.testing.assert_close(big[:4], small)
    # an explicit backend ignores the table
    with _table.use_backend_table(path), ops.use_backend("cpp"):
        assert eager_pick(64) == "cpp"


def test_table_order_falls_back_past_unusable_backends(tmp_path):
    """An order naming a backend that cannot run here (cuda on a CPU) moves on, then to the built-in rule."""
    path = write_table(tmp_path / "t.json", [entry(order=["cuda", "triton"])])
    with _table.use_backend_table(path):
        order = _backend.auto_order(CPU, "gaussian_logprob", 10)
        assert order[:2] == ("cuda", "triton") and order[-1] == "torch" and "cpp" in order
        with ops.use_backend("auto"):
            expected = "cpp" if "cpp" in ops.available_backends() else "torch"
            if "triton" in ops.available_backends():  # TRITON_INTERPRET=1 runs triton on CPU tensors
                expected = "triton"
            assert eager_pick(10) == expected


def test_unknown_op_device_or_size_keeps_the_built_in_rule(tmp_path):
    path = write_table(tmp_path / "t.json", [entry(lo=50, hi=60, order=["torch"])])
    with _table.use_backend_table(path):
        assert _backend.auto_order(CPU, "gaussian_logprob", 10) == _backend.DEFAULT_ORDER["cpu"]
        assert _backend.auto_order(CPU, "gaussian_logprob", 55) == ("torch", "cpp")
        assert _backend.auto_order(CPU, "topk_mask", 55) == _backend.DEFAULT_ORDER["cpu"]
        assert _backend.auto_order(torch.device("meta"), "gaussian_logprob", 55) == ("torch",)


def test_env_var_names_the_table(tmp_path):
    path = write_table(tmp_path / "t.json", [entry(order=["torch"])])
    script = (
        "import torch, margrpo.ops as ops\nfrom margrpo.ops import _kernels\n"
        "print(_kernels.for_eager(torch.device('cpu'), 'gaussian_logprob', 'gaussian_logprob', "
        "('gaussian_logprob_fwd',), elements=10)[0])"
    )
    env = {**os.environ, "MARGRPO_BACKEND_TABLE": str(path), "MARGRPO_BACKEND": "auto"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "torch", done.stderr[-2000:]
    env["MARGRPO_BACKEND_TABLE"] = str(tmp_path / "missing.json")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "backend table" in done.stderr and "missing.json: cannot be read" in done.stderr


# ------------------------------------------------------------------ bad tables
@pytest.mark.parametrize(
    "data, match",
    [
        ([], r"the top level: got 'list', expected a JSON object"),
        ({"format": 2, "entries": []}, r"format: got 2, expected 1"),
        ({"format": 1}, r"entries: got 'NoneType', expected a list"),
        ({"format": 1, "entries": [entry(op="softmax")]}, r"entries\[0\]\.op: got 'softmax', expected one of gaussian_logprob"),
        ({"format": 1, "entries": [entry(device="tpu")]}, r"entries\[0\]\.device: got 'tpu', expected one of cpu"),
        ({"format": 1, "entries": [entry(lo=-1)]}, r"entries\[0\]\.min_elements: got -1, expected an integer >= 0"),
        ({"format": 1, "entries": [entry(lo=10, hi=10)]}, r"entries\[0\]\.max_elements: got 10, expected null .* > min_elements"),
        ({"format": 1, "entries": [entry(order=[])]}, r"entries\[0\]\.order: got \[\], expected a non-empty list"),
        ({"format": 1, "entries": [entry(order=["cpp", "cpp"])]}, r"entries\[0\]\.order: .* distinct backends"),
        ({"format": 1, "entries": [entry(order=["fast"])]}, r"entries\[0\]\.order: got \['fast'\]"),
        ({"format": 1, "entries": [entry(hi=100), entry(lo=50)]}, r"entries\[1\] \(gaussian_logprob on cpu\): .* overlaps \[0, 100\]"),
    ],
)
def test_bad_tables_give_errors_naming_the_field(tmp_path, data, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        _table.set_backend_table(path)
    assert _table.current().source != str(path)  # the bad table was not taken


def test_unreadable_tables(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match=r"broken.json: not valid JSON"):
        _table.load(tmp_path / "broken.json")
    with pytest.raises(ValueError, match=r"nothing.json: cannot be read"):
        _table.load(tmp_path / "nothing.json")


# ------------------------------------------------------------------ --write-table
def bench_report(gpu: str | None, speedups: dict[tuple, dict[str, float]]) -> dict:
    device = "cuda" if gpu else "cpu"
    rows = [
        {"op": op, "size": "s", "dims": list(dims), "mode": "forward", "impl": impl, "device": device, "speedup": s}
        for (op, dims), impls in speedups.items()
        for impl, s in impls.items()
    ]
    return {"machine": {"device": device, **({"gpu": gpu} if gpu else {})}, "rows": rows}


def test_write_table_ranks_backends_and_splits_sizes(tmp_path):
    small, large = (3, 4, 1024, 16), (10, 64, 1024, 16)
    report = bench_report(
        "NVIDIA H200",
        {
            ("gaussian_logprob", small): {"eager": 1.0, "compile": 0.8, "margrpo[triton]": 0.7, "margrpo[cuda]": 1.4, "kernel[cuda]": 2.3},
            ("gaussian_logprob", large): {"eager": 1.0, "compile": 1.9, "margrpo[triton]": 1.7, "margrpo[cuda]": 1.6},
        },
    )
    path = tmp_path / "t.json"
    bench_table.write(path, [report], ["test"], assume_for=("nvidia-h100",))
    table = _table.load(path)
    a, b = 3 * 4 * 1024 * 16, 10 * 64 * 1024 * 16
    assert table.order("gaussian_logprob", "nvidia-h200", 1) == ("cuda", "triton")
    assert table.order("gaussian_logprob", "nvidia-h200", a) == ("cuda", "triton")
    assert table.order("gaussian_logprob", "nvidia-h200", b * 100) == ("triton", "cuda")
    split = int((a * b) ** 0.5) + 1
    assert table.order("gaussian_logprob", "nvidia-h200", split - 1) == ("cuda", "triton")
    assert table.order("gaussian_logprob", "nvidia-h200", split) == ("triton", "cuda")
    assert table.order("gaussian_logprob", "nvidia-h100", a) == ("cuda", "triton")
    data = json.loads(path.read_text())
    assert {e["measured"]["beats_compile"] for e in data["entries"]} == {True, False}
    # a later CPU run keeps the GPU entries
    cpu = bench_report(None, {("trajectory_std+topk_mask", small): {"eager": 1.0, "margrpo[torch]": 2.0, "margrpo[cpp]": 1.5}})
    bench_table.write(path, [cpu], ["cpu run"])
    table = _table.load(path)
    assert table.order("trajectory_std", "cpu", a) == ("torch", "cpp")
    assert table.order("topk_mask", "cpu", 4 * 1024) == ("torch", "cpp")
    assert table.order("gaussian_logprob", "nvidia-h200", a) == ("cuda", "triton")
    assert json.loads(path.read_text())["sources"] == ["test", "cpu run"]
    # a later H200 run at the large shape only: the small shape's figures stay, the buckets re-split;
    # the H100's assumed entries stay until a run on an H100
    later = bench_report("NVIDIA H200", {("gaussian_logprob", large): {"eager": 1.0, "margrpo[triton]": 1.2, "margrpo[cuda]": 1.5}})
    bench_table.write(path, [later], ["later"])
    table = _table.load(path)
    assert table.order("gaussian_logprob", "nvidia-h200", a) == ("cuda", "triton")
    assert table.order("gaussian_logprob", "nvidia-h200", b) == ("cuda", "triton")
    assert table.order("gaussian_logprob", "nvidia-h100", b) == ("triton", "cuda")
    with pytest.raises(ValueError, match="assume_for: got 'cpu'"):
        bench_table.write(path, [report], ["x"], assume_for=("cpu",))
    with pytest.raises(ValueError, match=r"bench rows\[0\]: got .*expected op, dims, impl and speedup"):
        bench_table.write(path, [{"rows": [{"op": "gaussian_logprob"}]}], ["x"])


def test_verdicts_say_where_no_backend_beats_eager_or_compile():
    small = (3, 4, 1024, 16)
    rows = bench_report(
        "NVIDIA H200",
        {
            ("gaussian_logprob", small): {"eager": 1.0, "compile": 1.9, "margrpo[cuda]": 1.6},
            ("consistency_mask", small): {"eager": 1.0, "compile": 0.5, "margrpo[cuda]": 0.9},
            ("grpo_surrogate", small): {"eager": 1.0, "compile": 1.5, "margrpo[cuda]": 2.0},
        },
    )["rows"]
    lines = bench_table.verdicts(rows)
    assert lines == [
        "gaussian_logprob s [3x4x1024x16] forward: no margrpo backend beats torch.compile (best margrpo[cuda] 1.60x eager, compile 1.90x)",
        "consistency_mask s [3x4x1024x16] forward: no margrpo backend beats eager (best margrpo[cuda] 0.90x eager)",
    ]


@needs_cpp
def test_bench_ops_write_table_end_to_end(tmp_path):
    """A real (quick) CPU run of `margrpo bench ops --write-table` writes a table auto can follow."""
    path, report = tmp_path / "t.json", tmp_path / "r.json"
    argv = [
        "-m",
        "margrpo.bench.ops",
        "--device",
        "cpu",
        "--quick",
        "--ops",
        "grpo_surrogate",
        "--modes",
        "forward",
        "--tokens",
        "256",
        "--json",
        str(report),
        "--write-table",
        str(path),
    ]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "backend table: 1 entries written" in done.stdout
    table = _table.load(path)
    order = table.order("grpo_surrogate", "cpu", 3 * 256)
    assert order is not None and set(order) == {"cpp", "torch"}
    # the saved report gives the same table
    again = tmp_path / "again.json"
    done = subprocess.run(
        [sys.executable, "-m", "margrpo.bench.ops", "--from-json", str(report), "--write-table", str(again)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(again.read_text())["entries"] == json.loads(path.read_text())["entries"]

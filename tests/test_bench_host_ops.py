"""`margrpo bench host --sections ops`: each public op against its raw kernel call, interleaved."""

from __future__ import annotations

import json

import pytest

import margrpo.ops as ops
from margrpo.bench import host as bench_host
from margrpo.bench import host_ops

pytestmark = pytest.mark.skipif("cpp" not in ops.available_backends(), reason="margrpo._C is not built")


def test_rows_time_every_op_against_its_raw_kernel():
    order: list[dict] = []
    rows = host_ops.op_overhead(shapes=("tiny",), rounds=3, calls={"tiny": 5}, order=order)
    assert [r.op for r in rows] == list(host_ops.OPS) and all(r.shape == "tiny" and r.rounds == 3 for r in rows)
    for r in rows:
        assert r.public_us > 0 and r.raw_us > 0 and r.ratio_p20 <= r.ratio <= r.ratio_p80
        assert r.wrapper_us == pytest.approx(r.public_us - r.raw_us)
    assert len(order) == len(rows) and all(len(o["order"]) == 3 and sorted(o["order"][0]) == ["public", "raw"] for o in order)
    assert "public/raw p50 [p20, p80]" in host_ops.format_rows(rows)


def test_public_and_raw_calls_agree():
    """The raw call computes what the public op does (else the ratio compares different work)."""
    for op, (public, raw) in host_ops.cases(host_ops.SHAPES["tiny"]).items():
        got, want = public(), raw()
        if op.startswith("grpo_surrogate"):
            assert got.ratio_max.tolist() == pytest.approx(want[1][3].item(), rel=1e-6), op
            got, want = got.loss, want[0]
        assert got.reshape(-1).tolist() == pytest.approx(want.reshape(-1).tolist(), rel=1e-6, abs=1e-6), op


def test_host_cli_ops_section(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert bench_host.main(["--sections", "ops", "--rounds", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {"machine", "ops", "ops_order", "load_average_end"} <= set(data) and "adaln" not in data
    assert {(r["op"], r["shape"]) for r in data["ops"]} == {(o, s) for o in host_ops.OPS for s in ("tiny", "nova")}
    assert "load average" in capsys.readouterr().out

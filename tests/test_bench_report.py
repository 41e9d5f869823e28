"""The benchmark report itself (not speed): percentiles, paired ratios, the recorded interleaving
order, backward timed apart from its forward, memory, and the JSON / table / plot of `bench ops`."""

from __future__ import annotations

import json

import pytest
import torch

from margrpo.bench import memory, timing
from margrpo.bench import ops as bench_ops

CPU = torch.device("cpu")


def test_percentiles_are_ordered_and_interpolated():
    st = timing.stats([5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 8.0, 7.0, 9.0])
    assert st.min == 1.0 and st.n == 10
    assert st.min <= st.p20 <= st.p50 <= st.p80
    assert st.p50 == 5.5 and st.p20 == pytest.approx(2.8) and st.p80 == pytest.approx(8.2)
    single = timing.stats([2.0])
    assert (single.p20, single.p50, single.p80, single.min) == (2.0, 2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="samples"):
        timing.stats([])


def test_ratio_is_paired_round_by_round():
    # the load drifts 100x over the rounds; b is always twice as fast as a within a round
    result = timing.Interleaved({"a": [1.0, 10.0, 100.0, 50.0], "b": [0.5, 5.0, 50.0, 25.0]}, [])
    ratio = result.ratio("a", "b")
    assert ratio.p20 == ratio.p50 == ratio.p80 == pytest.approx(2.0)


def test_interleaving_order_is_recorded_as_run():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    result = timing.interleave(fns, CPU, min_time_s=0.0, warmup=1, min_rounds=6, max_rounds=6)
    assert len(result.order) == 6 and all(len(t) == 6 for t in result.times.values())
    assert calls[3:] == [name for round_order in result.order for name in round_order]  # after 3 warm-up calls
    assert all(sorted(r) == ["a", "b", "c"] for r in result.order)
    assert len({tuple(r) for r in result.order}) > 1  # shuffled, not a fixed order


class _Counted(torch.autograd.Function):
    """x * 2 whose forward and backward log themselves (a fake op)."""

    events: list[str] = []

    @staticmethod
    def forward(ctx, x):
        _Counted.events.append("fwd")
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _Counted.events.append("bwd")
        return grad * 2


def _fake_bench() -> bench_ops.OpBench:
    def make_inputs(dims, device):
        return {"x": torch.randn(dims[1] * dims[2], device=device, requires_grad=True)}

    def impls(device, compile):
        return {"eager": lambda t: t["x"] * 2, "fused": lambda t: _Counted.apply(t["x"]), "kernel[fake]": lambda t: t["x"].detach() * 2}

    def close(got, expected):
        torch.testing.assert_close(got, expected)

    return bench_ops.OpBench(make_inputs, impls, ("x",), close, lambda got, expected: [close(g, e) for g, e in zip(got, expected)])


@pytest.mark.parametrize("mode,timed", [("forward", ["fwd"]), ("backward", ["bwd"]), ("full", ["fwd", "bwd"])])
def test_each_mode_times_only_its_own_pass(monkeypatch, mode, timed):
    """The fake op logs its passes and the clock logs its reads: between the two clock reads of a
    timed call lies exactly the mode's pass (a backward's forward runs before the first read)."""
    log = _Counted.events
    log.clear()
    monkeypatch.setattr(timing, "_now", lambda: log.append("tick") or 0.0)
    rounds = 4
    result = bench_ops.run(
        ("fake",),
        bench_ops.token_sweep((8,), k=2),
        CPU,
        (mode,),
        compile=False,
        min_time_s=0.0,
        warmup=1,
        min_rounds=rounds,
        max_rounds=rounds,
        benches={"fake": _fake_bench()},
    )
    inside, is_timed = [], False
    for event in log:
        if event == "tick":
            is_timed = not is_timed
            if is_timed:
                inside.append([])
        elif is_timed:
            inside[-1].append(event)
    fused_calls = [events for events in inside if events]  # eager's calls log nothing
    assert fused_calls == [timed] * rounds
    assert len(inside) == rounds * (3 if mode == "forward" else 2)  # the kernel has no backward
    impls = {row.impl for row in result.rows}
    assert impls == ({"eager", "fused", "kernel[fake]"} if mode == "forward" else {"eager", "fused"})
    if mode == "backward":  # every timed backward had its own untimed forward
        assert log.count("fwd") == log.count("bwd")


def test_ops_report_structure():
    result = bench_ops.run(
        ("gaussian_logprob", "consistency_mask"),
        bench_ops.token_sweep((64, 128), k=2),
        CPU,
        compile=False,
        min_time_s=0.0,
        warmup=1,
        min_rounds=3,
        max_rounds=3,
    )
    modes = {(r.op, r.mode) for r in result.rows}
    assert modes == {("gaussian_logprob", m) for m in bench_ops.MODES} | {("consistency_mask", "forward")}
    for r in result.rows:
        assert r.min_ms <= r.p20_ms <= r.p50_ms <= r.p80_ms and r.rounds == 3
        assert r.speedup_p20 <= r.speedup <= r.speedup_p80 and r.mem_mb >= 0
        assert r.tokens in (64, 128) and r.dims[0] == 2
        if r.impl == "eager":
            assert r.speedup == 1.0
        if r.impl.startswith("kernel["):
            assert r.mode == "forward"
    assert len(result.groups) == 2 * 3 + 2  # (op, size, mode)
    for group in result.groups:
        impls = {r.impl for r in result.rows if (r.op, r.size, r.mode) == (group["op"], group["size"], group["mode"])}
        assert group["rounds"] == 3 and all(sorted(o) == sorted(impls) for o in group["order"])
    # the eager chain saves tensors for its backward, the fused op only its inputs
    fwd = {r.impl: r.mem_mb for r in result.rows if (r.op, r.mode, r.tokens) == ("gaussian_logprob", "forward", 128)}
    assert fwd["eager"] > 2 * fwd["margrpo[torch]"] > 0


def test_cpu_memory_counts_created_tensors_not_inputs():
    x = torch.randn(1024)
    assert memory.call_mb(timing.Timed(lambda: x.view(32, 32)), CPU, x) == 0.0
    assert memory.call_mb(timing.Timed(lambda: torch.ones(2**18)), CPU) == pytest.approx(1.0)  # 1 MiB of float32
    assert "lower bound" in memory.method(CPU) and "max_memory_allocated" in memory.method(torch.device("cuda"))


def test_token_sweep_checks_its_sizes():
    assert [s.dims for s in bench_ops.token_sweep((256, 4096), k=3)] == [(3, 1, 256, 16), (3, 4, 1024, 16)]
    with pytest.raises(ValueError, match="tokens"):
        bench_ops.token_sweep((1500,))
    with pytest.raises(ValueError, match="k"):
        bench_ops.token_sweep((64,), k=1)


def test_cli_quick_writes_table_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "ops.json", tmp_path / "ops.png"
    assert (
        bench_ops.main(["--quick", "--device", "cpu", "--ops", "grpo_surrogate", "--tokens", "64", "--json", str(out), "--plot", str(png)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "load average (1/5/15 min)" in printed and "torch " in printed and "memory: " in printed
    assert "| grpo_surrogate | backward | 64 tokens" in printed
    data = json.loads(out.read_text())
    machine = data["machine"]
    for key in ("torch", "triton", "margrpo", "python", "cpu", "load_average"):
        assert key in machine
    assert "load_average_end" in data and "memory" in data and "speedup" in data
    assert {r["mode"] for r in data["rows"]} == set(bench_ops.MODES)
    assert all(g["rounds"] == 5 and len(g["order"]) == 5 for g in data["groups"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _table(printed: str, first_column: str) -> list[list[str]]:
    """The whitespace-split lines of a suite's stdout table, from its column line on (below the header)."""
    lines = printed.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    return [line.split() for line in lines[start:]]


def _assert_header(printed: str, machine: dict) -> None:
    assert "load average (1/5/15 min)" in printed and f"torch {machine['torch']}" in printed
    for key in ("torch", "triton", "margrpo", "python", "cpu", "cpu_count", "torch_threads", "load_average"):
        assert key in machine


def test_rollout_report_structure(tmp_path, capsys):
    from margrpo.bench import rollout as bench_rollout

    out = tmp_path / "rollout.json"
    assert (
        bench_rollout.main(
            [
                "--models",
                "tiny",
                "--paths",
                "fused,reference",
                "--batch",
                "1",
                "--mask-steps",
                "2",
                "--diffusion-steps",
                "2",
                "--repeats",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    _assert_header(printed, data["machine"])
    assert "memory" in data and "load_average_end" in data
    assert [r[:2] for r in _table(printed, "model")[1:]] == [["tiny", "fused"], ["tiny", "reference"]]
    for r in data["rows"]:
        assert r["min_ms"] <= r["p20_ms"] <= r["p50_ms"] <= r["p80_ms"] and r["rounds"] == 3
        assert r["ms"] == r["p50_ms"] and r["images_per_s"] == pytest.approx(1e3 / r["p50_ms"])
        assert r["speedup_p20"] <= r["speedup_vs_reference"] <= r["speedup_p80"] and r["mem_mb"] > 0
    reference = next(r for r in data["rows"] if r["path"] == "reference")
    assert reference["speedup_vs_reference"] == 1.0  # each round's reference against itself: paired
    (group,) = data["groups"]
    assert group["rounds"] == 3 and all(sorted(o) == ["fused", "reference"] for o in group["order"])


def test_rewards_report_pairs_remote_with_local(tmp_path, capsys):
    from margrpo.bench import rewards as bench_rewards

    assert bench_rewards.measured_together(["remote:hps", "jpeg_compressibility", "shapes", "remote:jpeg_compressibility"]) == [
        ("remote:hps",),
        ("jpeg_compressibility", "remote:jpeg_compressibility"),
        ("shapes",),
    ]
    out = tmp_path / "rewards.json"
    assert (
        bench_rewards.main(
            [
                "--device",
                "cpu",
                "--batch",
                "2",
                "--image-size",
                "32",
                "--repeats",
                "4",
                "--rewards",
                "jpeg_compressibility,remote:jpeg_compressibility,shapes",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    _assert_header(printed, data["machine"])
    assert [line[0] for line in _table(printed, "reward")[2:]] == ["jpeg_compressibility", "remote:jpeg_compressibility", "shapes"]
    rows = {r["reward"]: r for r in data["rows"]}
    for r in rows.values():
        assert r["min_ms"] <= r["p20_ms"] <= r["p50_ms"] <= r["p80_ms"] and r["rounds"] == 4 and r["mem_mb"] > 0
        assert r["median_ms"] == round(r["p50_ms"], 2)
    assert rows["jpeg_compressibility"]["vs_local"] == 1.0 and rows["shapes"]["vs_local"] is None
    remote = rows["remote:jpeg_compressibility"]
    assert remote["vs_local_p20"] <= remote["vs_local"] <= remote["vs_local_p80"]
    pair, alone = data["groups"]
    assert pair["rewards"] == ["jpeg_compressibility", "remote:jpeg_compressibility"] and alone["rewards"] == ["shapes"]
    assert all(sorted(o) == sorted(pair["rewards"]) for o in pair["order"]) and len(pair["order"]) == 4


def test_host_report_structure(tmp_path, capsys):
    pytest.importorskip("triton")  # the adaLN wrappers' Triton path, kernels stubbed
    from margrpo.bench import host as bench_host

    order: list[list[str]] = []
    rows = bench_host.adaln_overhead(tokens=8, width=16, calls=20, rounds=4, order=order)
    assert [r.primitive for r in rows] == ["ln_modulate", "gate_residual", "torch.empty"]
    for r in rows:
        assert 0 < r.min_us <= r.p20_us <= r.p50_us <= r.p80_us and r.rounds == 4 and r.us_per_call == r.p50_us
    assert len(order) == 4 and all(sorted(o) == sorted(r.primitive for r in rows) for o in order)
    out = tmp_path / "host.json"
    assert bench_host.main(["--sections", "heads", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    _assert_header(capsys.readouterr().out, data["machine"])
    assert {"adaln", "launches", "adaln_order"} <= set(data) and len(data["adaln_order"]) == data["adaln"][0]["rounds"]

"""margrpo.bench.nova_profile (one NOVA step by phase, after a warm-up step, with a kernel trace) and
margrpo.bench.kernel_profile (what a torch.profiler trace says: top kernels, launches, device busy)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from margrpo.bench import kernel_profile, nova_profile

CUDA_KERNEL = torch.autograd.DeviceType.CUDA
HOST = torch.autograd.DeviceType.CPU


def test_profile_of_a_tiny_step_both_paths_after_a_warm_up(tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["--preset", "nova-tiny", "--dtype", "float32", "--mask-steps", "4", "--record-mask-steps", "2"]
    argv += ["--record-diffusion-steps", "2", "--diffusion-steps", "4", "--num-seeds", "2", "--paths", "fused,reference"]
    argv += ["--warmup-mask-steps", "3", "--kernels", "5", "--json", str(out)]
    assert nova_profile.main(argv) == 0
    report = json.loads(out.read_text())
    for path in ("fused", "reference"):
        result = report["paths"][path]
        phases = {row["phase"]: row for row in result["rows"]}
        assert {"rollout backbone", "rollout head", "likelihood head (grad)", "backward", "optimizer"} <= set(phases)
        assert result["warmup_s"] > 0
        assert result["compiles_while_profiled"] == {"triton": 0, "graphs": 0, "kernels": []}
        kernels = result["kernels"]
        assert kernels["what"] == "ATen operators by own CPU time" and kernels["launches"] is None
        assert "device_busy_fraction" not in kernels  # no device on a CPU
        top = kernels["top"]
        assert len(top) == 5 and all(row["name"].startswith("aten::") and row["calls"] >= 1 for row in top)
        assert [row["ms"] for row in top] == sorted((row["ms"] for row in top), reverse=True) and top[0]["ms"] > 0
        assert 0 < sum(row["share"] for row in top) <= 1 + 1e-9
        # the traced step (one more, uninstrumented): its operators' own time is within its wall time
        assert 0 < kernels["measured_ms"] <= 1e3 * kernels["wall_s"] * 1.05
        assert kernels["compiles"] == {"triton": 0, "graphs": 0, "kernels": []}
    assert "fused: ATen operators by own CPU time" in capsys.readouterr().out


def test_profile_rejects_a_warm_up_without_a_recorded_step():
    with pytest.raises(SystemExit):
        nova_profile.main(["--preset", "nova-tiny", "--warmup-mask-steps", "2"])


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert kernel_profile.busy_us([]) == 0
    assert kernel_profile.busy_us([(0, 10), (5, 12), (20, 25), (21, 22), (30, 30)]) == 12 + 5
    assert kernel_profile.busy_us([(40, 50), (0, 100)]) == 100


def _event(name, start, end, device=CUDA_KERNEL):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), self_cpu_time_total=0)


def test_gpu_summary_ranks_kernels_and_measures_the_idle_device():
    """A 10 ms step whose kernels cover 4 ms: the device was busy 40% (the host kept it waiting)."""
    events = [
        _event("cudaLaunchKernel", 0, 5, HOST),
        _event("cudaLaunchKernel", 10, 15, HOST),
        _event("cudaLaunchKernelExC", 20, 25, HOST),
        _event("aten::mm", 0, 30, HOST),
        _event("gemm", 100, 2100),
        _event("gemm", 5000, 6000),
        _event("layernorm", 5500, 6500),  # overlaps the second gemm (another stream)
        _event("elementwise", 9000, 9500),
    ]
    summary = kernel_profile.summarize(events, wall_s=0.010, device=torch.device("cuda"), top=2)
    assert summary["launches"] == 3 and summary["calls"] == 4 and summary["distinct"] == 3
    assert [(row["name"], row["calls"]) for row in summary["top"]] == [("gemm", 2), ("layernorm", 1)]
    assert summary["top"][0]["ms"] == pytest.approx(3.0) and summary["top"][0]["share"] == pytest.approx(3.0 / 4.5)
    assert summary["device_busy_s"] == pytest.approx(0.004) and summary["device_busy_fraction"] == pytest.approx(0.4)
    text = kernel_profile.format_summary(summary)
    assert "device busy 0.004 s of the step's 0.010 s (40%), 3 launches" in text and "| gemm | 2 | 3.00 | 66.7% |" in text


def test_cpu_summary_counts_own_time_of_aten_operators_only():
    events = [
        SimpleNamespace(name="aten::addmm", device_type=HOST, time_range=None, self_cpu_time_total=300),
        SimpleNamespace(name="aten::addmm", device_type=HOST, time_range=None, self_cpu_time_total=100),
        SimpleNamespace(name="aten::relu", device_type=HOST, time_range=None, self_cpu_time_total=100),
        SimpleNamespace(name="my_python_range", device_type=HOST, time_range=None, self_cpu_time_total=900),
    ]
    summary = kernel_profile.summarize(events, wall_s=0.001, device=torch.device("cpu"))
    assert summary["top"] == [
        {"name": "aten::addmm", "calls": 2, "ms": pytest.approx(0.4), "share": pytest.approx(0.8)},
        {"name": "aten::relu", "calls": 1, "ms": pytest.approx(0.1), "share": pytest.approx(0.2)},
    ]
    assert summary["launches"] is None and "device_busy_s" not in summary

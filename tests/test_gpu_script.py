"""The GPU script must be ready even when no GPU is lent: its shell parses, its summary reads the
benchmarks' JSON layout."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_parses():
    result = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu" / "run.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_summary_tables(tmp_path):
    (tmp_path / "status.txt").write_text("bench_ops rc=0 seconds=3\n")
    rows = [{"op": "gaussian_logprob", "shape": [10, 4, 1024, 16], "impl": "triton", "ms": 0.0123, "speedup": 7.5}]
    (tmp_path / "ops.json").write_text(json.dumps({"machine": "H200", "rows": rows}))
    (tmp_path / "broken.json").write_text("{")
    out = subprocess.run(["python", str(ROOT / "benchmarks" / "gpu" / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "bench_ops rc=0" in out
    assert "| gaussian_logprob | 10x4x1024x16 | triton | 0.0123 | 7.5 |" in out
    assert "broken.json: unreadable" in out

"""The GPU script must be ready even when no GPU is lent: its shell parses, its summary reads the
benchmarks' JSON layout."""
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_scripts_parse():
    for script in ("run.sh", "fetch_wheels.sh"):
        result = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu" / script)], capture_output=True, text=True)
        assert result.returncode == 0, (script, result.stderr)


def _limits() -> dict[str, int]:
    text = (ROOT / "benchmarks" / "gpu" / "run.sh").read_text()
    table = re.search(r"declare -A LIMIT=\((.*)\)", text).group(1)
    return {name: int(seconds) for name, seconds in re.findall(r"\[(\w+)\]=(\d+)", table)}


def test_phases_fit_a_15_minute_machine():
    """Every phase under 4 minutes; the two documented commands under 8 minutes together (the second
    command's setup finds the first one's build: 10 s)."""
    limits = _limits()
    text = (ROOT / "benchmarks" / "gpu" / "run.sh").read_text()
    assert set(limits) == {"setup", "kernels", "ops", "denoise", "rollout", "step", "rewards"}
    assert all(seconds < 240 for seconds in limits.values()), limits
    commands = re.findall(r"#   bash benchmarks/gpu/run.sh OUT (.*?)\s+#", text)
    assert len(commands) == 2 and sorted(sum((c.split() for c in commands), [])) == sorted([*limits, "setup"])
    first = sum(limits[p] for p in commands[0].split())
    second = sum(limits[p] for p in commands[1].split() if p != "setup") + 10
    assert first < 300 and second < 300 and first + second <= 480, (first, second)


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

"""The kernel tests' results per op x backend x dtype: a pytest plugin records them, a table reads them.

Recording: `MARGRPO_KERNEL_RESULTS=FILE python -m pytest -p kernel_results ...` (this folder on
PYTHONPATH) appends one JSON line per test as it starts and as it ends, flushed at once, so a run
that crashes keeps every line before the crash, and the test that took it down is the one that
started and never ended. Each line names the test's op (its `op` parameter, else its function or file name), backend (its
`backend` fixture's parameter; else triton for test_triton_kernels.py, cpp or cuda for
test_extension.py's CPU and CUDA tests) and dtype (a torch.dtype among its parameters).

Table: `python benchmarks/gpu/kernel_results.py FILE [CRASHES]` prints a markdown table of passed /
failed / skipped / crashed tests per op x backend x dtype; CRASHES is run.sh's kernels_crashes.txt
(a test that started and never ended is "crashed" when listed there, else "unfinished": a time limit).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

ENV = "MARGRPO_KERNEL_RESULTS"
# substrings of a test's function (then file) name -> the op it checks
OPS = (
    ("gaussian_logprob", "gaussian_logprob"),
    ("trajectory_std", "trajectory_std"),
    ("topk", "topk"),
    ("consistency", "consistency_mask"),
    ("grpo", "grpo_surrogate"),
    ("ln_modulate", "adaln"),
    ("gate_residual", "adaln"),
    ("adaln", "adaln"),
    ("errors_name", "error paths"),
)
OUTCOMES = ("passed", "failed", "skipped", "crashed", "unfinished")


def classify(path: str, function: str, params: dict[str, object]) -> dict[str, str]:
    """op, backend and dtype of a test, from its file, function name and parameters."""
    name = Path(path).stem
    named = [str(params["op"])] if isinstance(params.get("op"), str) else []  # a test parametrized by op
    op = next((o for text in (*named, function, name) for key, o in OPS if key in text), "other")
    backend = params.get("backend")
    if not isinstance(backend, str):
        if name == "test_triton_kernels":
            backend = "triton"
        elif name == "test_extension":
            backend = "cuda" if "cuda" in function else "cpp"
        else:
            backend = "-"
    dtype = next((str(v).replace("torch.", "") for v in params.values() if type(v).__name__ == "dtype"), "-")
    return {"op": op, "backend": backend, "dtype": dtype}


# ------------------------------------------------------------------ the pytest plugin
def _write(record: dict) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())  # the next test may take the process down


def _params(item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _classified(item) -> dict[str, str]:
    path, _, function = item.nodeid.partition("::")
    return classify(path, function.split("[")[0], _params(item))


def pytest_runtest_setup(item):
    _write({"nodeid": item.nodeid, "event": "start", **_classified(item)})


def pytest_runtest_makereport(item, call):
    # outcome per phase: a failed or skipped setup, the call, a failed teardown
    if call.when == "call" or call.excinfo is not None:
        import pytest

        skipped = call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception)
        outcome = "skipped" if skipped else ("failed" if call.excinfo is not None else "passed")
        _write({"nodeid": item.nodeid, "event": call.when, "outcome": outcome, **_classified(item)})


# ------------------------------------------------------------------ the table
def outcomes(lines: list[str], crashed: set[str]) -> dict[str, dict]:
    """nodeid -> its classification and final outcome (the last run of a test counts: run.sh reruns
    a file after a crash)."""
    tests: dict[str, dict] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        nodeid = record.get("nodeid")
        if record.get("event") == "start":
            tests[nodeid] = {k: record.get(k, "-") for k in ("op", "backend", "dtype")} | {"outcome": None}
        elif nodeid in tests and tests[nodeid]["outcome"] in (None, "passed"):
            # a setup failure or skip decides; a teardown failure overrides a passed call
            tests[nodeid].update({k: record[k] for k in ("op", "backend", "dtype", "outcome")})
    for nodeid, test in tests.items():
        if test["outcome"] is None:
            test["outcome"] = "crashed" if nodeid in crashed else "unfinished"
    return tests


def table(tests: dict[str, dict]) -> str:
    counts: dict[tuple[str, str, str], Counter] = defaultdict(Counter)
    for test in tests.values():
        counts[(test["op"], test["backend"], test["dtype"])][test["outcome"]] += 1
    lines = ["| op | backend | dtype | " + " | ".join(OUTCOMES) + " | verdict |", "|---|---|---|" + "---:|" * len(OUTCOMES) + "---|"]
    for key in sorted(counts):
        c = counts[key]
        bad = c["failed"] + c["crashed"] + c["unfinished"]
        verdict = "FAIL" if bad else ("pass" if c["passed"] else "not run")
        lines.append("| " + " | ".join(key) + " | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {verdict} |")
    return "\n".join(lines)


def crashed_ids(crashes: Path | None) -> set[str]:
    """Node ids in run.sh's kernels_crashes.txt lines `CRASHED <nodeid> (exit N) ...`."""
    if crashes is None or not crashes.exists():
        return set()
    return {line.split()[1] for line in crashes.read_text().splitlines() if line.startswith("CRASHED ")}


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: kernel_results.py RESULTS.jsonl [kernels_crashes.txt]  ({__doc__.splitlines()[0]})", file=sys.stderr)
        return 2
    path = Path(argv[0])
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    tests = outcomes(lines, crashed_ids(Path(argv[1]) if len(argv) > 1 else None))
    if not tests:
        print(f"kernel results: no test recorded in {path}")
        return 1
    print(table(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

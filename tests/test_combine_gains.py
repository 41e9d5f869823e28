"""benchmarks/combine_gains.py: pooling `margrpo diagnose --gains` reports over rollouts."""

from __future__ import annotations

import pytest
from conftest import load_script

from margrpo.train.diagnostics import DirectionGains, gains_table


@pytest.fixture(scope="module")
def combine():
    return load_script("benchmarks/combine_gains.py", "combine_gains")


def _report(gains: dict[str, list[float]], eta=1e-4, direction="sign") -> str:
    return gains_table([DirectionGains(name, eta, direction, values) for name, values in gains.items()])


def test_pooled_report_is_the_report_of_the_concatenated_rollouts(combine, tmp_path):
    first = {"transition": [0.02, 0.04, -0.01], "matching D=4": [0.0, 0.01, 0.03], "only here": [1.0, 1.0, 1.0]}
    second = {"transition": [0.05, 0.0, 0.01, 0.02], "matching D=4": [-0.02, 0.0, 0.01, 0.04]}
    parsed = combine.parse_report(_report(first))
    assert parsed[0] == 1e-4 and parsed[1] == "sign" and parsed[2]["matching D=4"] == [0.0, 0.01, 0.03]
    pooled = combine.pool([parsed, combine.parse_report(_report(second))])
    assert [r.variant for r in pooled] == ["transition", "matching D=4"]  # only variants in every report
    assert pooled[0].gains == first["transition"] + second["transition"]
    expected = _report({name: first[name] + second[name] for name in ("transition", "matching D=4")})
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text(_report(first))
    paths[1].write_text(_report(second))
    assert combine.main([str(p) for p in paths] + ["--plot", str(tmp_path / "gains.png")]) == 0
    assert (tmp_path / "gains.png").stat().st_size > 0
    assert gains_table(pooled) == expected


def test_reports_of_other_step_sizes_or_other_text_are_refused(combine):
    base = combine.parse_report(_report({"a": [0.1, 0.2, 0.3]}))
    other = combine.parse_report(_report({"a": [0.1, 0.2, 0.3]}, eta=1e-3))
    with pytest.raises(ValueError, match="reports differ"):
        combine.pool([base, other])
    with pytest.raises(ValueError, match="not a `margrpo diagnose --gains` report"):
        combine.parse_report("held-out gain +0.1")

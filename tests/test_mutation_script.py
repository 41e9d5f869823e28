"""scripts/mutation_test.py itself (not its mutants): every mutant applies to exactly one place of the
current tree and changes exactly one line, the list holds issue 19's survivors, and a run on a toy
repository classifies caught, survived and equivalent mutants and scores them."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutation_test", ROOT / "scripts" / "mutation_test.py")
mt = importlib.util.module_from_spec(spec)
sys.modules["mutation_test"] = mt  # dataclasses look their module up while the class is built
spec.loader.exec_module(mt)

ISSUE_19_SURVIVORS = ("mte_least_uncertain", "consistency_and_committed", "consistency_reversed",
                      "kl_shrunk_by_transitions", "k3_no_gradient", "sample_mean_not_normalised",
                      "lr_scheduler_not_stepped", "grad_clip_disabled", "head_low_lr_ignored", "same_noise_every_step")


def test_every_mutant_applies_exactly_once_and_changes_one_line():
    assert mt.check(mt.MUTANTS, ROOT) == []
    for m in mt.MUTANTS:
        text = (ROOT / m.file).read_text()
        assert text.count(m.original) == 1, m.name
        mutated = mt.apply(m, text)
        assert mutated != text and len(mutated.splitlines()) == len(text.splitlines())
        differ = [i for i, (a, b) in enumerate(zip(text.splitlines(), mutated.splitlines())) if a != b]
        assert len(differ) == 1, m.name


def test_the_list_covers_issue_19_and_its_modules():
    names = [m.name for m in mt.MUTANTS]
    assert len(names) == len(set(names))
    assert set(ISSUE_19_SURVIVORS) <= set(names)
    assert all(m.equivalent is None for m in mt.MUTANTS if m.name in ISSUE_19_SURVIVORS)
    files = {m.file for m in mt.MUTANTS}
    for module in ("grpo/advantages.py", "grpo/kl.py", "grpo/objective.py", "grpo/policy_update.py", "grpo/selection.py",
                   "rollout/plan.py", "rollout/generate.py", "rollout/likelihood.py", "train/trainer.py", "ops/reference.py"):
        assert f"margrpo/{module}" in files
    assert sum(m.equivalent is None for m in mt.MUTANTS) >= 30
    assert all(m.equivalent.strip() for m in mt.MUTANTS if m.equivalent is not None)


def test_a_broken_entry_is_reported_not_skipped():
    text = "a = 1\nb = 2\nb = 2\n"
    with pytest.raises(mt.MutationError, match="occurs 0 times"):
        mt.apply(mt.Mutant("x", "f.py", "c = 3", "c = 4", "", ("t",)), text)
    with pytest.raises(mt.MutationError, match="occurs 2 times"):
        mt.apply(mt.Mutant("x", "f.py", "b = 2", "b = 3", "", ("t",)), text)
    with pytest.raises(mt.MutationError, match="changes 2 lines"):
        mt.apply(mt.Mutant("x", "f.py", "a = 1\nb = 2\nb", "a = 0\nb = 0\nb", "", ("t",)), text)
    assert mt.apply(mt.Mutant("x", "f.py", "a = 1\nb", "a = 5\nb", "", ("t",)), text) == "a = 5\nb = 2\nb = 2\n"
    # a real entry that went stale (its text edited away) is a problem of the list
    stale = mt.Mutant("stale", "margrpo/grpo/kl.py", "this text is not there", "x", "", ("tests/test_grpo_math.py",))
    assert any("stale" in p and "occurs 0 times" in p for p in mt.check([stale], ROOT))


def test_a_run_on_a_toy_repository(tmp_path):
    """Caught, survived and equivalent mutants of a two-file repository, scored and reported; the
    toy's working tree is left as it was."""
    (tmp_path / "pkg").mkdir()
    source = "def double(x):\n    return 2 * x\n\n\ndef half(x):\n    return x / 2\n"
    (tmp_path / "pkg" / "__init__.py").write_text(source)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pkg.py").write_text("from pkg import double\n\n\ndef test_double():\n"
                                                    "    assert double(3) == 6\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    mutants = [
        mt.Mutant("double_plus", "pkg/__init__.py", "2 * x", "2 + x", "", ("tests/test_pkg.py",)),
        mt.Mutant("half_untested", "pkg/__init__.py", "x / 2", "x * 2", "", ("tests/test_pkg.py",)),
        mt.Mutant("double_commuted", "pkg/__init__.py", "2 * x", "x * 2", "", ("tests/test_pkg.py",),
                  equivalent="multiplication commutes"),
    ]
    assert mt.check(mutants, tmp_path) == []
    files = mt.tree_files(tmp_path)
    assert files == ["pkg/__init__.py", "tests/test_pkg.py"]
    results = [mt.run_mutant(m, tmp_path, files, 600, sys.executable) for m in mutants]
    assert [r.status for r in results] == ["caught", "survived", "survived"]
    assert results[0].caught_by == "tests/test_pkg.py::test_double"
    assert mt.score(results) == (1, 2)
    assert (tmp_path / "pkg" / "__init__.py").read_text() == source
    text = mt.report(results, machine="toy", total_seconds=1.0, baseline_seconds=0.5, command="x")
    assert "score: 1 / 2 non-equivalent mutants caught" in text
    assert "| double_commuted | pkg/__init__.py |  | survived (equivalent) |" in text
    assert "multiplication commutes" in text and "- **half_untested**: survived" in text
    assert mt.baseline(mutants, tmp_path, files, 600, sys.executable, package="pkg")[0]

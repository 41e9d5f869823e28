"""scripts/mutation_test.py itself (not its mutants): entries anchored by function apply to exactly one
place and change one line, broken entries are reported, the list holds issue 19's survivors, and a
run on a toy repository classifies caught, survived, equivalent and control mutants, imports the
mutated copy even where conftest strips the copy's root and an unmutated install is on the path,
and scores them.

The list is not checked against the current source here: `python scripts/mutation_test.py --check`
does that (and every run does it first), so editing a mutated line never fails CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
mt = load_script("scripts/mutation_test.py", "mutation_test")

ISSUE_19_SURVIVORS = (
    "mte_least_uncertain",
    "consistency_and_committed",
    "consistency_reversed",
    "kl_shrunk_by_transitions",
    "k3_no_gradient",
    "sample_mean_not_normalised",
    "lr_scheduler_not_stepped",
    "grad_clip_disabled",
    "head_low_lr_ignored",
    "same_noise_every_step",
)

SOURCE = """def double(x):
    return 2 * x


class Box:
    def double(self, x):
        return 2 * x

    def half(self, x):
        def inner(y):
            return y / 2
        return inner(x)
"""


def test_the_list_covers_issue_19_and_its_modules():
    names = [m.name for m in mt.MUTANTS]
    assert len(names) == len(set(names)) and mt.SENTINEL.name not in names
    assert set(ISSUE_19_SURVIVORS) <= set(names)
    assert all(m.equivalent is None for m in mt.MUTANTS if m.name in ISSUE_19_SURVIVORS)
    files = {m.path for m in mt.MUTANTS}
    for module in (
        "grpo/advantages.py",
        "grpo/kl.py",
        "grpo/objective.py",
        "grpo/policy_update.py",
        "grpo/selection.py",
        "rollout/plan.py",
        "rollout/generate.py",
        "rollout/likelihood.py",
        "train/trainer.py",
        "ops/oracle.py",
    ):
        assert f"margrpo/{module}" in files
    assert sum(m.equivalent is None for m in mt.MUTANTS) >= 30
    assert all(m.equivalent.strip() for m in mt.MUTANTS if m.equivalent is not None)
    # every entry is anchored by a function, and none is a control
    assert all(m.function and m.expect_output is None for m in mt.MUTANTS)


def test_the_sentinel_raises_at_import_and_does_nothing_else():
    s = mt.SENTINEL
    assert s.path == "margrpo/__init__.py" and s.function is None and s.expect_output
    text = "x = 1\n__version__ = '9'\n"
    mutated = mt.apply(s, text)
    with pytest.raises(AssertionError, match=s.expect_output):
        exec(compile(mutated, "margrpo/__init__.py", "exec"), {})
    assert mutated.replace(s.replacement, s.original) == text


def test_an_anchor_confines_the_original_to_its_function():
    m = lambda where, original, new="3 * x": mt.Mutant("m", where, original, new, "", ("t",))  # noqa: E731
    # "return 2 * x" occurs twice in the file, once in each function
    assert mt.apply(m("f.py::Box.double", "2 * x"), SOURCE).splitlines()[6] == "        return 3 * x"
    assert mt.apply(m("f.py::double", "2 * x"), SOURCE).splitlines()[1] == "    return 3 * x"
    assert "y * 2" in mt.apply(m("f.py::Box.half.inner", "y / 2", "y * 2"), SOURCE)
    with pytest.raises(mt.MutationError, match="occurs 2 times in f.py, expected exactly once"):
        mt.apply(m("f.py", "2 * x"), SOURCE)  # module level: the whole file
    with pytest.raises(mt.MutationError, match="occurs 0 times in f.py::Box.half"):
        mt.apply(m("f.py::Box.half", "2 * x"), SOURCE)
    with pytest.raises(mt.MutationError, match="Box.triple is defined 0 times"):
        mt.apply(m("f.py::Box.triple", "2 * x"), SOURCE)
    twice = "if a:\n    def f():\n        return 1\nelse:\n    def f():\n        return 2\n"
    with pytest.raises(mt.MutationError, match="f is defined 2 times"):
        mt.apply(m("g.py::f", "return 1", "return 0"), twice)
    # an edit elsewhere in the file (a new line above, the neighbours changed) leaves the entry valid
    edited = "import os\n\n" + SOURCE.replace("def half(self, x):", "def half(self, x, *extra):")
    assert "return 3 * x" in mt.apply(m("f.py::Box.double", "2 * x"), edited)


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
    stale = mt.Mutant("stale", "margrpo/grpo/kl.py::k3_logp", "this text is not there", "x", "", ("tests/test_grpo_math.py",))
    assert any("stale" in p and "occurs 0 times" in p for p in mt.check([stale], ROOT))


def _toy(tmp_path: Path) -> Path:
    """A git repository with package `pkg` whose conftest strips the root from sys.path (as
    tests/conftest.py does), and an unmutated copy of pkg "installed" on PYTHONPATH (as the editable
    install serves the checkout)."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    source = "VERSION = 1\n\n\ndef double(x):\n    return 2 * x\n\n\ndef half(x):\n    return x / 2\n"
    (repo / "pkg" / "__init__.py").write_text(source)
    (repo / "tests").mkdir()
    (repo / "tests" / "conftest.py").write_text(
        "import sys\nfrom pathlib import Path\n\n_ROOT = Path(__file__).resolve().parents[1]\n"
        "sys.path[:] = [p for p in sys.path if Path(p or '.').resolve() != _ROOT]\n"
    )
    (repo / "tests" / "test_pkg.py").write_text("from pkg import double\n\n\ndef test_double():\n    assert double(3) == 6\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    installed = tmp_path / "installed"
    (installed / "pkg").mkdir(parents=True)
    (installed / "pkg" / "__init__.py").write_text(source)
    return repo, installed


def test_a_run_on_a_toy_repository(tmp_path, monkeypatch):
    """Caught, survived, equivalent and control mutants of a toy repository, scored and reported; the
    toy's working tree is left as it was."""
    repo, installed = _toy(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(installed))
    source = (repo / "pkg" / "__init__.py").read_text()
    test = ("tests/test_pkg.py",)
    mutants = [
        mt.Mutant("double_plus", "pkg/__init__.py::double", "2 * x", "2 + x", "", test),
        mt.Mutant("half_untested", "pkg/__init__.py::half", "x / 2", "x * 2", "", test),
        mt.Mutant("double_commuted", "pkg/__init__.py::double", "2 * x", "x * 2", "", test, equivalent="multiplication commutes"),
    ]
    sentinel = mt.Mutant(
        "sentinel", "pkg/__init__.py", "VERSION = ", "raise AssertionError('SENTINEL'); VERSION = ", "", test, expect_output="SENTINEL"
    )
    assert mt.check([sentinel, *mutants], repo) == []
    files = mt.tree_files(repo)
    assert files == ["pkg/__init__.py", "tests/conftest.py", "tests/test_pkg.py"]
    run = [mt.run_mutant(m, repo, files, 600, sys.executable, package="pkg") for m in [sentinel, *mutants]]
    assert [r.status for r in run] == ["caught", "caught", "survived", "survived"]
    assert run[1].caught_by == "tests/test_pkg.py::test_double"
    assert mt.score(run) == (1, 2)  # the control and the equivalent mutant are not scored
    assert (repo / "pkg" / "__init__.py").read_text() == source
    text = mt.report(run, machine="toy", total_seconds=1.0, baseline_seconds=0.5, command="x")
    assert "score: 1 / 2 non-equivalent mutants caught" in text
    assert "control: sentinel (importing margrpo raises) was **caught**" in text
    assert "| double_commuted | pkg/__init__.py::double |  | survived (equivalent) |" in text
    assert "multiplication commutes" in text and "- **half_untested**: survived" in text
    assert mt.baseline(mutants, repo, files, 600, sys.executable, package="pkg")[0]


def test_a_control_is_caught_only_by_its_own_failure(tmp_path, monkeypatch):
    """A control whose tests fail for another reason is an error, and one whose tests pass survived;
    with the copy's root on PYTHONPATH (the old script) the installed copy would have been imported
    and the sentinel would survive."""
    repo, installed = _toy(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(installed))
    files = mt.tree_files(repo)
    test = ("tests/test_pkg.py",)
    other = mt.Mutant("other", "pkg/__init__.py::double", "2 * x", "2 + x", "", test, expect_output="SENTINEL")
    quiet = mt.Mutant("quiet", "pkg/__init__.py::half", "x / 2", "x * 2", "", test, expect_output="SENTINEL")
    assert mt.run_mutant(other, repo, files, 600, sys.executable, package="pkg").status == "error"
    assert mt.run_mutant(quiet, repo, files, 600, sys.executable, package="pkg").status == "survived"
    # the old way: the root on PYTHONPATH, stripped by conftest, so the unmutated install is imported
    sentinel = mt.Mutant(
        "s", "pkg/__init__.py", "VERSION = ", "raise AssertionError('SENTINEL'); VERSION = ", "", test, expect_output="SENTINEL"
    )
    with mt.mutated_copy(repo, files, sentinel, "pkg") as (tree, site):
        old_env = {**mt._env(site), "PYTHONPATH": f"{tree}:{installed}"}
        old = subprocess.run(
            [sys.executable, "-m", "pytest", *test, *mt.PYTEST_ARGS], cwd=tree, env=old_env, capture_output=True, text=True
        )
        assert old.returncode == 0  # what the 2026-12-04 run measured: nothing
        new = subprocess.run(
            [sys.executable, "-m", "pytest", *test, *mt.PYTEST_ARGS], cwd=tree, env=mt._env(site), capture_output=True, text=True
        )
        assert new.returncode != 0 and "SENTINEL" in new.stdout + new.stderr

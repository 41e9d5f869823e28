"""scripts/step_profile.py's counting, on toy callables (the trainer itself is the script's job): each
function once however often it runs, comprehensions left out, threads started meanwhile counted, the
hook removed afterwards even when the callable raises, and the split by file."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
step_profile = load_script("scripts/step_profile.py", "step_profile")


def _square(x):
    return x * x


class _Box:
    def total(self, values):
        return sum([_square(v) for v in values])  # a comprehension: not a function of its own


def _toy(n):
    box = _Box()
    scale = lambda v: 2 * v  # noqa: E731  (a lambda is counted)
    return scale(box.total(range(n))) + _square(n)


def _names(count):
    return {f.name for f in count.functions if f.file == __file__}


def test_counts_each_function_once_without_comprehensions():
    result, count = step_profile.count_calls(_toy, 3)
    assert result == 2 * (0 + 1 + 4) + 9
    assert _names(count) == {"_toy", "_Box.total", "_square", "_toy.<locals>.<lambda>"}
    assert sys.getprofile() is None


def test_more_calls_of_the_same_functions_count_the_same():
    _, once = step_profile.count_calls(_toy, 1)
    _, many = step_profile.count_calls(_toy, 50)
    assert _names(once) == _names(many)


def test_threads_started_during_the_call_are_counted():
    def run_in_thread():
        worker = threading.Thread(target=_square, args=(2,))
        worker.start()
        worker.join()

    _, count = step_profile.count_calls(run_in_thread)
    assert "_square" in _names(count)


def test_the_hook_is_removed_when_the_callable_raises():
    def fail():
        _square(1)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        step_profile.count_calls(fail)
    assert sys.getprofile() is None
    _, count = step_profile.count_calls(_square, 1)  # and counting still works afterwards
    assert _names(count) == {"_square"}


def test_where_and_files_split_by_source_file():
    _, count = step_profile.count_calls(_toy, 2)
    here = count.where(step_profile.under([Path(__file__).resolve().parent]))
    assert here.files == {__file__: 4}
    assert len(here.functions) == 4
    assert count.where(lambda file: False).functions == frozenset()

#!/usr/bin/env python
"""How much code one GRPO step runs: distinct functions and source files (issue 28).

A profile hook (sys.setprofile, and threading.setprofile for threads started meanwhile) records the
code object of every Python call while one phase runs; a function is counted once however often it
runs. Two phases are measured apart:

  startup  building the Trainer from the config (config, model, reward, optimizer; imports done first)
  step     one Trainer.train_step() (prompts, rollout, reward, advantages, update, optimizer step)

Counted: named functions, methods and lambdas. Not counted: comprehensions and generator expressions
(their own code objects in Python 3.11, inlined in 3.12) and module bodies (imports), so the count
does not depend on the interpreter version or on what was imported before. C functions (torch's
kernels, builtins) are not Python calls and never appear. "margrpo" means a file of the margrpo
package, its Triton kernels included; "all" adds torch, the standard library and everything else.

    nice -n 19 .venv/bin/python scripts/step_profile.py                 # the preset, as shipped
    nice -n 19 .venv/bin/python scripts/step_profile.py --warmup 1      # the second step (no lazy setup)
    nice -n 19 .venv/bin/python scripts/step_profile.py grpo.prompts_per_step=2 grpo.group_size=4

The run directory is a temporary one and run.threads is 1; further key=value overrides follow the
config. The counts are of code paths, so they do not depend on the machine; smaller batches take the
same paths (the overrides are printed with the counts all the same).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOT_FUNCTIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<module>")


@dataclass(frozen=True)
class Function:
    file: str
    line: int
    name: str  # the qualified name: Class.method, outer.<locals>.inner

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.name}"


@dataclass
class CallCount:
    """The distinct functions one phase ran."""

    functions: frozenset[Function]

    def where(self, keep: Callable[[str], bool]) -> CallCount:
        return CallCount(frozenset(f for f in self.functions if keep(f.file)))

    @property
    def files(self) -> Counter[str]:
        """Distinct functions per source file."""
        return Counter(f.file for f in self.functions)


def count_calls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, CallCount]:
    """(fn(*args, **kwargs), the distinct Python functions it called, fn itself included)."""
    codes = set()
    recording = True

    def hook(frame, event, arg):
        # a thread started during the phase keeps this hook after it: `recording` stops its count
        if recording and event == "call":  # a generator's resumption is a call too; the set keeps one
            codes.add(frame.f_code)

    previous = sys.getprofile()
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        result = fn(*args, **kwargs)
    finally:
        recording = False
        sys.setprofile(previous)
        threading.setprofile(None)  # None removes the hook
    # co_qualname (Class.method) is Python 3.11+; 3.10 has the bare name only
    functions = frozenset(
        Function(code.co_filename, code.co_firstlineno, getattr(code, "co_qualname", code.co_name))
        for code in codes
        if code.co_name not in NOT_FUNCTIONS
    )
    return result, CallCount(functions)


def margrpo_roots() -> list[Path]:
    """The folders whose files are margrpo's: the package, and its kernels' folder in a checkout."""
    import margrpo
    import margrpo.kernels

    return [Path(margrpo.__file__).resolve().parent] + [Path(p).resolve() for p in margrpo.kernels.__path__]


def under(roots: list[Path]) -> Callable[[str], bool]:
    def keep(file: str) -> bool:
        path = Path(file).resolve()
        return any(path.is_relative_to(root) for root in roots)

    return keep


def short(file: str) -> str:
    path = Path(file).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else file


def report(phase: str, count: CallCount, roots: list[Path], top: int) -> list[str]:
    ours = count.where(under(roots))
    lines = [
        f"{phase}: margrpo {len(ours.functions)} functions in {len(ours.files)} files; "
        f"all {len(count.functions)} functions in {len(count.files)} files"
    ]
    for file, n in ours.files.most_common(top):
        lines.append(f"  {n:4d}  {short(file)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (after the script's own)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes-tiny.yaml"))
    parser.add_argument("--warmup", type=int, default=0, help="unprofiled steps before the profiled one")
    parser.add_argument("--top", type=int, default=15, help="files listed per phase")
    parser.add_argument("--list", action="store_true", help="also list every margrpo function of the step")
    args = parser.parse_args(argv)

    from margrpo.train.trainer import Trainer

    roots = margrpo_roots()
    with tempfile.TemporaryDirectory() as out_dir:
        overrides = [f"run.out_dir={out_dir}", "run.threads=1", *args.overrides]
        print(f"config {args.config}, overrides run.out_dir=TEMP {' '.join(overrides[1:])}, warmup {args.warmup}")
        trainer, startup = count_calls(Trainer.from_files, args.config, overrides)
        for _ in range(args.warmup):
            trainer.train_step()
            trainer.step += 1  # as Trainer.run does after each step
        _, step = count_calls(trainer.train_step)
        if trainer.logger is not None:
            trainer.logger.close()
    print("\n".join(report("startup", startup, roots, args.top)))
    print("\n".join(report("step", step, roots, args.top)))
    if args.list:
        for function in sorted(step.where(under(roots)).functions, key=lambda f: (short(f.file), f.line)):
            print(f"  {short(function.file)}:{function.line} {function.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

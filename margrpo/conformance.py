"""Checking an object against a typing.Protocol beyond what isinstance sees: every member present,
and every method's parameters named and ordered as the protocol's (extra trailing optional
parameters allowed). Used by the tests of margrpo's heads and backbones, and useful for your own.
"""

from __future__ import annotations

import inspect
import typing


def _members(protocol: type) -> dict[str, object]:
    names = set()
    for klass in protocol.__mro__:
        if klass is object or klass is typing.Protocol or klass is typing.Generic:
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")} | set(getattr(klass, "__annotations__", {}))
    return {n: getattr(protocol, n, None) for n in sorted(names)}


def protocol_mismatches(obj: object, protocol: type) -> list[str]:
    """What keeps `obj` from implementing `protocol`, one line per problem ([] when it conforms)."""
    problems = []
    for name, spec in _members(protocol).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if not callable(spec):
            continue
        impl = getattr(obj, name)
        if not callable(impl):
            problems.append(f"{name}: got {type(impl).__name__}, expected a method")
            continue
        wanted = [p for p in inspect.signature(spec).parameters.values() if p.name != "self"]
        given = list(inspect.signature(impl).parameters.values())
        names = [p.name for p in given[: len(wanted)]]
        if names != [p.name for p in wanted]:
            problems.append(
                f"{name}: got parameters ({', '.join(p.name for p in given)}), expected ({', '.join(p.name for p in wanted)}) first"
            )
            continue
        extra = [
            p.name
            for p in given[len(wanted) :]
            if p.default is inspect.Parameter.empty and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        optional = [
            p.name for p, q in zip(given, wanted) if q.default is not inspect.Parameter.empty and p.default is inspect.Parameter.empty
        ]
        if extra:
            problems.append(f"{name}: extra required parameters {extra}")
        if optional:
            problems.append(f"{name}: parameters {optional} need a default, as in the protocol")
    return problems

"""Typed configuration: dataclasses filled from YAML mappings and `key=value` overrides.

An unknown key or a value of the wrong type is an error that names the key (with its dotted path)
and lists close matches, so a typo never silently falls back to a default. NaN is never a valid
number. A section's value rules are a table of `Rule`s that its dataclass checks when it is built
(`check_rules`), so an out-of-range value fails at load time too, naming its key. A relative input
path in a config file (INPUT_PATHS) is looked up beside the file first (load_config_file), so a
config works from any working directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value that does not fit the typed schema."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A file a configuration names (the config itself, a prompt file) does not exist."""


@dataclass(frozen=True)
class Rule:
    """The valid values of one key: `ok(value, root)` says whether `value` is one (`root`: the object
    being checked, for a key bounded by another) and `expected` says what they are, in the words of
    the error and of docs/CONFIG.md."""

    key: str  # dotted path from the checked object
    ok: Callable[[Any, Any], bool]
    expected: str


def lookup(root, key: str):
    """The value at a dotted key of nested dataclasses."""
    for name in key.split("."):
        root = getattr(root, name)
    return root


def check_rules(root, rules) -> None:
    """Raise ConfigError naming the first key of `rules` whose value in `root` breaks its rule."""
    for rule in rules:
        value = lookup(root, rule.key)
        if not rule.ok(value, root):
            raise ConfigError(f"{rule.key}: got {value!r}, expected {rule.expected}")


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _type_name(tp) -> str:
    """An annotation in the words of a config error."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(tp) if option is not type(None))
    if origin is typing.Literal:
        return " or ".join(repr(value) for value in typing.get_args(tp))
    if tp is bool:
        return "true or false"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, path: str):
    """Check `value` against the annotation `tp` (converting int -> float and YAML strings where safe)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{path}: got {value!r}, expected {_type_name(tp)}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{path}: got {value!r}, expected one of {choices}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: got {type(value).__name__} {value!r}, expected a mapping for {tp.__name__}")
        return from_dict(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: got {value!r}, expected a list")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis and len(value) != len(args):
            raise ConfigError(f"{path}: got {value!r}, expected a list of {len(args)} values")
        (item,) = args[:1] or (Any,)
        items = [_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: got {value!r}, expected a mapping")
        _, val_tp = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: got {value!r}, expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: got {value!r}, expected an integer")
    if tp is float:
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):  # YAML 1.1 reads 1e-5 as a string
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
        raise ConfigError(f"{path}: got {value!r}, expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: got {value!r}, expected a string")
    return value


def from_dict(cls: type[T], data: dict, path: str = "") -> T:
    """Build dataclass `cls` from a mapping, checking every key and value."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key {where!r}{hint}")
        kwargs[key] = _coerce(value, hints[key], where)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as err:
        message = str(err)
        if message.split(":", 1)[0].split(".")[0] in fields:  # a check that names its key: give the full path
            raise ConfigError(f"{path}.{message}" if path else message) from err
        raise ConfigError(f"{path or cls.__name__}: {message}") from err
    return obj


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'optim.lr=1e-5' -> (['optim', 'lr'], 1e-05); the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. optim.lr=1e-5)")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str):  # YAML reads '1e-5' as a string; numbers are what users mean
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set dotted keys in a nested mapping (a copy); unknown keys are caught later by from_dict."""
    import copy

    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {key!r} is not a section")
        node[keys[-1]] = value
    return data


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigFileNotFoundError(f"config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
    return data


# Keys whose values name files or directories to read. A relative one is resolved against the config
# file's directory when it exists there, else left relative to the working directory (where configs
# that name e.g. checkpoints/nova-d48w1024-sd512 from the repository root expect it). Output paths
# (run.out_dir, pretrain.out) always stay relative to the working directory, like any command's output.
INPUT_PATHS = ("backbone.checkpoint", "run.train_prompts", "run.eval_prompts")


def resolve_input_paths(data: dict, base: str | Path, keys: tuple[str, ...] = INPUT_PATHS) -> dict:
    """A copy of `data` whose relative paths at `keys` that exist under `base` are made absolute
    (`builtin:NAME` checkpoints, absolute paths and paths found only elsewhere are unchanged)."""
    import copy

    data = copy.deepcopy(data)
    base = Path(base)
    for key in keys:
        *sections, name = key.split(".")
        node = data
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        value = node.get(name) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value or ":" in value.split("/")[0] or Path(value).is_absolute():
            continue  # unset, builtin:NAME (or another scheme), or absolute
        beside = base / value
        if beside.exists() and not (Path(value).exists() and os.path.samefile(beside, value)):
            node[name] = os.path.abspath(beside)
    return data


def load_config_file(path: str | Path, overrides: list[str] = ()) -> dict:
    """The mapping of a YAML config file with its input paths resolved (resolve_input_paths) and then
    `overrides` applied (paths given on the command line stay relative to the working directory)."""
    data = resolve_input_paths(load_yaml(path), Path(path).parent)
    return apply_overrides(data, list(overrides))

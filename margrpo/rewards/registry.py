"""Rewards by name, as configs refer to them (`rewards: {hps: 1.0, shapes: 0.5}`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .base import Reward

R = TypeVar("R", bound=type[Reward])
_REWARDS: dict[str, type[Reward]] = {}


def register(name: str) -> Callable[[R], R]:
    """Class decorator: make a Reward subclass buildable by `name` (also sets its `name`)."""

    def add(cls: R) -> R:
        if name in _REWARDS and _REWARDS[name] is not cls:
            raise ValueError(f"register: reward name {name!r} is already taken by {_REWARDS[name].__name__}")
        cls.name = name
        _REWARDS[name] = cls
        return cls

    return add


def available_rewards() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REWARDS)


def reward_class(name: str) -> type[Reward]:
    """The class registered under `name`."""
    if name not in _REWARDS:
        raise KeyError(f"reward: unknown name {name!r}, expected one of {', '.join(available_rewards())}")
    return _REWARDS[name]


def reward_options(name: str) -> list[str]:
    """The keyword options the reward `name` accepts."""
    params = inspect.signature(reward_class(name).__init__).parameters
    return [p for p in params if p != "self" and params[p].kind is not inspect.Parameter.VAR_KEYWORD]


def build_reward(name: str, **options: Any) -> Reward:
    """Instantiate the reward `name` with its options; an unknown option is an error naming it."""
    cls = reward_class(name)
    accepted = reward_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"reward {name!r}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}")
    return cls(**options)

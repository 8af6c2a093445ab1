"""Resolving a registered ``"package.module:ClassName"`` target to its class, checked against
the base class its registry holds (the tier-policy and placement registries)."""

from __future__ import annotations

import importlib

__all__ = ["resolve_class"]


def resolve_class(target: str, base: type) -> type:
    """The class ``target`` names; a ``TypeError`` when it is not a subclass of ``base``.

    Typed ``type``: mypy takes no abstract class for a ``type[T]`` parameter, so each registry
    narrows the result to its base class."""
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{target} is not a {base.__name__}")
    return cls

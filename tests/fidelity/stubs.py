"""Stand-ins the child scripts that run MindSpeed-MM's own data code (`upstream_features.py`,
`upstream_dataset.py`) put in place of modules that cannot import on this machine. Imported by those scripts
as a sibling module (a script's folder is on its `sys.path`)."""

from __future__ import annotations

import types
from typing import Any


class Anything:
    """Stands in for any attribute of a stubbed module (never called on the code paths under test)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return Anything()

    def __getattr__(self, name: str) -> Anything:
        return Anything()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()


def matches(name: str, prefixes: tuple[str, ...]) -> bool:
    """`name` is one of the `prefixes` modules or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)

"""Stand-ins the child scripts that run MindSpeed-MM's own data code (`upstream_features.py`,
`upstream_dataset.py`) put in place of modules that cannot import on this machine. Imported by those scripts
as a sibling module (a script's folder is on its `sys.path`)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
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


class Missing(importlib.abc.MetaPathFinder):
    """Last on the path: a third-party module that a file under `roots` (MindSpeed-MM's or MindSpeed's) imports
    and this environment lacks is loaded by `loader` (a stub); its name is appended to `used`."""

    def __init__(self, roots: tuple[str, ...], loader: importlib.abc.Loader, used: list[str]) -> None:
        self.roots, self.loader, self.used = roots, loader, used

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in ("mindspeed_mm", "megatron", "mindspeed"):
            return None
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(self.roots):
            return None
        self.used.append(name)
        return importlib.machinery.ModuleSpec(name, self.loader, is_package=True)

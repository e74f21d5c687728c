"""YAML that a user or a job supplies, read with a bound on what its aliases expand to.

PyYAML composes an alias as a second reference to the anchored node, so a 649-byte file of eleven levels
of ten aliases each ("billion laughs") loads at once into a structure of 10^12 nodes when walked, and
every reader that walks it (validate's line map and rules, pydantic on a job.yaml, `str()` of a value)
grows without end. `BoundedLoader` counts, while composing, the nodes the document expands to (an alias
counts as the whole subtree it names, each time) and the depth they nest to, and stops at `MAX_NODES` /
`MAX_DEPTH` with `YAMLLimit` (the line, what was exceeded, the fix). As with JSON nested past the parser's
limit, such a file is refused, not cut. A self-containing (recursive) alias is refused too: no config
needs one, and walking it never ends.

Composition itself stays linear in the text (an alias is one reference), so the refusal costs nothing.
mm-agent's own data files (registry, known keys, CRDs) are read with the plain loaders: they are shipped,
not supplied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

MAX_NODES = 1_000_000  # values a YAML file may expand to (MindSpeed-MM configs hold a few hundred)
MAX_DEPTH = 200  # levels it may nest to (pydantic-core's JSON limit; configs nest fewer than ten)

_ALIAS_FIX = (
    "write the repeated values out instead of aliasing aliases: each `*name` counts as a full copy of what "
    f"`&name` holds, and mm-agent reads at most {MAX_NODES:,} values per YAML file (a file of nested "
    "aliases that expands past that is a 'billion laughs' alias bomb)"
)


class YAMLLimit(yaml.YAMLError):
    """A YAML document that expands past the bounds; `message`, `fix` and `line` (1-based) for the user."""

    def __init__(self, message: str, fix: str, line: int | None) -> None:
        super().__init__(f"{message} (line {line})" if line else message)
        self.message = message
        self.fix = fix
        self.line = line


class BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a document expanding past `max_nodes` values or `max_depth` levels.

    For every node it keeps (expanded size, height); an alias adds its anchor's, so the total is what a
    walk of the loaded data would visit. A stack holds the sums of the node being composed."""

    max_nodes = MAX_NODES
    max_depth = MAX_DEPTH

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._total = 0  # values the document expands to so far
        self._aliased = False  # whether an alias added to the total
        self._open: list[list[int]] = []  # per node being composed: [size of its children, their height]
        self._shape: dict[str, tuple[int, int] | None] = {}  # anchor -> (size, height); None while open

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()
        self._shape = {}  # anchors end with their document (as `self.anchors` does)
        return node

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node: yaml.Node | None = super().compose_node(parent, index)  # an undefined alias raises here
            shape = self._shape.get(str(event.anchor))
            if shape is None:
                raise YAMLLimit(
                    f"a recursive alias: *{event.anchor} refers to a node that contains it",
                    "replace the alias by the values it should repeat (a configuration never contains itself)",
                    event.start_mark.line + 1 if event.start_mark is not None else None,
                )
            self._aliased = True
            self._grow(*shape, event)
            self._add_to_parent(shape)
            return node
        anchor = event.anchor
        if anchor is not None:
            self._shape[anchor] = None
        self._grow(1, 1, event)
        self._open.append([0, 0])
        try:
            node = super().compose_node(parent, index)
        finally:
            size, height = self._open.pop()
        shape = (1 + size, 1 + height)
        if anchor is not None:
            self._shape[anchor] = shape
        self._add_to_parent(shape)
        return node

    def _add_to_parent(self, shape: tuple[int, int]) -> None:
        if self._open:
            self._open[-1][0] += shape[0]
            self._open[-1][1] = max(self._open[-1][1], shape[1])

    def _grow(self, size: int, height: int, event: yaml.Event) -> None:
        """Count `size` more values reaching `height` levels below the nodes being composed; refuse past the
        bounds, naming the line. (A new node counts itself on entry, its children as they come.)"""
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        self._total += size
        if len(self._open) + height > self.max_depth:
            via = " through its aliases" if isinstance(event, yaml.AliasEvent) else ""
            raise YAMLLimit(
                f"the YAML nests deeper than {self.max_depth} levels{via}",
                "flatten the structure (MindSpeed-MM configs nest fewer than ten levels)"
                + ("; " + _ALIAS_FIX if via else ""),
                line,
            )
        if self._total > self.max_nodes:
            if self._aliased:
                raise YAMLLimit(
                    f"the YAML expands to more than {self.max_nodes:,} values through its aliases",
                    _ALIAS_FIX,
                    line,
                )
            raise YAMLLimit(
                f"the YAML holds more than {self.max_nodes:,} values",
                "split the file, or check a smaller sample of it (MindSpeed-MM configs hold a few hundred)",
                line,
            )


def load(text: str | bytes, visit: Callable[[yaml.Node], None] | None = None) -> Any:
    """The data of a single-document YAML text; `visit` gets its node tree as composed (line numbers), before
    construction rewrites the mappings that use merge keys (`<<`).

    Raises `YAMLLimit` past the bounds, `yaml.YAMLError` for bad YAML (more than one document included)."""
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if visit is not None:
            visit(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def safe_load(text: str | bytes) -> Any:
    """`yaml.safe_load`, bounded: raises `YAMLLimit` past the bounds, `yaml.YAMLError` for bad YAML."""
    return load(text)

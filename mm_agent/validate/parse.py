"""JSON and YAML parsing that keeps line numbers.

`parse_json` / `parse_yaml` return the data plus a map from key path (`a.b[0].c`) to the 1-based line
where that key (or list element) starts, so findings can point at the exact line. Parse failures come
back as a `ParseError` value, never as an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from mm_agent import yamlload

LINE_MAP_CHARS = 2_000_000


@dataclass
class ParseError:
    message: str
    line: int | None = None
    fix: str | None = None  # set when the text is well-formed but past a bound (`yamlload.YAMLLimit`)


@dataclass
class Parsed:
    data: Any
    lines: dict[str, int] = field(default_factory=dict)
    duplicates: list[tuple[str, int | None]] = field(default_factory=list)  # (key path, line)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def line_of(lines: dict[str, int], path: str) -> int | None:
    """Line of `path`, or of its nearest ancestor that has one."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


@dataclass
class _Frame:
    is_obj: bool
    path: str
    key: str | None = None
    index: int = 0
    expect_key: bool = True
    elem_started: bool = False
    seen: set[str] = field(default_factory=set)


def _string_end(text: str, i: int) -> int:
    """Index of the closing quote of the JSON string starting at text[i] == '"'."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j
        j += 1
    return len(text) - 1


def json_lines(text: str) -> tuple[dict[str, int], list[tuple[str, int | None]]]:
    """Map every key path of a *valid* JSON text to the line its key (or list element) starts on.

    Also returns the keys defined twice in the same object (JSON keeps the last one silently).
    """
    out: dict[str, int] = {}
    dups: list[tuple[str, int | None]] = []
    stack: list[_Frame] = []
    line, i = 1, 0

    def value_path() -> str | None:
        """Path of a value starting here; records array-element lines."""
        if not stack:
            return ""
        top = stack[-1]
        if top.is_obj:
            return join(top.path, top.key or "")
        if not top.elem_started:
            top.elem_started = True
            out.setdefault(join(top.path, top.index), line)
        return join(top.path, top.index)

    while i < len(text):
        c = text[i]
        if c == "\n":
            line += 1
        elif c == '"':
            j = _string_end(text, i)
            top = stack[-1] if stack else None
            if top is not None and top.is_obj and top.expect_key:
                try:
                    top.key = str(json.loads(text[i : j + 1]))
                except ValueError:
                    top.key = text[i + 1 : j]
                top.expect_key = False
                if top.key in top.seen:
                    dups.append((join(top.path, top.key), line))
                top.seen.add(top.key)
                out.setdefault(join(top.path, top.key), line)
            else:
                value_path()
            i = j
        elif c in "{[":
            path = value_path()
            stack.append(_Frame(is_obj=c == "{", path=path or ""))
        elif c in "}]":
            if stack:
                stack.pop()
        elif c == ",":
            if stack:
                top = stack[-1]
                if top.is_obj:
                    top.expect_key = True
                else:
                    top.index += 1
                    top.elem_started = False
        elif not c.isspace() and c != ":":
            value_path()
        i += 1
    return out, dups


def parse_json(text: str) -> Parsed | ParseError:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return ParseError(f"{exc.msg} (line {exc.lineno}, column {exc.colno})", exc.lineno)
    except (ValueError, RecursionError) as exc:
        return ParseError(str(exc) or type(exc).__name__)
    lines, dups = json_lines(text[:LINE_MAP_CHARS])  # big datasets: line numbers for the first records only
    return Parsed(data, lines, dups)


def _yaml_walk(node: yaml.Node, path: str, out: dict[str, int], depth: int = 0) -> None:
    if depth > 64:
        return
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            child = join(path, str(key_node.value))
            out.setdefault(child, key_node.start_mark.line + 1)
            _yaml_walk(value_node, child, out, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = join(path, index)
            out.setdefault(child, item.start_mark.line + 1)
            _yaml_walk(item, child, out, depth + 1)


def parse_yaml(text: str) -> Parsed | ParseError:
    """Data and line map of a YAML text, composed once by the bounded loader: a file whose aliases expand
    past `yamlload.MAX_NODES` values (an alias bomb) is a ParseError with its fix, never walked."""
    lines: dict[str, int] = {}
    try:
        data = yamlload.load(text, visit=lambda node: _yaml_walk(node, "", lines))
    except yamlload.YAMLLimit as exc:
        return ParseError(exc.message, exc.line, exc.fix)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        return ParseError(f"{problem} (line {line})" if line else problem, line)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        return ParseError(str(exc) or type(exc).__name__)
    return Parsed(data, lines)

"""Compare a rendered job file with MindSpeed-MM's stock example of the same version.

- `diff_config(rendered, stock, file)`: parsed JSON/YAML compared key by key (dotted keys, lists by index).
- `diff_script(rendered_text, stock_text, file)`: the launch commands flag by flag (values after each flag,
  flags present on one side only), launcher flags as `torchrun --flag`, the entry script as `<entry>`, and
  exported env vars one by one. `$VAR` references are resolved the way the validator reads scripts
  (`mm_agent.validate.shell.parse_script` over `shell_expand.Expander`).
- `undeclared(diffs, model=, task=, size=, version=)`: what remains once user choices
  (`registry/data/deviations/_user_choices.yaml`) and declared deviations (`deviations/<model>.yaml`) are
  dropped. Anything left is a silent change against the stock example.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from mm_agent.registry import get_registry
from mm_agent.registry.deviations import Deviation, UserChoice, deviations_for, user_choices
from mm_agent.validate.shell import LaunchCommand, parse_script, split_statements, split_words


class _Absent:
    """The value on the side that lacks a key or flag."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<absent>"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()
UNKNOWN = "<unknown>"  # a value the static reader cannot know (a command substitution, the environment)


@dataclass(frozen=True)
class Difference:
    file: str
    key: str
    rendered: Any
    stock: Any

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: rendered {self.rendered!r}, stock {self.stock!r}"


# ---- configs ------------------------------------------------------------------------------------------
def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0) or (
            math.isnan(float(a)) and math.isnan(float(b))
        )
    return bool(a == b)


def diff_config(rendered: Any, stock: Any, file: str, prefix: str = "") -> list[Difference]:
    """Differences of two parsed JSON/YAML documents; keys dotted (`a.b.0.c`), lists compared by index."""
    if isinstance(rendered, dict) and isinstance(stock, dict):
        out: list[Difference] = []
        for key in list(stock) + [k for k in rendered if k not in stock]:
            sub = f"{prefix}.{key}" if prefix else str(key)
            out += diff_config(rendered.get(key, ABSENT), stock.get(key, ABSENT), file, sub)
        return out
    if isinstance(rendered, list) and isinstance(stock, list):
        out = []
        for i in range(max(len(rendered), len(stock))):
            sub = f"{prefix}.{i}" if prefix else str(i)
            r = rendered[i] if i < len(rendered) else ABSENT
            s = stock[i] if i < len(stock) else ABSENT
            out += diff_config(r, s, file, sub)
        return out
    if rendered is ABSENT and stock is ABSENT:
        return []
    if rendered is ABSENT or stock is ABSENT or not _same_scalar(rendered, stock):
        return [Difference(file, prefix or "<root>", rendered, stock)]
    return []


# ---- scripts ------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")


def _norm(value: str | None) -> str | float:
    """A flag value for comparison: unknown as a marker, numbers by value (`1e-5` == `1e-05`), paths
    without a trailing slash."""
    if value is None:
        return UNKNOWN
    if _NUMBER.match(value):
        return float(value)
    if "/" in value:  # a path: `./a/b/` and `a/b` are the same place
        value = value.removeprefix("./").rstrip("/") or value
    return value


def _values(values: list[str | None]) -> Any:
    """A flag's values as compared: [] for a switch, one value unwrapped, several as a list."""
    normed = [_norm(v) for v in values]
    if not normed:
        return []
    return normed[0] if len(normed) == 1 else normed


def _diff_flags(
    rendered: dict[str, list[str | None]], stock: dict[str, list[str | None]], file: str, prefix: str
) -> list[Difference]:
    out: list[Difference] = []
    for flag in list(stock) + [f for f in rendered if f not in stock]:
        r = _values(rendered[flag]) if flag in rendered else ABSENT
        s = _values(stock[flag]) if flag in stock else ABSENT
        if r is ABSENT or s is ABSENT or r != s:
            out.append(Difference(file, prefix + flag, r, s))
    return out


def exported_env(path: str, text: str) -> dict[str, str | None]:
    """Variables the script exports (`export A=1`, `export A`), with their final static values."""
    info = parse_script(path, text)
    names: list[str] = []
    for stmt in split_statements(text):
        words = split_words(stmt.text)
        if words and words[0] == "export":
            for word in words[1:]:
                if word.startswith("-"):
                    continue
                name = word.split("=", 1)[0]
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name not in names:
                    names.append(name)
    return {name: info.env.get(name) for name in names}


def launch_commands(path: str, text: str) -> list[LaunchCommand]:
    return parse_script(path, text).commands


def diff_script(
    rendered_text: str,
    stock_text: str,
    file: str,
    *,
    rendered_path: str | None = None,
    stock_path: str | None = None,
) -> list[Difference]:
    """Differences of two launch scripts: exported env vars, then each launch command (paired in order)
    flag by flag. `*_path` is what `${BASH_SOURCE[0]}` stands for on each side (default: `file`)."""
    r_path, s_path = rendered_path or file, stock_path or file
    out: list[Difference] = []
    r_env, s_env = exported_env(r_path, rendered_text), exported_env(s_path, stock_text)
    for name in list(s_env) + [n for n in r_env if n not in s_env]:
        r = _norm(r_env[name]) if name in r_env else ABSENT
        s = _norm(s_env[name]) if name in s_env else ABSENT
        if r is ABSENT or s is ABSENT or r != s:
            out.append(Difference(file, name, r, s))
    r_cmds, s_cmds = launch_commands(r_path, rendered_text), launch_commands(s_path, stock_text)
    if len(r_cmds) != len(s_cmds):
        out.append(
            Difference(
                file,
                "<launch>",
                [f"{c.launcher} {c.entry}" for c in r_cmds],
                [f"{c.launcher} {c.entry}" for c in s_cmds],
            )
        )
    for r_cmd, s_cmd in zip(r_cmds, s_cmds, strict=False):
        r_entry = f"{r_cmd.launcher} {_norm(r_cmd.entry)}"
        s_entry = f"{s_cmd.launcher} {_norm(s_cmd.entry)}"
        if r_entry != s_entry:
            out.append(Difference(file, "<entry>", r_entry, s_entry))
        out += _diff_flags(r_cmd.launcher_flags, s_cmd.launcher_flags, file, f"{r_cmd.launcher} ")
        out += _diff_flags(r_cmd.flags, s_cmd.flags, file, "")
    return out


# ---- what is left -------------------------------------------------------------------------------------
def is_user_choice(diff: Difference, choices: Iterable[UserChoice], requested: Collection[str] = ()) -> bool:
    """A path the user owns (both sides set it), or a request value the request set (`requested` keys)."""
    for choice in choices:
        if not choice.matches(diff.file, diff.key):
            continue
        if choice.kind == "path" and diff.rendered is not ABSENT and diff.stock is not ABSENT:
            return True
        if choice.kind == "request" and diff.key in requested:
            return True
    return False


def declared(
    diff: Difference,
    deviations: Iterable[Deviation],
    *,
    model: str,
    task: str,
    size: str,
    version: str,
    backend: str | None = None,
) -> Deviation | None:
    for entry in deviations:
        if entry.applies(
            model=model, task=task, size=size, version=version, backend=backend, file=diff.file, key=diff.key
        ):
            return entry
    return None


def undeclared(
    diffs: Iterable[Difference],
    *,
    model: str,
    task: str,
    size: str,
    version: str,
    backend: str | None = None,
    requested: Collection[str] = (),
) -> list[Difference]:
    """The differences that are neither a user choice nor a declared deviation of this job.

    `requested`: keys whose value the render request set on purpose (a `kind: request` user choice is
    dropped only then; a job rendered with defaults must match the stock values)."""
    choices = user_choices()
    deviations = deviations_for(model)
    return [
        d
        for d in diffs
        if not is_user_choice(d, choices, requested)
        and declared(d, deviations, model=model, task=task, size=size, version=version, backend=backend)
        is None
    ]


def registry_cases(
    templates: Collection[str], versions: Iterable[str]
) -> list[tuple[str, str, str, str, str]]:
    """(model, task, backend, size, version) for every registry job rendered with one of `templates` that
    exists at each of `versions` (model, task and size all present there)."""
    out: list[tuple[str, str, str, str, str]] = []
    for entry in get_registry().models.values():
        for task in entry.tasks:
            if task.template not in templates:
                continue
            for version in versions:
                if not (entry.versions.contains(version) and task.versions.contains(version)):
                    continue
                for size in entry.sizes:
                    if size.versions.contains(version) and (task.sizes is None or size.id in task.sizes):
                        out.append((entry.id, task.id, task.backend, size.id, version))
    return out

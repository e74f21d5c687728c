"""Reading MindSpeed-MM's JSON configs with errors that name the file and field.

MindSpeed-MM fails deep inside model construction on a missing key (a `KeyError` far from the config); the
runtime reads the same files but checks each field where it is used, so the message says which file and
which dotted field to fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.errors import RuntimeFailure


def load_json(path: str | Path, what: str) -> dict[str, Any]:
    """Load the JSON object at `path`; `what` names the file's role (e.g. "model config") in errors."""
    p = Path(path)
    if not p.is_file():
        raise RuntimeFailure(
            f"{what} not found: {p}",
            file=str(p),
            fix=f"pass the path of an existing {what} (render the job again if it was deleted)",
        )
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeFailure(
            f"cannot read {what}: {exc}", file=str(p), fix="check the file's permissions"
        ) from exc
    except json.JSONDecodeError as exc:
        raise RuntimeFailure(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            file=str(p),
            fix="fix the JSON syntax (or render the job again)",
        ) from exc
    if not isinstance(data, dict):
        raise RuntimeFailure(
            f"{what} must be a JSON object, got {type(data).__name__}",
            file=str(p),
            fix="the top level must be an object { ... }",
        )
    return data


def require(d: dict[str, Any], dotted_key: str, file: str | Path) -> Any:
    """Return `d[a][b]...` for `dotted_key` "a.b..."; a missing or null step names the file, field and fix."""
    node: Any = d
    walked: list[str] = []
    for part in dotted_key.split("."):
        walked.append(part)
        if not isinstance(node, dict) or node.get(part) is None:
            raise RuntimeFailure(
                f"missing required field {'.'.join(walked)!r}",
                file=str(file),
                field=dotted_key,
                fix=f"add {dotted_key!r} to the file (see the MindSpeed-MM example config for its value)",
            )
        node = node[part]
    return node

"""Writing a checked scaffold: nothing the user has is overwritten (a file that exists with other content stops
the whole write before any file is touched), each file is written under a temporary name and renamed, the
registration edit comes after the files it imports, and the registry entry last (its presence means the scaffold
is complete; running the same request again finds everything `unchanged`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from mm_agent.errors import MMAgentError, os_error
from mm_agent.scaffold.plan import Plan
from mm_agent.scaffold.request import ScaffoldFile


def _current(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        return "\0"  # not text: never equal to what we would write
    except OSError as exc:
        raise os_error(exc, file=str(path)) from None


def atomic_write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            mode = 0o755 if path.suffix == ".sh" else 0o644
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise os_error(exc, file=str(path)) from None


def inventory(plan: Plan, root: Path) -> list[ScaffoldFile]:
    """What writing would do to each file; refuses (naming them) files that exist with other content."""
    items: list[ScaffoldFile] = []
    clashes: list[str] = []
    differs = {f.path.format(name=plan.req.name): f.differs for f in plan.spec.files}
    for rel, text in plan.files.items():
        old = _current(root / rel)
        if old is not None and old != text:
            clashes.append(rel)
        action: Literal["create", "unchanged"] = "create" if old is None else "unchanged"
        items.append(
            ScaffoldFile(
                path=rel, role=plan.roles[rel], action=action, bytes=len(text.encode()), differs=differs[rel]
            )
        )
    if plan.registration is not None:
        rel, text = plan.registration
        old = _current(root / rel)
        items.append(
            ScaffoldFile(
                path=rel,
                role="registration",
                action="unchanged" if old == text else "edit",
                bytes=len(text.encode()),
            )
        )
    if clashes:
        raise MMAgentError(
            f"{len(clashes)} file(s) already exist with other content: {', '.join(clashes[:5])}",
            file=str(root / clashes[0]),
            field="name",
            fix="nothing was written; pick another --name, or move those files away first (mm-agent never "
            "overwrites them)",
        )
    return items


def write_plan(plan: Plan, root: Path, items: list[ScaffoldFile]) -> None:
    for item in items:
        if item.action == "create":
            atomic_write(root / item.path, plan.files[item.path])
    if plan.registration is not None and any(i.role == "registration" and i.action == "edit" for i in items):
        rel, text = plan.registration
        atomic_write(root / rel, text)

"""Finding the media of a dataset folder, in a stable order, with their sidecar captions.

A directory is walked recursively in sorted order (so the written index and a re-run's are the same), each
directory once by (device, inode) so a symlink loop cannot trap the walk, and a file whose real path leaves
the allowed roots is reported instead of read. A caption is the `.txt` file of the same stem beside the media
(`clip.mp4` -> `clip.txt`), read as UTF-8 up to `CAPTION_BYTES`. A file whose name (or folder's name) is not
UTF-8 is reported, not read: the index is UTF-8 JSON, so no record could name it as MindSpeed-MM reads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_agent import cancel
from mm_agent.dataset.probe import IMAGE_EXTS, VIDEO_EXTS
from mm_agent.names import is_utf8
from mm_agent.paths import owning_root

CAPTION_BYTES = 64 * 1024  # a caption is a sentence or a paragraph; more is a mistake


@dataclass
class Item:
    rel: str  # relative to the dataset root, '/'-separated: what the index stores
    path: str  # absolute
    caption: str | None = None
    problem: str | None = None  # a reason code found before probing (outside roots, caption unreadable)
    detail: str = ""
    size: int = 0
    mtime_ns: int = 0
    probe: dict[str, Any] | None = None  # from the cache: not probed again


def locate(item: Item, workspace: Path | None, missing: str) -> Path | None:
    """The real path of `item` with its size and mtime filled in, or None with `item.problem` set: `missing`
    (with `missing` as the detail) when it cannot be resolved, `outside_roots` when its real path leaves the
    allowed roots."""
    try:
        real = Path(item.path).resolve(strict=True)
        st = real.stat()
        item.size, item.mtime_ns = st.st_size, st.st_mtime_ns
    except (OSError, RuntimeError):
        item.problem, item.detail = "missing", missing
        return None
    if workspace is not None and owning_root(real, workspace) is None:
        item.problem = "outside_roots"
        return None
    return real


def media_kind(name: str) -> str | None:
    ext = os.path.splitext(name)[1].lower()
    return "video" if ext in VIDEO_EXTS else "image" if ext in IMAGE_EXTS else None


def read_caption(path: Path) -> tuple[str | None, str | None]:
    """(caption, problem): problem is `no_caption`, `caption_not_utf8`, `caption_too_long` or None."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(CAPTION_BYTES + 1)
    except FileNotFoundError:
        return None, "no_caption"
    except OSError:
        return None, "caption_unreadable"
    if len(raw) > CAPTION_BYTES:
        return None, "caption_too_long"
    try:
        text = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        return None, "caption_not_utf8"
    return (text, None) if text else (None, "no_caption")


def _confined(entry: os.DirEntry[str], folder_inside: bool, workspace: Path) -> bool:
    """Whether `entry` (in a folder judged `folder_inside`) really lies inside the allowed roots."""
    try:
        if not entry.is_symlink():
            return folder_inside
        return owning_root(Path(entry.path).resolve(strict=True), workspace) is not None
    except (OSError, RuntimeError):
        return True  # a dangling link: _regular says it cannot be read


def _regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows a link: a dangling one is unreadable too
    except OSError:
        return False


def walk(root: Path, workspace: Path | None, kinds: set[str], *, captions: bool = True) -> Iterator[Item]:
    """Media files under `root` (sorted, recursive) as Items; `workspace` confines real paths (MCP).

    Each folder is resolved and judged against the roots once; a plain file in it (not a symlink) lies
    where its folder does, so only symlinked files are resolved one by one."""
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> Iterator[Item]:
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            real_folder = os.path.realpath(folder)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        folder_inside = workspace is None or owning_root(Path(real_folder), workspace) is not None
        sidecars = {e.name: e for e in entries if e.name.endswith(".txt")} if captions else {}
        for entry in entries:
            cancel.check()  # an abandoned call stops scanning here
            name_rel = f"{rel}{entry.name}"
            try:
                is_dir = entry.is_dir()
                linked = entry.is_symlink()
            except OSError:
                continue
            if is_dir:
                if not entry.name.startswith("."):
                    yield from visit(entry.path, f"{name_rel}/")
                continue
            kind = media_kind(entry.name)
            if kind not in kinds:
                continue
            item = Item(rel=name_rel, path=entry.path)
            if not is_utf8(name_rel):  # (its folder's name, or its own): data.json cannot hold it as UTF-8
                item.problem = "name_not_utf8"
                yield item
                continue
            try:
                if linked:
                    real = Path(entry.path).resolve(strict=True)
                    st = real.stat()
                else:
                    st = entry.stat()
            except (OSError, RuntimeError) as exc:
                item.problem, item.detail = "unreadable", str(exc)[:200]
                yield item
                continue
            item.size, item.mtime_ns = st.st_size, st.st_mtime_ns
            inside = (
                folder_inside if not linked else workspace is None or owning_root(real, workspace) is not None
            )
            if not inside:
                item.problem = "outside_roots"
                yield item
                continue
            if captions:
                sidecar = sidecars.get(os.path.splitext(entry.name)[0] + ".txt")
                if sidecar is None:
                    item.problem = "no_caption"
                elif workspace is not None and not _confined(sidecar, folder_inside, workspace):
                    item.problem = "outside_roots"  # a caption linked out of the workspace is not read
                elif not _regular(sidecar):
                    item.problem = "caption_unreadable"  # a FIFO or device would block the scan
                else:
                    item.caption, item.problem = read_caption(Path(sidecar.path))
            yield item

    yield from visit(str(root), "")

"""`mm_agent_manifest.json`: the record of how a checkpoint was converted, written with every conversion.

The split a checkpoint was written with is the most common cause of shape-mismatch and missing-`mp_rank`
failures at training time, and mm-convert records none. The manifest holds converter, direction, source
hashes, tp, pp_layers and the files written; `validate_configs` checks it against the training job, and a
re-run compares against it: same settings and sources => unchanged, anything else => an error that names
the difference. Hashes are reused while a file's size and mtime are unchanged, so a no-op re-run does not
re-read a multi-GB source.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import mm_agent
from mm_agent.convert.layout import TRACKER
from mm_agent.convert.schema import Manifest
from mm_agent.errors import MMAgentError
from mm_agent.paths import read_file

MANIFEST = "mm_agent_manifest.json"
MAX_MANIFEST = 64 * 1024 * 1024  # source hashes and the HF weight map: well under a MiB for real models
_CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    """'size:sha256' of a file, read in chunks (constant memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return f"{path.stat().st_size}:{digest.hexdigest()}"


def source_stats(root: Path, files: list[Path]) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime_ns)."""
    out = {}
    for path in files:
        st = path.stat()
        out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def hash_sources(root: Path, files: list[Path], previous: Manifest | None = None) -> dict[str, str]:
    """relative path -> 'size:sha256'; entries of `previous` are reused when size and mtime still match."""
    out: dict[str, str] = {}
    for rel, (size, mtime) in source_stats(root, files).items():
        old = previous.source_files.get(rel) if previous else None
        if previous and old and old.startswith(f"{size}:") and previous.source_mtimes.get(rel) == mtime:
            out[rel] = old
        else:
            out[rel] = sha256_file(root / rel)
    return out


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def version() -> str:
    return mm_agent.__version__


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    path = directory / MANIFEST
    path.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(directory: Path, root: Path | None = None) -> Manifest | None:
    """The manifest in `directory`, None when there is none; a corrupt one is an error naming the file.
    Read as a regular file only (a FIFO in its place is refused, not waited on); with `root`, what is
    opened must lie inside the workspace."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        return Manifest.model_validate(
            json.loads(read_file(path, root, field="manifest", limit=MAX_MANIFEST))
        )
    except (ValueError, ValidationError) as exc:
        raise MMAgentError(
            f"unreadable manifest: {str(exc).splitlines()[0]}",
            file=str(path),
            fix="delete the target's converted files and the manifest, then convert again",
        ) from exc


SETTINGS = ("converter", "method", "tp", "pp_layers", "vit_pp_layers", "lora_rank", "lora_alpha")


def setting_differences(old: Manifest, requested: dict[str, Any]) -> list[str]:
    """Differences in the settings that define a conversion's output (`requested`: SETTINGS values)."""
    return [
        f"{field}: existing {getattr(old, field)} vs requested {requested[field]}"
        for field in SETTINGS
        if getattr(old, field) != requested[field]
    ]


def differences(old: Manifest, new: Manifest) -> list[str]:
    """Field-by-field differences of settings and sources."""
    diffs = setting_differences(old, {field: getattr(new, field) for field in SETTINGS})
    if old.source_files != new.source_files:
        changed = sorted(set(old.source_files) ^ set(new.source_files)) or sorted(
            k for k in new.source_files if old.source_files.get(k) != new.source_files[k]
        )
        diffs.append(f"source files differ ({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''})")
    return diffs


def files_intact(directory: Path, manifest: Manifest) -> bool:
    """Every file the manifest lists is still present (ignores other files)."""
    return all((directory / entry.path).is_file() for entry in manifest.files)


def existing_state(target: Path, marker: str | None) -> Manifest | None:
    """The manifest of a complete earlier conversion in `target`, or None when there is none to honour.

    `marker` is the file that makes the target valid (the tracker for MM layouts; None for HF exports,
    which are renamed into place whole). A marker without a manifest is someone else's checkpoint: refuse
    rather than overwrite it.
    """
    manifest = read_manifest(target) if target.is_dir() else None
    has_marker = marker is None or (target / marker).is_file()
    if manifest is None:
        if marker is not None and has_marker:
            raise MMAgentError(
                f"{target} already holds a checkpoint ({marker}) that mm-agent did not write",
                field="target",
                fix=f"choose another --target, or delete {marker} and release/ from it first",
            )
        return None
    if not has_marker or not files_intact(target, manifest):
        return None  # an interrupted earlier run: convert again over it
    return manifest


def check_rerun(target: Path, existing: Manifest, new: Manifest) -> None:
    """Same settings => the caller reports 'unchanged'; different settings => an error naming them."""
    refuse_differences(target, existing, differences(existing, new))


def refuse_differences(target: Path, existing: Manifest, diffs: list[str]) -> None:
    if diffs:
        raise MMAgentError(
            f"{target} already holds a conversion with different settings: " + "; ".join(diffs),
            field="target",
            fix="convert into another --target, or delete the earlier output first ("
            + ", ".join(_outputs(existing))
            + ")",
        )


def _outputs(manifest: Manifest) -> list[str]:
    """Top-level names a conversion wrote (what to delete to redo it)."""
    names = sorted({e.path.split("/")[0] for e in manifest.files})
    return [*names, *([TRACKER] if manifest.direction != "mm_to_hf" else []), MANIFEST]

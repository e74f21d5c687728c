"""MindSpeed-MM's raw dataset index: `data.txt` lines `root,annotations.json` → one record per clip.

In `combine` mode (the Wan feature-extraction default) every non-empty line of `data.txt` names a dataset
root and an annotation file (a JSON list, or JSON lines, of `{"path", "cap", ...}` records), and `path` is
joined onto the root, as MindSpeed-MM's `DataFileReader.get_cap_list` does. In `standard` mode `data_path`
is the annotation file itself and paths are used as written. Each record keeps its dataset index and its
path relative to the root, so feature names can be made collision-safe and stable across runs.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import RuntimeFailure


@dataclass(frozen=True)
class Sample:
    """One clip to extract: its MM record (with `path` already joined), where it came from, its captions."""

    index: int
    dataset: int
    rel: str
    path: str
    captions: tuple[str, ...]
    record: dict[str, Any]

    def caption(self, seed: int) -> str:
        """The caption used for this clip: MM picks one of a list at random; seeded per clip, so reruns agree."""
        if len(self.captions) == 1:
            return self.captions[0]
        return random.Random(f"{seed}:{self.index}").choice(self.captions)


def whitespace_clean(text: str) -> str:
    """MindSpeed-MM's `whitespace_clean` text preprocessing: runs of whitespace → one space, ends stripped."""
    return re.sub(r"\s+", " ", text).strip()


def _annotations(path: Path, data_txt: Path | None) -> list[Any]:
    where = str(data_txt or path)
    if not path.is_file():
        raise RuntimeFailure(
            f"annotation file not found: {path}",
            file=where,
            fix="fix the annotation path (in data.txt, the part after the comma)",
        )
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeFailure(
            f"annotation file is not valid JSON: {exc.msg} at line {exc.lineno}",
            file=str(path),
            fix='fix the JSON (a list of {"path": ..., "cap": ...} records)',
        ) from exc
    if not isinstance(data, list):
        raise RuntimeFailure(
            "annotation file must hold a JSON list of records",
            file=str(path),
            fix='write [{"path": "videos/x.mp4", "cap": "..."}, ...]',
        )
    return data


def _sample(raw: Any, index: int, dataset: int, root: str | None, source: Path, line: int) -> Sample:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str) or not raw["path"]:
        raise RuntimeFailure(
            f'record {line} has no "path" string',
            file=str(source),
            fix='every record needs "path" (relative to the dataset root) and "cap"',
        )
    cap = raw.get("cap")
    captions = [cap] if isinstance(cap, str) else cap
    if not isinstance(captions, list) or not captions or not all(isinstance(c, str) for c in captions):
        raise RuntimeFailure(
            f'record {line} ({raw["path"]}) has no caption: "cap" must be a string or a list of strings',
            file=str(source),
            field="cap",
            fix="give every record a caption",
        )
    rel = raw["path"]
    full = os.path.join(root, rel) if root is not None else rel
    if root is not None and os.path.isabs(rel):
        rel = os.path.relpath(rel, root)
    record = {**raw, "path": full}
    return Sample(index, dataset, rel, full, tuple(captions), record)


def read_samples(data_path: str | Path, storage_mode: str = "combine") -> list[Sample]:
    """All clips listed by `data_path` (data.txt in combine mode, the annotation file in standard mode)."""
    data_path = Path(data_path)
    if storage_mode == "standard":
        samples = [_sample(r, i, 0, None, data_path, i) for i, r in enumerate(_annotations(data_path, None))]
    elif storage_mode == "combine":
        samples = _combined(data_path)
    else:
        raise RuntimeFailure(
            f"unsupported data_storage_mode {storage_mode!r}",
            field="dataset_param.basic_parameters.data_storage_mode",
            fix='use "combine" (data.txt with root,annotations lines) or "standard"',
        )
    if not samples:
        raise RuntimeFailure(
            "the dataset lists no clips", file=str(data_path), fix="add records to the annotation file(s)"
        )
    return samples


def _combined(data_path: Path) -> list[Sample]:
    if not data_path.is_file():
        raise RuntimeFailure(
            f"data.txt not found: {data_path}",
            file=str(data_path),
            field="dataset_param.basic_parameters.data_path",
            fix="point data_path at the data.txt listing `<dataset_root>,<annotations.json>` lines",
        )
    samples: list[Sample] = []
    lines = [ln.strip() for ln in data_path.read_text(encoding="utf-8").splitlines()]
    for dataset, line in enumerate(ln for ln in lines if ln):
        fields = line.split(",")
        if len(fields) != 2 or not all(f.strip() for f in fields):
            raise RuntimeFailure(
                f"malformed line {line!r}: expected `<dataset_root>,<annotations.json>`",
                file=str(data_path),
                fix="one dataset per line, root and annotation file separated by one comma",
            )
        root, anno = (f.strip() for f in fields)
        for pos, raw in enumerate(_annotations(Path(anno), data_path)):
            samples.append(_sample(raw, len(samples), dataset, root, Path(anno), pos))
    return samples

"""The VLM path of `prepare_dataset`: an index of conversations -> the MLLM JSON the model's data config reads.

Each record (LLaVA, ShareGPT or OpenAI-style, see `conversations.to_mllm`) is rewritten into the keys and
role names of the model's `attr` block, with one `<image>` per image; its images must lie under the dataset
folder (MindSpeed-MM joins `dataset_dir` and the path) and decode (probed in the pool, cached like clips). A
record is accepted only when all its images are. Records stream through in chunks, so memory stays flat.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_agent import cancel
from mm_agent.dataset.cache import ProbeCache
from mm_agent.dataset.conversations import Attr, Refusal, placeholders, to_mllm
from mm_agent.dataset.index_files import IndexRow
from mm_agent.dataset.scan import Item, locate
from mm_agent.dataset.schema import DatasetResult
from mm_agent.dataset.write import AtomicFile, check_writable, write_bytes
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    from mm_agent.dataset.prepare import _Pool, _Run

CHUNK = 64  # records whose images are probed together
_IMAGE_FIXES = {
    "unreadable": "re-save the image (any image editor, or PIL), or drop the record",
    "empty": "re-copy the image from its source, or drop the record",
    "mislabelled": "rename the image to its real type's extension",
}


def _rows(run: _Run) -> Iterator[IndexRow]:
    if not run.req.index:
        raise MMAgentError(
            f"{run.target.model} is a vision-language model: its dataset is conversations, not sidecar captions",
            field="index",
            fix="pass index=<file> (JSON/JSONL in LLaVA `conversations`, ShareGPT or `messages`/`images` shape; "
            "image paths relative to dir)",
        )
    return run.index_rows()[1]


def _image_item(run: _Run, written: str, label: str) -> Item:
    path = Path(written)
    full = path if path.is_absolute() else run.dir / path
    item = Item(rel=written, path=str(full))
    locate(item, run.root, f"does not exist under {run.dir}")
    return item


def _chunks(rows: Iterator[IndexRow]) -> Iterator[list[IndexRow]]:
    chunk: list[IndexRow] = []
    for row in rows:
        cancel.check()  # an abandoned call stops reading its index here
        chunk.append(row)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def prepare_mllm(run: _Run, t0: float, pool: _Pool) -> DatasetResult:
    from mm_agent.dataset.prepare import BATCH, _require, _result, _warnings

    attr = Attr.from_config(run.target.data_config)
    rows = _rows(run)
    if run.req.confirm:
        for path in (run.out, run.plot):
            check_writable(path, run.root)
    _require("PIL", "images")
    cache = ProbeCache(run.dir)
    out = AtomicFile(run.out, run.root) if run.req.confirm else None
    index_name = Path(run.req.index or "index").name
    try:
        if out is not None:
            out.write(b"[")
        for chunk in _chunks(rows):
            converted: list[tuple[str, dict[str, Any] | None, list[Item]]] = []
            items: list[Item] = []
            for row in chunk:
                run.found += 1
                label = f"{index_name}:{row.line}"
                if row.error:
                    run.reject(label, "record", row.error)
                    converted.append((label, None, []))
                    continue
                record = to_mllm(row.record, attr)
                if isinstance(record, Refusal):
                    run.reject(label, record.code, record.reason, record.fix)
                    converted.append((label, None, []))
                    continue
                images = [_image_item(run, p, label) for p in record.get(attr.images or "", []) or []]
                for item in images:
                    if item.problem is None:
                        item.probe = cache.get(item.rel, item.size, item.mtime_ns)
                items += images
                converted.append((label, record, images))
            probes = {}
            batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
            for item, probe in pool.map(iter(batches)):
                if probe is not None:
                    cache.put(item.rel, probe)
                    run.probed += 1
                elif item.problem is None:
                    run.cached += 1
                probes[id(item)] = probe or item.probe
            for label, rec, images in converted:
                if rec is None:
                    continue
                bad = next(
                    (im for im in images if im.problem or (probes.get(id(im)) or {}).get("error")), None
                )
                if bad is not None:
                    probe = probes.get(id(bad)) or {}
                    code = bad.problem or str(probe.get("error"))
                    why = bad.detail or probe.get("detail") or code
                    fix = _IMAGE_FIXES.get(code)
                    run.reject(label, code, f"image {bad.rel}: {why}", fix)
                    continue
                for im in images:
                    probe = probes.get(id(im)) or {}
                    run.resolutions[f"{probe.get('width')}x{probe.get('height')}"] += 1
                text = " ".join(str(m.get(attr.content_tag, "")) for m in rec.get(attr.messages, []))
                run.values["caption words"].append(len(text.split()))
                run.values.setdefault("images per record", []).append(float(placeholders(text)[0]))
                if out is not None:
                    sep = b"\n" if run.accepted == 0 else b",\n"
                    out.write(sep + json.dumps(rec, ensure_ascii=False).encode())
                run.accepted += 1
            cache.flush()
        if out is not None:
            out.write(b"\n]\n")
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        cache.close()
    written = plot = None
    state = "dry_run"
    run.warnings += _warnings(run)
    if out is not None:
        if run.accepted == 0:
            out.abort()
        else:
            state = out.commit()
            written = str(run.out)
            if state != "unchanged" or not run.plot.exists():
                from mm_agent.dataset.prepare import _plot

                values = {
                    "words per record": run.values["caption words"],
                    "images per record": run.values.get("images per record", []),
                }
                png = pool.submit(
                    _plot,
                    values,
                    dict(run.resolutions.most_common(12)),
                    f"{run.dir.name}: {run.accepted} records",
                )
                write_bytes(run.plot, png, run.root)
            plot = str(run.plot)
    return _result(run, written, plot, time.monotonic() - t0, state)

"""A user's own index (CSV/TSV, JSONL or JSON) read as rows of media paths + caption, for `prepare_dataset`.

People arrive with whatever their last tool wrote: `;`-separated spreadsheets, JSONL with a truncated last line,
a JSON list wrapped in `{"data": [...]}`, captions under `text` or `prompt`. The reader takes them all, streams
CSV and JSONL (memory stays flat however many rows), and marks a record it cannot use on that row instead of
stopping, so one bad line costs one item. Problems with the file as a whole (format, encoding, columns) raise
`MMAgentError` before the first row.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, Field

from mm_agent.dataset.conversations import media_of
from mm_agent.errors import MMAgentError, os_error

PATH_COLUMNS = (
    "path",
    "video",
    "video_path",
    "file",
    "file_name",
    "filename",
    "image",
    "images",
    "image_path",
    "media",
    "clip",
)
CAPTION_COLUMNS = ("cap", "caption", "captions", "text", "prompt", "description", "title")
MAX_JSON_BYTES = 1 << 30
_PEEK = 16 << 20  # longest first line read to tell JSONL from one JSON document
_CSV = (".csv", ".tsv")
_JSONL = (".jsonl", ".ndjson")
_TURN_KEYS = ("conversations", "messages")
_UTF8_FIX = "re-save the file as UTF-8 (e.g. iconv -f CP1252 -t UTF-8 in.csv > out.csv, or 'Save as UTF-8')"


class IndexRow(BaseModel):
    """One record of an index: where its media is, its caption, and why it is unusable (when it is)."""

    line: int = Field(description="1-based record number (CSV: data row after the header; JSONL: line)")
    media: list[str] = Field(
        default_factory=list, description="paths as written (VLM records may hold several)"
    )
    caption: str | None = None
    record: dict[str, Any] = Field(
        default_factory=dict, description="the raw record (conversations live here)"
    )
    error: str | None = None


class _Broken:
    """A record that did not parse, and why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


_Raw = tuple[int, dict[str, Any] | _Broken]


def read_index(path: Path, *, path_column: str | None, caption_column: str | None) -> Iterator[IndexRow]:
    """The records of `path` as rows. Columns not named are detected from the first record (case-insensitive);
    a record holding a conversation (`conversations`/`messages`) may have no path column at all: its media are
    the images it names. Raises MMAgentError for an unknown format, a non-UTF-8 file, a missing column, or a
    file with no records."""
    raw = _raw_records(path)
    head: list[_Raw] = []
    for item in raw:
        head.append(item)
        if isinstance(item[1], dict):
            break
    if not head:
        raise MMAgentError(
            "the index holds no records",
            file=str(path),
            fix="add one record per clip or image, or pass another file",
        )
    first = head[-1][1]
    if not isinstance(first, dict):  # nothing parsed: every row says why
        return _rows(iter(head), None, None)
    media = _column(path, first, path_column, PATH_COLUMNS, "--path-column")
    if media is None and not any(isinstance(first.get(k), list) for k in _TURN_KEYS):
        raise MMAgentError(
            f"no path column (looked for {', '.join(PATH_COLUMNS)}); it has: {_listing(first)}",
            file=str(path),
            fix="name the column that holds the media paths: --path-column NAME (MCP: path_column)",
        )
    caption = _column(path, first, caption_column, CAPTION_COLUMNS, "--caption-column")
    return _rows(chain(head, raw), media, caption)


def _listing(record: dict[str, Any]) -> str:
    return ", ".join(repr(k) for k in record if k is not None) or "no columns"


def _column(
    path: Path, record: dict[str, Any], named: str | None, candidates: tuple[str, ...], flag: str
) -> str | None:
    """The record key a column is read from: the named one (exact, else case-insensitive), else the first
    candidate present; None when nothing was named and no candidate is present."""
    keys = {k.lower(): k for k in record if isinstance(k, str)}
    if named is None:
        return next((keys[c] for c in candidates if c in keys), None)
    if named in record:
        return named
    if named.lower() in keys:
        return keys[named.lower()]
    raise MMAgentError(
        f"no column {named!r}; it has: {_listing(record)}",
        file=str(path),
        field=named,
        fix=f"pass one of those columns as {flag} (MCP: {flag[2:].replace('-', '_')})",
    )


def _raw_records(path: Path) -> Iterator[_Raw]:
    suffix = path.suffix.lower()
    if suffix in _CSV:
        return _utf8(path, _csv_records(path))
    if suffix in _JSONL:
        return _utf8(path, _jsonl_records(path))
    if suffix == ".json":
        return _utf8(path, _json_records(path))
    raise MMAgentError(
        f"unknown index format {suffix or '(no suffix)'!r}",
        file=str(path),
        fix="give an index ending in .csv, .tsv, .jsonl or .json",
    )


def _utf8(path: Path, records: Iterator[_Raw]) -> Iterator[_Raw]:
    """The records, with a file that is not UTF-8 (or cannot be read) turned into the user-facing error."""
    last = 0
    try:
        for item in records:
            last = item[0]
            yield item
    except UnicodeDecodeError as exc:
        where = f"after record {last}" if last else "before the first record"
        raise MMAgentError(
            f"not UTF-8 text ({where}: {exc.reason})",
            file=str(path),
            fix=_UTF8_FIX,
        ) from None
    except OSError as exc:
        raise os_error(exc, file=str(path)) from None


def _open(path: Path) -> TextIO:
    """UTF-8, a leading byte-order mark dropped (spreadsheet programs write one)."""
    try:
        return path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise os_error(exc, file=str(path)) from None


def _csv_records(path: Path) -> Iterator[_Raw]:
    with _open(path) as fh:
        header = fh.readline()
        delimiter = max(",\t;", key=header.count)  # ties keep the comma
        fh.seek(0)
        reader = csv.DictReader(fh, delimiter=delimiter)
        for number, row in enumerate(reader, 1):
            if None in row:
                columns = len(reader.fieldnames or [])
                yield (
                    number,
                    _Broken(
                        f"{columns + len(row[None])} fields where the header has {columns} "
                        f"(an unquoted {delimiter!r} inside a value?)"
                    ),
                )
            else:
                yield number, dict(row)


def _parsed(text: str) -> dict[str, Any] | _Broken:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return _Broken(f"not JSON ({exc.msg} at column {exc.colno})")
    return value if isinstance(value, dict) else _Broken(f"a JSON {type(value).__name__}, not an object")


def _jsonl_records(path: Path) -> Iterator[_Raw]:
    with _open(path) as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                yield number, _parsed(line)


def _json_records(path: Path) -> Iterator[_Raw]:
    """A JSON list of objects, or a dict holding one such list; a `.json` file of one object per line is read
    as JSONL (MindSpeed-MM's own data.jsonl files are often named .json)."""
    with _open(path) as fh:
        lines = [line for line in (fh.readline(_PEEK), fh.readline(_PEEK)) if line.strip()]
    if len(lines) == 2 and isinstance(_parsed(lines[0]), dict):
        yield from _jsonl_records(path)
        return
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise MMAgentError(
            f"a {size / MAX_JSON_BYTES:.1f} GiB JSON document is too large to load whole (limit 1 GiB)",
            file=str(path),
            fix="write it as JSONL, one record per line (e.g. jq -c '.[]' in.json > in.jsonl)",
        )
    with _open(path) as fh:
        try:
            document = json.load(fh)
        except json.JSONDecodeError as exc:
            raise MMAgentError(
                f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                file=str(path),
                fix="repair the file (python -m json.tool shows where it breaks), or write it as JSONL",
            ) from None
    records = document
    if isinstance(document, dict):
        lists = [key for key, value in document.items() if isinstance(value, list)]
        if len(lists) != 1:
            raise MMAgentError(
                f"a JSON object holding {len(lists)} lists ({', '.join(map(repr, lists)) or 'none'}), not one list "
                "of records",
                file=str(path),
                fix="make the file a JSON list of records ([{...}, {...}]), or JSONL",
            )
        records = document[lists[0]]
    if not isinstance(records, list):
        raise MMAgentError(
            f"a JSON {type(records).__name__}, not a list of records",
            file=str(path),
            fix="make the file a JSON list of records ([{...}, {...}]), or JSONL",
        )
    for number, value in enumerate(records, 1):
        yield (
            number,
            value if isinstance(value, dict) else _Broken(f"a JSON {type(value).__name__}, not an object"),
        )


def _caption(value: Any) -> str | None:
    """Stripped text; of a list (several captions), the first non-empty one; empty means none."""
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, str) and v.strip()), None)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return (value.strip() or None) if isinstance(value, str) else None


def _rows(raw: Iterator[_Raw], media: str | None, caption: str | None) -> Iterator[IndexRow]:
    for number, record in raw:
        if isinstance(record, _Broken):
            yield IndexRow(line=number, error=record.reason)
            continue
        text = _caption(record.get(caption)) if caption else None
        if media is None:
            yield IndexRow(line=number, media=media_of(record), caption=text, record=record)
            continue
        value = record.get(media)
        paths = [value] if isinstance(value, str) else [] if value is None else value
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            yield IndexRow(
                line=number,
                caption=text,
                record=record,
                error=f"{media!r} is a {type(value).__name__}, not a path",
            )
            continue
        paths = [p.strip() for p in paths if p.strip()]
        if not paths and not any(isinstance(record.get(k), list) for k in _TURN_KEYS):
            yield IndexRow(line=number, caption=text, record=record, error=f"no path in column {media!r}")
            continue
        yield IndexRow(line=number, media=paths, caption=text, record=record)

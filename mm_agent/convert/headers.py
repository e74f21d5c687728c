"""safetensors headers read without torch: names, dtypes, shapes and byte ranges of every tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header, then the raw bytes. Reading only
the header lets the planner (imported by the MCP server, which must not import torch) count keys and bytes
of a multi-GB checkpoint in milliseconds, and gives the streaming reader its offsets.

The header is checked as the safetensors library checks it, before any tensor is viewed: every entry has a
dtype, a shape of non-negative ints and two offsets; each byte range lies inside the data area, holds
exactly shape x dtype size bytes (dtypes known here) and overlaps no other tensor's range. Tensors are
views of the mapped file at these offsets, so a header that breaks a rule would make two tensors share
bytes or read past their own; it is refused naming the file, the tensor and how to check the file.
"""

from __future__ import annotations

import itertools
import json
import shlex
import struct
from dataclasses import dataclass
from pathlib import Path

from mm_agent.errors import MMAgentError

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
# bytes per element of the safetensors dtypes (their names as the format spells them)
ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
    "C64": 8, "C128": 16,
}  # fmt: skip


def check_command(path: Path) -> str:
    """A command that opens the file with the safetensors library itself (what a fix should suggest); the
    path is one shell-quoted argument."""
    code = (
        "import sys; from safetensors import safe_open; "
        'print(len(safe_open(sys.argv[1], "np").keys()), "tensors: the file reads")'
    )
    return f"python -c {shlex.quote(code)} {shlex.quote(str(path))}"


def _fix(path: Path) -> str:
    return (
        f"re-download the file (a partial download, a renamed .bin or a damaged copy cannot be converted); "
        f"check it with `{check_command(path)}`"
    )


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def read_header(path: Path) -> Header:
    """Parse one file's header; a truncated or foreign file is an MMAgentError naming the file."""
    try:
        with path.open("rb") as fh:
            raw_len = fh.read(8)
            size = path.stat().st_size
            (length,) = struct.unpack("<Q", raw_len) if len(raw_len) == 8 else (-1,)
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise ValueError("bad header length")
            raw = json.loads(fh.read(length))  # (UnicodeDecodeError is a ValueError)
    except (OSError, ValueError) as exc:
        raise MMAgentError(
            f"not a readable safetensors file ({exc})", file=str(path), fix=_fix(path)
        ) from exc
    if not isinstance(raw, dict):
        raise MMAgentError(
            f"the header is a JSON {type(raw).__name__}, not an object of tensors",
            file=str(path),
            fix=_fix(path),
        )
    base = 8 + length
    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise MMAgentError("__metadata__ is not an object", file=str(path), fix=_fix(path))
    tensors = {name: _entry(path, name, info, base) for name, info in raw.items()}
    _check_ranges(path, tensors, size)
    return Header(path, tensors, metadata)


def _entry(path: Path, name: str, info: object, base: int) -> TensorInfo:
    """One header entry as a TensorInfo; a malformed entry is refused naming the tensor."""
    problem = None
    if not isinstance(info, dict):
        problem = f"is a JSON {type(info).__name__}, not an object"
    elif not isinstance(info.get("dtype"), str):
        problem = "has no dtype"
    elif not _ints(info.get("shape")) or any(d < 0 for d in info["shape"]):
        problem = f"has shape {info.get('shape')!r}, not a list of non-negative integers"
    elif not _ints(info.get("data_offsets")) or len(info["data_offsets"]) != 2:
        problem = f"has data_offsets {info.get('data_offsets')!r}, not two integers"
    elif not 0 <= info["data_offsets"][0] <= info["data_offsets"][1]:
        problem = f"has data_offsets {info['data_offsets']}: the end lies before the start (or below 0)"
    if problem is not None:
        raise MMAgentError(f"tensor {name!r} {problem}", file=str(path), fix=_fix(path))
    assert isinstance(info, dict)
    start, end = info["data_offsets"]
    shape = tuple(info["shape"])
    itemsize = ITEMSIZE.get(info["dtype"])
    numel = 1
    for dim in shape:
        numel *= dim
    if itemsize is not None and end - start != numel * itemsize:
        raise MMAgentError(
            f"tensor {name!r} is {info['dtype']} {list(shape)} ({numel * itemsize} bytes) but its data_offsets "
            f"[{start}, {end}] span {end - start} bytes",
            file=str(path),
            fix=_fix(path),
        )
    return TensorInfo(info["dtype"], shape, base + start, base + end)


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _check_ranges(path: Path, tensors: dict[str, TensorInfo], size: int) -> None:
    """Every byte range inside the file's data area, and no two of them sharing a byte (empty ones aside)."""
    for name, info in tensors.items():
        if info.end > size:
            raise MMAgentError(
                f"tensor {name!r} ends past the end of the file (truncated download?)",
                file=str(path),
                fix=_fix(path),
            )
    ranges = sorted((info.start, info.end, name) for name, info in tensors.items() if info.end > info.start)
    for (_, prev_end, prev), (start, end, name) in itertools.pairwise(ranges):
        if start < prev_end:
            raise MMAgentError(
                f"tensors {prev!r} and {name!r} overlap: their data_offsets share "
                f"{min(end, prev_end) - start} byte(s), so one would read the other's weights",
                file=str(path),
                fix=_fix(path),
            )


def safetensors_files(directory: Path, field: str = "source") -> list[Path]:
    """The `*.safetensors` files of an HF dir (top level only: the Wan in-place form keeps release/ and
    mm-agent's temp dirs beside them), sorted; MindSpeed-MM's message when there are none."""
    if not directory.is_dir():
        raise MMAgentError(
            f"Directory not found: {directory}",
            field=field,
            fix="pass the Hugging Face model dir (for Wan diffusers repos: its transformer/ dir)",
        )
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if not files:
        raise MMAgentError(
            f"No .safetensors files found in directory: {directory}",
            field=field,
            fix="download the safetensors weights into it (for Wan diffusers repos pass the transformer/ dir)",
        )
    return files

"""safetensors headers read without torch: names, dtypes, shapes and byte ranges of every tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header, then the raw bytes. Reading only
the header lets the planner (imported by the MCP server, which must not import torch) count keys and bytes
of a multi-GB checkpoint in milliseconds, and gives the streaming reader its offsets.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from mm_agent.errors import MMAgentError

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit


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
            raw = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        raise MMAgentError(
            f"not a readable safetensors file ({exc})",
            file=str(path),
            fix="re-download the file; a partial download or a renamed .bin cannot be converted",
        ) from exc
    base = 8 + length
    metadata = raw.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    for name, info in raw.items():
        start, end = info["data_offsets"]
        if base + end > size:
            raise MMAgentError(
                f"tensor {name!r} ends past the end of the file (truncated download?)",
                file=str(path),
                fix="re-download the file",
            )
        tensors[name] = TensorInfo(info["dtype"], tuple(info["shape"]), base + start, base + end)
    return Header(path, tensors, metadata)


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

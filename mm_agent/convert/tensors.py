"""Streaming tensor IO with bounded anonymous memory.

mm-convert loads every file whole into one dict (plus a deep copy per TP rank), so host memory grows with
the model. Here source tensors are views of memory-mapped files (`torch.frombuffer` over a private read-only
mapping of a safetensors file, `torch.load(mmap=True)` for `.pt`): their pages belong to the page cache, which
the kernel can drop, not to the process. Writers stream those pages straight to the output. Tensors that must
be computed (merges, strided TP slices) go to `Scratch`, a file-backed allocator in the temp dir, so they are
not anonymous memory either. `torch.save` writes a tensor's whole storage, so every tensor handed to it must
own its storage exactly (`own_storage`), otherwise a view would drag its base tensor into the file.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import itertools
import json
import mmap
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mm_agent.convert.headers import Header, TensorInfo, read_header
from mm_agent.errors import MMAgentError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsFile:
    """Zero-copy reader: `get(name)` is a tensor over the file's mapped pages (no bytes copied)."""

    def __init__(self, path: Path, header: Header | None = None):
        self.header = header or read_header(path)
        with path.open("rb") as fh:
            # ACCESS_COPY: a private mapping, so torch sees a writable buffer, yet the file can never be
            # modified through it; unwritten pages stay shared with the page cache.
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)

    def keys(self) -> list[str]:
        return list(self.header.tensors)

    def get(self, name: str) -> torch.Tensor:
        return tensor_at(self._map, self.header.tensors[name])


def tensor_at(buffer: mmap.mmap, info: TensorInfo) -> torch.Tensor:
    dtype = DTYPES.get(info.dtype)
    if dtype is None:
        raise MMAgentError(
            f"unsupported safetensors dtype {info.dtype}",
            fix=f"convert the weights to one of {', '.join(DTYPES)} first",
        )
    count = info.nbytes // dtype.itemsize
    if count == 0:
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=count, offset=info.start).view(info.shape)


def _safe_globals() -> list[Any]:
    """Types Megatron training saves pickle beside the weights: `args` (argparse.Namespace) and the numpy
    RNG state. Allowing exactly these keeps `weights_only=True` (no arbitrary code runs on load) while
    reading real training checkpoints, not just converted ones."""
    allowed: list[Any] = [argparse.Namespace]
    try:
        import numpy as np
    except ImportError:
        return allowed
    core = getattr(np, "_core", None) or np.core
    return [*allowed, core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_pt(path: Path) -> dict[str, Any]:
    """Load a `model_optim_rng.pt` memory-mapped: tensors stay file-backed until touched."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, OSError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MMAgentError(
            f"cannot load the checkpoint file: {first}",
            file=str(path),
            fix="pass a Megatron checkpoint saved by torch>=2.1 (zip format) that holds only tensors and "
            "plain values; re-save it with `torch.save({'model': state_dict}, path)` otherwise",
        ) from exc
    if not isinstance(obj, dict):
        raise MMAgentError(
            f"holds a {type(obj).__name__}, not a dict", file=str(path), fix="pass a Megatron checkpoint"
        )
    return obj


class Scratch:
    """File-backed allocator: tensors live in shared mappings of files under `directory`.

    Dirty pages of a shared file mapping are written back to the file under memory pressure instead of
    counting as anonymous memory, so merged or sliced tensors cost disk, not RAM. `clear()` after each
    output file keeps the disk use to one rank file's worth.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self._files: list[Path] = []
        self._counter = itertools.count()

    def empty(self, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(shape)
        numel = 1
        for n in shape:
            numel *= n
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"t{next(self._counter)}.bin"
        self._files.append(path)
        # blocks allocated now: a full disk is an ENOSPC here, not a SIGBUS when a page is first written
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, numel * dtype.itemsize)
        finally:
            os.close(fd)
        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        out = self.empty(tensor.shape, tensor.dtype)
        out.copy_(tensor)
        return out

    def clear(self) -> None:
        """Unlink the files; mappings still referenced stay valid until their tensors are freed."""
        for path in self._files:
            path.unlink(missing_ok=True)
        self._files.clear()


def owns_storage(tensor: torch.Tensor) -> bool:
    return (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )


def own_storage(tensor: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """`tensor` itself when it owns its storage exactly, else a file-backed copy (see module doc)."""
    return tensor if owns_storage(tensor) else scratch.copy(tensor)


class FileMaps:
    """Which file, at which offset, holds a tensor's bytes: a snapshot of this process's file mappings.

    Source tensors are views of mapped files (safetensors, `.pt` loaded with mmap, `Scratch` files), so
    writers can have the kernel copy file to file (`copy_into`) instead of reading the pages in and
    writing them out again. The file is opened through `/proc/self/map_files/`, i.e. the very file that is
    mapped, even if its path was since replaced. A private mapping only counts while none of its pages were
    copied on write (`Anonymous: 0 kB` in smaps): then memory and file agree byte for byte.
    """

    def __init__(self, maps: list[tuple[int, int, int, str]]):
        self._maps = maps  # start, end, file offset, the map_files entry

    @classmethod
    def snapshot(cls) -> FileMaps:
        maps: list[tuple[int, int, int, str]] = []
        try:
            with open("/proc/self/smaps", encoding="utf-8", errors="replace") as fh:
                current: tuple[int, int, int, str] | None = None
                for line in fh:
                    head = line.split(maxsplit=5)
                    if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                        start, end = (int(x, 16) for x in head[0].split("-"))
                        file_backed = head[4] != "0" and len(head) == 6 and head[5].startswith("/")
                        entry = f"/proc/self/map_files/{head[0]}"
                        current = (start, end, int(head[2], 16), entry) if file_backed else None
                    elif head[0] == "Anonymous:" and current is not None:
                        if head[1] == "0":
                            maps.append(current)
                        current = None
        except OSError:  # no procfs: every tensor is written from memory
            return cls([])
        return cls(maps)

    def locate(self, tensor: torch.Tensor) -> tuple[str, int] | None:
        """(openable path of the mapped file, file offset) of a contiguous tensor's bytes, if one mapping
        holds them all."""
        ptr = tensor.data_ptr()
        end = ptr + tensor.numel() * tensor.element_size()
        for start, stop, offset, entry in self._maps:
            if start <= ptr and end <= stop:
                return entry, offset + ptr - start
        return None


# copy_file_range cannot serve these file pairs (another filesystem, an old kernel, a special file)
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ETXTBSY}


def copy_into(tensor: torch.Tensor, fd: int, offset: int, maps: FileMaps) -> None:
    """Put a contiguous tensor's bytes at `offset` of the open file `fd`: copied by the kernel from the file
    it is mapped from when there is one (no page passes through this process), else written from memory."""
    if not tensor.is_contiguous():
        raise ValueError("only contiguous tensors can be streamed")
    nbytes = tensor.numel() * tensor.element_size()
    where = maps.locate(tensor) if nbytes else None
    if where is not None and _kernel_copy(where, fd, offset, nbytes):
        return
    view = _bytes_of(tensor)
    done = 0
    while done < nbytes:
        done += os.pwrite(fd, view[done:], offset + done)


def _kernel_copy(where: tuple[str, int], fd: int, offset: int, nbytes: int) -> bool:
    """False when the kernel cannot do it (map_files not openable here, copy_file_range refused)."""
    entry, src_offset = where
    try:
        src = os.open(entry, os.O_RDONLY)
    except OSError:
        return False
    done = 0
    try:
        while done < nbytes:
            step = os.copy_file_range(src, fd, nbytes - done, src_offset + done, offset + done)
            if step == 0:
                raise MMAgentError(
                    f"{os.readlink(entry)} ended while copying from it (truncated by another process?)",
                    fix="re-run the conversion",
                )
            done += step
        return True
    except OSError as exc:
        if exc.errno in _NO_KERNEL_COPY and done == 0:
            return False
        raise
    finally:
        os.close(src)


NONFINITE_CHUNK = 1 << 22  # elements checked at once: temporaries (a float8 upcast, bool masks) stay small


def nonfinite(tensor: torch.Tensor) -> tuple[int, int]:
    """(NaN count, Inf count) of a floating tensor, read in chunks (no whole-tensor temporaries); (0, 0) for
    other dtypes. Most tensors are all finite, which the sum of a chunk shows (NaN and Inf propagate through
    it; one reduction, no mask per element): only a chunk whose sum is not finite is counted exactly."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return 0, 0
    flat = tensor.reshape(-1)
    nan = inf = 0
    for start in range(0, flat.numel(), NONFINITE_CHUNK):
        chunk = flat[start : start + NONFINITE_CHUNK]
        if chunk.dtype.itemsize == 1:  # float8: no CPU kernels for these checks
            chunk = chunk.float()
        wide = torch.float64 if chunk.dtype == torch.float64 else torch.float32  # fp16 sums overflow in fp16
        if bool(torch.isfinite(chunk.sum(dtype=wide))):
            continue
        nan += int(torch.isnan(chunk).sum())
        inf += int(torch.isinf(chunk).sum())
    return nan, inf


class NonFinite:
    """The tensors a conversion wrote that hold NaN or Inf: converted as they are, reported as a warning.

    A checkpoint saved after the loss diverged, or damaged in transit, converts without error, and the
    training that loads it fails much later with a NaN loss; the report says so now, naming the tensors.
    Each name is checked once (TP ranks read the same source tensor again)."""

    MAX_LISTED = 10

    def __init__(self) -> None:
        self.found: dict[str, tuple[int, int]] = {}
        self._seen: set[str] = set()

    def check(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name not in self._seen:
            self._seen.add(name)
            nan, inf = nonfinite(tensor)
            if nan or inf:
                self.found[name] = (nan, inf)
        return tensor

    def warnings(self) -> list[str]:
        if not self.found:
            return []

        def counts(nan: int, inf: int) -> str:
            return ", ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)

        listed = [f"{name} ({counts(*c)})" for name, c in list(self.found.items())[: self.MAX_LISTED]]
        more = len(self.found) - len(listed)
        return [
            f"{len(self.found)} tensor(s) hold NaN or Inf values, converted as they are: {', '.join(listed)}"
            + (f" and {more} more" if more else "")
            + "; training from them gives a NaN loss: check the source (a checkpoint saved after the loss "
            "diverged, or a damaged download: re-download or re-export it)"
        ]


def tensor_crc32(tensor: torch.Tensor) -> int:
    """CRC-32 (zip's) of a contiguous tensor's bytes, read through its mapping."""
    return zlib.crc32(_bytes_of(tensor))


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a view of the mapped or allocated memory)."""
    if not tensor.is_contiguous():
        raise ValueError("only contiguous tensors can be streamed")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> int:
    """Stream a safetensors file: the header, then each tensor's bytes in turn. Returns the file size.

    `safetensors.torch.save_file` serialises the whole file into one buffer first (the file's size in
    anonymous memory); this writes from the tensors' own pages instead.
    """
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    starts = []
    for name, tensor in tensors:
        if tensor.dtype not in _NAMES:
            raise MMAgentError(f"{name}: dtype {tensor.dtype} has no safetensors name", fix="cast it first")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        starts.append(offset)
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    path.parent.mkdir(parents=True, exist_ok=True)
    maps = FileMaps.snapshot()
    with path.open("wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        fh.flush()
        start = 8 + len(raw)
        for (_, tensor), at in zip(tensors, starts, strict=True):
            copy_into(tensor, fh.fileno(), start + at, maps)
    return path.stat().st_size


def write_index(path: Path, weight_map: dict[str, str], total_size: int) -> None:
    """`*.safetensors.index.json` as diffusers/transformers write it."""
    body = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")

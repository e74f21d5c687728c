"""Rank files (`model_optim_rng.pt`) written at copy speed, still exactly what `torch.save` writes.

`torch.save` pushes every tensor through user space and checksums it with miniz's CRC-32: about 0.6 GB/s
here, against 3-4 GB/s for `cp`, so on a 2.8 GB transformer it is most of the conversion. Yet the tensors of
a rank file are nearly all renamed source tensors that already sit in a file. So:

1. `torch.save` under `torch.serialization.skip_data()` writes the pickle and the whole zip structure, with
   the data records left as holes (the file is sparse) and their CRC-32 fields zero;
2. each data record is filled by the kernel (`tensors.copy_into`: `copy_file_range` from the file the tensor
   is mapped from, or a write from memory when it is not file-backed);
3. each record's CRC-32 (zlib, ~5 GB/s) goes into its data descriptor and its central-directory entry;
4. `.data/serialization_id` is rewritten as torch computes it: 20 digits hashing the record names (left as
   `torch.save` wrote them: the names are the same) and 20 digits folding the CRC-32 of every earlier
   non-empty record with c10::hash_combine in write order (torch folded zeros for the skipped records).

The result is the zip `torch.save` writes, byte for byte (tests/fidelity/test_converters.py compares it
with MindSpeed-MM's own rank files): it loads with
`torch.load` (mmap or not, with torch's computed storage offsets too) and passes `zipfile.testzip`. The
record of each tensor is found by reading back the pickle torch wrote, not by assuming its key order;
anything in it this module does not know (a tensor subclass, a future pickle form) makes it write with plain
`torch.save` instead.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from mm_agent.convert.tensors import FileMaps, copy_into, tensor_crc32

_DESCRIPTOR = b"PK\x07\x08"
_CENTRAL = b"PK\x01\x02"
_CENTRAL_CRC = 16  # offset of the CRC-32 in a central-directory entry
_LOCAL = struct.Struct("<4s22xHH")  # local file header: signature ... name length, extra length


def save_pt(path: Path, obj: dict[str, Any]) -> int:
    """Write `obj` (dicts of plain CPU tensors and plain values) like `torch.save`. Returns the file size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.serialization.skip_data():
        torch.save(obj, path)
    if not _fill(path, obj):
        torch.save(obj, path)
    return path.stat().st_size


@dataclass(frozen=True)
class _StorageRef:
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]


class _Unknown(Exception):
    """The pickle holds something other than dicts, plain tensors and plain values."""


class _Reader(pickle.Unpickler):
    """Reads torch's `data.pkl` into the same structure with `_TensorRef`s in place of tensors."""

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Unknown(f"persistent id {pid!r}")
        return _StorageRef(key=str(pid[2]), numel=int(pid[4]))

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        raise _Unknown(f"{module}.{name}")


def _rebuild(storage: _StorageRef, offset: int, size: tuple[int, ...], *_: Any) -> _TensorRef:
    return _TensorRef(storage, offset, tuple(size))


def _pairs(mine: Any, read: Any, out: dict[str, torch.Tensor]) -> None:
    """Walk the object and its read-back pickle together: record key -> the tensor that owns it."""
    if isinstance(mine, torch.Tensor):
        if type(mine) is not torch.Tensor or not isinstance(read, _TensorRef) or not mine.is_contiguous():
            raise _Unknown(f"{type(mine).__name__} that is not a plain contiguous tensor")
        if read.offset != 0 or read.size != tuple(mine.shape) or read.storage.numel != mine.numel():
            raise _Unknown(f"record {read.storage.key} does not own its tensor exactly")
        seen = out.setdefault(read.storage.key, mine)
        if seen is not mine and seen.data_ptr() != mine.data_ptr():
            raise _Unknown(f"record {read.storage.key} holds two tensors")
    elif isinstance(mine, dict):
        if not isinstance(read, dict) or list(mine) != list(read):
            raise _Unknown("dict keys differ")
        for key, value in mine.items():
            _pairs(value, read[key], out)
    elif isinstance(mine, (list, tuple)):
        if not isinstance(read, (list, tuple)) or len(mine) != len(read):
            raise _Unknown("sequence lengths differ")
        for a, b in zip(mine, read, strict=True):
            _pairs(a, b, out)


def _fill(path: Path, obj: dict[str, Any]) -> bool:
    """Fill the data records of a `skip_data` save and set their CRCs; False (nothing written) when the
    file is not laid out as expected."""
    slots = _slots(path, obj)
    if slots is None:
        return False
    maps = FileMaps.snapshot()
    fd = os.open(path, os.O_RDWR)
    # The CRCs read the source pages on another core while the kernel copies them here.
    with ThreadPoolExecutor(1) as pool:
        crcs = pool.map(tensor_crc32, [s.tensor for s in slots])
        try:
            for slot in slots:
                copy_into(slot.tensor, fd, slot.data, maps)
            for slot, crc in zip(slots, crcs, strict=True):
                packed = struct.pack("<I", crc)
                os.pwrite(fd, packed, slot.data + slot.nbytes + 4)
                os.pwrite(fd, packed, slot.central + _CENTRAL_CRC)
            _serialization_id(fd)
        finally:
            os.close(fd)
    return True


_SERIALIZATION_ID = "/.data/serialization_id"
_MASK64 = (1 << 64) - 1


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64-bit size_t."""
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _MASK64) + (seed >> 2)) & _MASK64)) & _MASK64


def _serialization_id(fd: int) -> None:
    """Rewrite `.data/serialization_id` from the final CRC-32s, as torch's PyTorchStreamWriter computes it.
    A file without one, or with one not laid out as torch writes it (40 stored digits followed by a data
    descriptor), is left as it is: torch.load does not check it."""
    with os.fdopen(os.dup(fd), "rb") as fh, zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        central = _central_entries(fh, zf.start_dir, len(infos))
        seed = 0
        for info in infos:
            if info.filename.endswith(_SERIALIZATION_ID):
                break
            if info.file_size:  # torch folds the CRC of non-empty records only
                seed = _hash_combine(seed, info.CRC)
        else:
            return
        if info.file_size != 40 or info.compress_type != zipfile.ZIP_STORED or info.filename not in central:
            return
        fh.seek(info.header_offset)
        signature, name_len, extra_len = _LOCAL.unpack(fh.read(_LOCAL.size))
        data = info.header_offset + _LOCAL.size + name_len + extra_len
        fh.seek(data)
        old = fh.read(40)
        if signature != b"PK\x03\x04" or not old.isdigit() or fh.read(4) != _DESCRIPTOR:
            return
    new = old[:20] + f"{seed:020d}".encode("ascii")
    packed = struct.pack("<I", zlib.crc32(new))
    os.pwrite(fd, new, data)
    os.pwrite(fd, packed, data + 40 + 4)
    os.pwrite(fd, packed, central[info.filename] + _CENTRAL_CRC)


@dataclass(frozen=True)
class _Slot:
    tensor: torch.Tensor
    nbytes: int
    data: int  # file offset of the record's bytes; its data descriptor follows them
    central: int  # file offset of its central-directory entry


def _slots(path: Path, obj: dict[str, Any]) -> list[_Slot] | None:
    """Where each non-empty tensor's record lies, checked against the pickle and the zip headers."""
    with path.open("rb") as fh, zipfile.ZipFile(fh) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkl = next((n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1), None)
        if pkl is None:
            return None
        archive = pkl.split("/", 1)[0]
        try:
            read = _Reader(io.BytesIO(zf.read(pkl))).load()
            tensors: dict[str, torch.Tensor] = {}
            _pairs(obj, read, tensors)
        except (_Unknown, pickle.UnpicklingError):
            return None
        records = {f"{archive}/data/{key}": tensor for key, tensor in tensors.items()}
        if set(records) != {n for n in infos if n.startswith(f"{archive}/data/")}:
            return None
        central = _central_entries(fh, zf.start_dir, len(infos))
        slots = []
        for name, tensor in records.items():
            nbytes = tensor.numel() * tensor.element_size()
            info = infos[name]
            if info.file_size != nbytes or name not in central:
                return None
            if nbytes == 0:
                continue  # torch writes no descriptor for an empty record, and its CRC is 0
            fh.seek(info.header_offset)
            signature, name_len, extra_len = _LOCAL.unpack(fh.read(_LOCAL.size))
            data = info.header_offset + _LOCAL.size + name_len + extra_len
            fh.seek(data + nbytes)
            if signature != b"PK\x03\x04" or fh.read(4) != _DESCRIPTOR:
                return None
            slots.append(_Slot(tensor, nbytes, data, central[name]))
    return slots


def _central_entries(fh: BinaryIO, start: int, count: int) -> dict[str, int]:
    """File offset of each central-directory entry, by name (what `zipfile` reads but does not expose)."""
    out: dict[str, int] = {}
    fh.seek(start)
    pos = start
    for _ in range(count):
        head = fh.read(46)
        if head[:4] != _CENTRAL:
            break
        name_len, extra_len, comment_len = struct.unpack("<HHH", head[28:34])
        name = fh.read(name_len).decode("utf-8")
        fh.seek(extra_len + comment_len, os.SEEK_CUR)
        out[name] = pos
        pos += 46 + name_len + extra_len + comment_len
    return out

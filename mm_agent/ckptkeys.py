"""The tensor names and shapes a checkpoint holds, read without torch and without running its pickles.

`validate_configs` and `render_job` say how many of a model's parameters a checkpoint would fill, and they
run where torch is not imported (the MCP server). Three layouts are read:

- a Megatron rank file (`torch.save` zip: `<name>/data.pkl` + storages, MindSpeed-MM's `model_optim_rng.pt`):
  only the pickle is read, by an unpickler whose `find_class` returns plain records for every class and
  function the pickle names (`torch._utils._rebuild_tensor_v2` becomes a record of the tensor's size), so no
  code of the file's choosing runs and no storage is loaded;
- a torch DCP checkpoint (`.metadata`, the pickle of `torch.distributed.checkpoint.metadata.Metadata`), read
  the same way: its `state_dict_metadata` maps each flattened name to a record holding the global size;
- safetensors files and their index (`mm_agent.convert.headers`: the JSON header only).

A file that is not what it should be raises `CheckpointUnreadable` with the reason; callers turn it into a
finding or skip the check. Sizes are bounded: a pickle larger than `MAX_PICKLE` is not read.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mm_agent.convert.headers import read_header, safetensors_files
from mm_agent.errors import MMAgentError
from mm_agent.paths import open_file, read_file

MAX_PICKLE = 256 * 1024 * 1024  # a rank file's data.pkl: names and sizes, a few MiB even for 100B models
Shapes = dict[str, tuple[int, ...]]


class CheckpointUnreadable(Exception):
    """The file is not a checkpoint of the expected layout (the message says why)."""


class _Record:
    """Whatever a pickle constructs: its name, the arguments it was called with and the state set on it. Pickle's
    NEWOBJ makes one without calling `__init__`, so every attribute has a class default. Hashed by identity:
    records are dict keys in DCP metadata."""

    kind: str = ""
    args: tuple[Any, ...] = ()
    state: Any = None

    def __init__(self, kind: str = "", args: tuple[Any, ...] = ()) -> None:
        self.kind, self.args = kind, args

    @property
    def items(self) -> dict[Any, Any]:
        """What SETITEMS / APPENDS put in it (a dict or list subclass the pickle names)."""
        found = self.__dict__.get("_items")
        if found is None:
            found = self.__dict__["_items"] = {}
        return found

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.items[len(self.items)] = value

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def attr(self, name: str) -> Any:
        state = self.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict state, slot state)
        return state.get(name) if isinstance(state, dict) else None


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]


def _maker(kind: str) -> Any:
    """A stand-in for a class or function the pickle names: calling it records the call."""

    class Made(_Record):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(kind, args)

    Made.__name__ = kind.rsplit(".", 1)[-1] or "Record"
    return Made


def _rebuild_tensor(storage: Any, offset: Any, size: Any, *rest: Any) -> _Tensor:
    return _Tensor(tuple(int(n) for n in size) if isinstance(size, (tuple, list)) else ())


def _size(values: Any = ()) -> tuple[int, ...]:
    return tuple(int(n) for n in values)


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    """copyreg's `_reconstructor`, for our records only (a dataclass or object pickled by protocol 0/1)."""
    return cls() if isinstance(cls, type) and issubclass(cls, _Record) else _Record("object")


_SAFE: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): lambda data, *rest: data,
    ("torch._utils", "_rebuild_parameter_with_state"): lambda data, *rest: data,
    ("torch", "Size"): _size,
    ("collections", "OrderedDict"): dict,
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("copyreg", "_reconstructor"): _reconstructor,
}


class _Unpickler(pickle.Unpickler):
    """Builds only records: every global the pickle names is a stand-in (or one of the plain containers and
    tensor-size readers of `_SAFE`), so nothing of the file's choosing is imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        return _SAFE.get((module, name)) or _maker(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return _Record("storage", (pid,))


def _unpickle(data: bytes, what: str) -> Any:
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed pickle: it is not a checkpoint we can read
        raise CheckpointUnreadable(f"{what} is not a readable pickle ({type(exc).__name__}: {exc})") from exc


def _tensors(state: Any, prefix: str = "") -> Shapes:
    """Flattened `name -> shape` of the tensors in a (nested) state dict."""
    out: Shapes = {}
    if isinstance(state, _Record) and state.items:
        state = state.items
    if not isinstance(state, dict):
        return out
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, _Tensor):
            out[name] = value.shape
        elif isinstance(value, dict) or (isinstance(value, _Record) and value.items):
            out.update(_tensors(value, name + "."))
    return out


def _open(path: Path, root: Path | None) -> BinaryIO:
    """A regular file opened without blocking on a FIFO, inside `root` when one is given (`paths.open_file`)."""
    try:
        return open_file(path, root, "checkpoint")
    except MMAgentError as exc:
        raise CheckpointUnreadable(exc.message) from exc


def rank_file_tensors(path: Path, root: Path | None = None) -> dict[str, Shapes]:
    """The model state dicts of one Megatron rank file: {"model": {name: shape}} (and "model0", "model1", ...
    for virtual pipeline chunks), read from its pickle only."""
    try:
        with _open(path, root) as fh, zipfile.ZipFile(fh) as zf:
            names = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                raise CheckpointUnreadable(f"{path} holds no data.pkl (not a torch.save zip)")
            info = zf.getinfo(names[0])
            if info.file_size > MAX_PICKLE:
                raise CheckpointUnreadable(
                    f"{path}: its pickle is {info.file_size} bytes, more than is read here"
                )
            data = zf.read(names[0])
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointUnreadable(f"{path} is not a torch.save zip ({exc})") from exc
    top = _unpickle(data, str(path))
    if not isinstance(top, dict):
        raise CheckpointUnreadable(f"{path} does not hold a dict of state dicts")
    return {str(k): _tensors(v) for k, v in top.items() if isinstance(k, str) and k.startswith("model")}


def dcp_tensors(folder: Path, root: Path | None = None) -> Shapes:
    """`name -> global shape` of every tensor a DCP checkpoint folder (its `.metadata`) records."""
    meta = folder / ".metadata"
    try:
        data = read_file(meta, root, "checkpoint", limit=MAX_PICKLE)
    except MMAgentError as exc:
        raise CheckpointUnreadable(exc.message) from exc
    top = _unpickle(data, str(meta))
    entries = top.attr("state_dict_metadata") if isinstance(top, _Record) else None
    if not isinstance(entries, dict):
        raise CheckpointUnreadable(f"{meta} has no state_dict_metadata (not a torch DCP checkpoint)")
    out: Shapes = {}
    for name, entry in entries.items():
        shape = entry.attr("size") if isinstance(entry, _Record) else None
        if isinstance(name, str) and isinstance(shape, tuple):  # tensors; bytes entries have no size
            out[name] = shape
    return out


def safetensors_tensors(folder: Path, root: Path | None = None) -> Shapes:
    """`name -> shape` of every tensor in a folder's safetensors files (headers only)."""
    out: Shapes = {}
    try:
        files = safetensors_files(folder)
        for path in files:
            _open(
                path, root
            ).close()  # a regular file inside the workspace (a FIFO would block the header read)
            for name, info in read_header(path).tensors.items():
                out[name] = tuple(info.shape)
    except MMAgentError as exc:
        raise CheckpointUnreadable(exc.message) from exc
    return out

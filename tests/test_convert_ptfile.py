"""Rank files written by the kernel copy path are the zip `torch.save` writes, and stay correct when the copy
cannot be used (copy-on-write pages, no copy_file_range, objects the writer does not know)."""

from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from mm_agent.convert import tensors as tensors_mod  # noqa: E402
from mm_agent.convert.ptfile import save_pt  # noqa: E402
from mm_agent.convert.tensors import (  # noqa: E402
    FileMaps,
    SafetensorsFile,
    Scratch,
    load_pt,
    write_safetensors,
)


@pytest.fixture
def mapped(tmp_path: Path) -> dict[str, Any]:
    """Tensors of every origin a converter hands the writer: mapped safetensors, scratch, plain memory."""
    gen = torch.Generator().manual_seed(0)
    source = {
        "big": torch.randn(300, 257, generator=gen).to(torch.bfloat16),  # odd sizes: records end unaligned
        "small": torch.randn(5, generator=gen),
        "ints": torch.arange(11, dtype=torch.int64),
    }
    save_file(source, str(tmp_path / "src.safetensors"))
    reader = SafetensorsFile(tmp_path / "src.safetensors")
    scratch = Scratch(tmp_path / "scratch")
    return {
        "reader": reader,
        "source": source,
        "scratch": scratch,
        "tensors": {
            **{k: reader.get(k) for k in source},
            "scratch": scratch.copy(torch.linspace(0, 1, 999)),
            "memory": torch.randn(17, 3, generator=gen),
            "empty": torch.zeros(0),
            "scalar": torch.tensor(3.5),
        },
    }


def _crcs(path: Path) -> dict[str, tuple[int, int]]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename.split("/", 1)[1]: (i.CRC, i.file_size) for i in zf.infolist()}


def _assert_same(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert sorted(loaded) == sorted(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_same(loaded[key], value)
        elif isinstance(value, torch.Tensor):
            assert value.dtype == loaded[key].dtype and torch.equal(loaded[key], value), key
        else:
            assert loaded[key] == value


def test_rank_file_is_torch_saves_zip(mapped: dict[str, Any], tmp_path: Path) -> None:
    t = mapped["tensors"]
    obj = {"model0": t, "model1": {"w": t["memory"] * 2}, "checkpoint_version": 3.0}
    size = save_pt(tmp_path / "ours" / "model_optim_rng.pt", obj)
    (tmp_path / "ref").mkdir()
    torch.save(obj, tmp_path / "ref" / "model_optim_rng.pt")
    ours, ref = tmp_path / "ours" / "model_optim_rng.pt", tmp_path / "ref" / "model_optim_rng.pt"
    assert size == ours.stat().st_size == ref.stat().st_size
    with zipfile.ZipFile(ours) as zf:
        assert zf.testzip() is None  # every CRC-32 matches its bytes
    # byte for byte, the serialization id included (torch derives it from the record names and CRC-32s)
    assert ours.read_bytes() == ref.read_bytes()
    assert _crcs(ours) == _crcs(ref)
    for mmap_load in (False, True):
        _assert_same(torch.load(ours, mmap=mmap_load, weights_only=True), obj)
    # torch's optional fast path computes record offsets from miniz's layout instead of reading headers
    from torch.utils.serialization import config

    old = config.load.calculate_storage_offsets
    config.load.calculate_storage_offsets = True
    try:
        _assert_same(torch.load(ours, mmap=True, weights_only=True), obj)
    finally:
        config.load.calculate_storage_offsets = old


def test_mapped_tensors_are_located_in_their_files(mapped: dict[str, Any], tmp_path: Path) -> None:
    reader, t = mapped["reader"], mapped["tensors"]
    maps = FileMaps.snapshot()
    found = maps.locate(t["big"])
    assert found is not None
    path, offset = found
    assert os.path.samefile(path, tmp_path / "src.safetensors")
    assert offset == reader.header.tensors["big"].start
    scratch = maps.locate(t["scratch"])
    assert scratch is not None and Path(os.readlink(scratch[0])).parent == tmp_path / "scratch"
    assert maps.locate(t["memory"]) is None
    # a rank file loaded with mmap (resplit, mm_to_hf sources): located at its record's bytes
    torch.save({"model": {"w": t["memory"]}}, tmp_path / "r.pt")
    loaded = load_pt(tmp_path / "r.pt")["model"]["w"]
    where = FileMaps.snapshot().locate(loaded)
    assert where is not None and os.path.samefile(where[0], tmp_path / "r.pt")
    with (tmp_path / "r.pt").open("rb") as fh:
        fh.seek(where[1])
        assert fh.read(loaded.nbytes) == t["memory"].numpy().tobytes()


def test_copied_on_write_pages_are_written_from_memory(mapped: dict[str, Any], tmp_path: Path) -> None:
    """A private mapping whose pages were written no longer matches its file: the file must not be used."""
    changed = mapped["tensors"]["big"]
    changed[0, :4] = 42.0  # copy-on-write: memory now differs from src.safetensors
    assert FileMaps.snapshot().locate(changed) is None
    save_pt(tmp_path / "r.pt", {"model": {"big": changed}})
    back = torch.load(tmp_path / "r.pt", weights_only=True)["model"]["big"]
    assert torch.equal(back, changed) and not torch.equal(back, mapped["source"]["big"])
    assert load_file(tmp_path / "src.safetensors")["big"][0, 0] != 42.0  # the source file is untouched


def test_without_copy_file_range_bytes_are_written(
    mapped: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def refuse(*args: Any) -> int:
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(tensors_mod.os, "copy_file_range", refuse)
    obj = {"model": mapped["tensors"]}
    save_pt(tmp_path / "r.pt", obj)
    write_safetensors(tmp_path / "x.safetensors", list(mapped["tensors"].items()), {"format": "pt"})
    assert calls  # the kernel copy was tried, refused, and the bytes written from memory instead
    with zipfile.ZipFile(tmp_path / "r.pt") as zf:
        assert zf.testzip() is None
    _assert_same(torch.load(tmp_path / "r.pt", weights_only=True), obj)
    _assert_same(load_file(tmp_path / "x.safetensors"), mapped["tensors"])


def test_objects_it_does_not_know_go_through_torch_save(tmp_path: Path) -> None:
    param = torch.nn.Parameter(torch.randn(4, 4))  # pickled through _rebuild_parameter, not a plain tensor
    save_pt(tmp_path / "r.pt", {"model": {"p": param, "t": torch.ones(2)}})
    with zipfile.ZipFile(tmp_path / "r.pt") as zf:
        assert zf.testzip() is None
    back = torch.load(tmp_path / "r.pt", weights_only=True)["model"]
    assert torch.equal(back["p"], param.detach()) and torch.equal(back["t"], torch.ones(2))


def test_shared_storage_written_once(tmp_path: Path) -> None:
    t = torch.arange(6.0)
    save_pt(tmp_path / "r.pt", {"model": {"a": t, "b": t}})
    back = torch.load(tmp_path / "r.pt", weights_only=True)["model"]
    assert torch.equal(back["a"], t) and back["a"].data_ptr() == back["b"].data_ptr()


def test_safetensors_written_by_kernel_copy_load(mapped: dict[str, Any], tmp_path: Path) -> None:
    items = list(mapped["tensors"].items())
    write_safetensors(tmp_path / "x.safetensors", items, {"format": "pt"})
    _assert_same(load_file(tmp_path / "x.safetensors"), dict(items))


def test_non_contiguous_tensor_goes_through_torch_save(tmp_path: Path) -> None:
    t = torch.arange(12.0).reshape(3, 4).t()  # owns its whole storage, but not in row-major order
    save_pt(tmp_path / "r.pt", {"model": {"t": t}})
    back = torch.load(tmp_path / "r.pt", weights_only=True)["model"]["t"]
    assert torch.equal(back, t) and back.stride() == t.stride()


def test_a_source_replaced_after_mapping_is_still_read_from_the_mapped_file(
    mapped: dict[str, Any], tmp_path: Path
) -> None:
    """Someone re-downloads the source mid-conversion: the copy comes from the file that is mapped (the one
    the tensors show), never from whatever now sits at its path."""
    other = {k: torch.zeros_like(v) for k, v in mapped["source"].items()}
    save_file(other, str(tmp_path / "new.safetensors"))
    os.replace(tmp_path / "new.safetensors", tmp_path / "src.safetensors")
    tensors = {k: mapped["tensors"][k] for k in mapped["source"]}
    assert all(FileMaps.snapshot().locate(v) is not None for v in tensors.values())
    save_pt(tmp_path / "r.pt", {"model": tensors})
    _assert_same(torch.load(tmp_path / "r.pt", weights_only=True), {"model": mapped["source"]})

"""Issue 25 (low): conversion trusted its inputs. Overlapping `data_offsets` (two tensors sharing bytes), a
transposed or reshaped tensor (its shape not what config.json implies) and NaN weights were converted and a
manifest written as if all was well; a malformed header was a bare KeyError/TypeError without a fix; a
disk that filled up during a conversion was reported as torch's "unexpected pos" or a raw OSError.

Real tiny checkpoints: diffusers `WanTransformer3DModel`s and a transformers `Qwen2_5_VLForConditionalGeneration`
saved with `save_pretrained` (dims chosen all different, so a transposed tensor changes shape), then edited
on disk: headers rewritten by hand, one tensor transposed or reshaped, NaN/Inf written into weights. The full
disk is a real tmpfs mounted for the test, with just the room the plan's estimate asks for.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from mm_agent.convert import ConvertRequest, convert_weights, final_report  # noqa: E402
from mm_agent.convert.atomic import TEMP_TAG, Staging  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.manifest import MANIFEST  # noqa: E402
from mm_agent.convert.plan import plan_conversion  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402
from mm_agent.runs import RunStatusRequest, run_status  # noqa: E402

WAN_FILE = "diffusion_pytorch_model.safetensors"
QWEN_FILE = "model.safetensors"


# ---------------------------------------------------------------------------------------------------------
# tiny real checkpoints


def _wan(path: Path, kind: str = "i2v") -> Path:
    """Wan DiT with every dim distinct: inner 16 (2 heads x 8), text 12, freq 10, ffn 24, image 20."""
    extra: dict[str, Any] = {"image_dim": 20, "added_kv_proj_dim": 20} if kind == "i2v" else {}
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=3,
        text_dim=12, freq_dim=10, ffn_dim=24, num_layers=2, rope_max_seq_len=32, **extra,
    )  # fmt: skip
    model.save_pretrained(path)
    return path


def _qwen(path: Path) -> Path:
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2,
        },
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 40},
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpt")
    return {"wan": _wan(base / "wan"), "wan_t2v": _wan(base / "wan_t2v", "t2v"), "qwen": _qwen(base / "qwen")}


@pytest.fixture
def wan(originals: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(originals["wan"], tmp_path / "wan"))


@pytest.fixture
def qwen(originals: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(originals["qwen"], tmp_path / "qwen"))


def _req(converter: str, source: Path, target: Path, **kw: Any) -> ConvertRequest:
    return ConvertRequest(
        converter=converter, method="hf_to_mm", source=str(source), target=str(target), confirm=True, **kw
    )


def wan_req(source: Path, target: Path, **kw: Any) -> ConvertRequest:
    return _req("WanConverter", source, target, **kw)


def qwen_req(source: Path, target: Path, **kw: Any) -> ConvertRequest:
    return _req("Qwen2_5_VLConverter", source, target, **kw)


def read_raw(path: Path) -> tuple[dict[str, Any], bytes]:
    """A safetensors file as (header dict, data area bytes), read by hand."""
    blob = path.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def write_raw(path: Path, header: Any, data: bytes) -> None:
    """A safetensors file written by hand: 8-byte length, the JSON header (padded to 8), the data area."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def edit_tensor(path: Path, name: str, change: Any) -> None:
    """Rewrite one tensor of a safetensors file (`change(tensor) -> tensor`), keeping the file's metadata."""
    tensors = load_file(path)
    tensors[name] = change(tensors[name]).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def refusal(req: ConvertRequest) -> MMAgentError:
    """The dry run and the confirmed run both refuse, and nothing is written."""
    with pytest.raises(MMAgentError) as planned:
        plan_conversion(req)
    with pytest.raises(MMAgentError) as ran:
        execute(req)
    assert planned.value.render() == ran.value.render()
    assert not Path(req.target).exists(), "a refused conversion wrote its target"
    return ran.value


# ---------------------------------------------------------------------------------------------------------
# safetensors headers


def test_overlapping_data_offsets_are_refused(wan: Path, tmp_path: Path) -> None:
    """Two tensors pointing at the same bytes (a crafted or corrupted header): refused naming both."""
    header, data = read_raw(wan / WAN_FILE)
    a, b = "blocks.0.attn1.to_q.bias", "blocks.0.attn1.to_k.bias"
    assert header[a]["shape"] == header[b]["shape"] == [16]
    header[b]["data_offsets"] = list(header[a]["data_offsets"])
    write_raw(wan / WAN_FILE, header, data)
    error = refusal(wan_req(wan, tmp_path / "mm"))
    assert error.file == str(wan / WAN_FILE)
    assert a in error.message and b in error.message and "overlap" in error.message
    assert error.fix is not None and "re-download" in error.fix and "python -c" in error.fix


def test_offsets_that_do_not_fit_the_shape_are_refused(wan: Path, tmp_path: Path) -> None:
    """A tensor whose byte range is not shape x dtype size (the reader would view other tensors' bytes)."""
    header, data = read_raw(wan / WAN_FILE)
    name = "blocks.1.ffn.net.2.bias"  # F32 [16]: 64 bytes
    start, end = header[name]["data_offsets"]
    assert end - start == 64
    header[name]["shape"] = [8]  # 32 bytes declared over a 64-byte range
    write_raw(wan / WAN_FILE, header, data)
    error = refusal(wan_req(wan, tmp_path / "mm"))
    assert error.file == str(wan / WAN_FILE) and name in error.message
    assert "64" in error.message and "32" in error.message


@pytest.mark.parametrize(
    "breakage",
    [
        "a JSON list",
        "no data_offsets",
        "offsets not numbers",
        "negative shape",
        "end before start",
        "not UTF-8",
    ],
)
def test_malformed_header_names_the_file_and_the_fix(wan: Path, tmp_path: Path, breakage: str) -> None:
    header, data = read_raw(wan / WAN_FILE)
    name = "proj_out.bias"
    entry = header[name]
    if breakage == "a JSON list":
        header = [entry]
    elif breakage == "no data_offsets":
        del entry["data_offsets"]
    elif breakage == "offsets not numbers":
        entry["data_offsets"] = ["0", "12"]
    elif breakage == "negative shape":
        entry["shape"] = [-12]
    elif breakage == "end before start":
        entry["data_offsets"] = entry["data_offsets"][::-1]
    if breakage == "not UTF-8":
        raw = b'{"a": "\xff"}' + b" " * 4
        (wan / WAN_FILE).write_bytes(len(raw).to_bytes(8, "little") + raw)
    else:
        write_raw(wan / WAN_FILE, header, data)
    error = refusal(wan_req(wan, tmp_path / "mm"))
    assert error.file == str(wan / WAN_FILE), error.render()
    assert error.fix is not None and "re-download" in error.fix
    assert "python -c" in error.fix and WAN_FILE in error.fix  # a command that checks the file


# ---------------------------------------------------------------------------------------------------------
# shapes against config.json


def test_wan_transposed_or_reshaped_tensor_is_refused(wan: Path, tmp_path: Path) -> None:
    """ffn.net.0.proj is [ffn_dim, inner] = [24, 16]: stored [16, 24] it is refused, key and shapes named."""
    key = "blocks.1.ffn.net.0.proj.weight"
    edit_tensor(wan / WAN_FILE, key, lambda t: t.t())
    error = refusal(wan_req(wan, tmp_path / "mm"))
    assert key in error.message and "[24, 16]" in error.message and "[16, 24]" in error.message
    assert error.file == str(wan / WAN_FILE) and error.fix and "config.json" in error.fix

    # the same number of elements in another shape: time_proj is [6 x inner, inner] = [96, 16]
    fresh = Path(shutil.copytree(wan, tmp_path / "wan2", ignore=shutil.ignore_patterns(WAN_FILE)))
    shutil.copy(wan / WAN_FILE, fresh / WAN_FILE)
    edit_tensor(fresh / WAN_FILE, key, lambda t: t.t())  # back as it was
    edit_tensor(fresh / WAN_FILE, "condition_embedder.time_proj.weight", lambda t: t.reshape(48, 32))
    error = refusal(wan_req(fresh, tmp_path / "mm2"))
    assert "condition_embedder.time_proj.weight" in error.message
    assert "[96, 16]" in error.message and "[48, 32]" in error.message


def test_qwen_transposed_or_reshaped_tensor_is_refused(qwen: Path, tmp_path: Path) -> None:
    """down_proj is [hidden, intermediate] = [64, 96]; the merger's last linear [out_hidden, 4 x vision
    hidden] = [40, 128]. Both a renamed and a merged input are checked, by their HF names."""
    edit_tensor(qwen / QWEN_FILE, "model.layers.1.mlp.down_proj.weight", lambda t: t.t())
    edit_tensor(qwen / QWEN_FILE, "visual.merger.mlp.2.weight", lambda t: t.reshape(128, 40))
    edit_tensor(qwen / QWEN_FILE, "model.layers.0.self_attn.k_proj.weight", lambda t: t.reshape(64, 32))
    error = refusal(qwen_req(qwen, tmp_path / "mm"))
    for key, want, found in (
        ("model.layers.1.mlp.down_proj.weight", "[64, 96]", "[96, 64]"),
        ("visual.merger.mlp.2.weight", "[40, 128]", "[128, 40]"),
        ("model.layers.0.self_attn.k_proj.weight", "[32, 64]", "[64, 32]"),
    ):
        assert key in error.message and want in error.message and found in error.message, error.message
    assert error.file == str(qwen / QWEN_FILE)


def test_every_tensor_of_real_checkpoints_has_an_expected_shape(originals: dict[str, Path]) -> None:
    """The table is complete for what diffusers/transformers write (no tensor goes unchecked), and the
    untouched checkpoints pass it: expectations come from config.json + the mapping table, not from a test."""
    from mm_agent.convert.mapping import load_mapping
    from mm_agent.convert.native import read_hf_source
    from mm_agent.convert.shapes import expected_shapes
    from mm_agent.convert.vlm import Dims, to_canonical

    for name, converter in (
        ("wan", "WanConverter"),
        ("wan_t2v", "WanConverter"),
        ("qwen", "Qwen2_5_VLConverter"),
    ):
        source = read_hf_source(originals[name])
        mapping = load_mapping(converter)
        assert mapping.shapes is not None and source.config is not None
        values = Dims.from_config(source.config).values if converter.startswith("Qwen") else source.config
        found = {to_canonical(k, mapping): info.shape for k, (_, info) in source.where.items()}
        expected = expected_shapes(mapping.shapes, list(found), values)
        assert set(expected) == set(found), sorted(set(found) - set(expected))
        assert expected == found


# ---------------------------------------------------------------------------------------------------------
# NaN / Inf: a warning, not a refusal


def test_nan_and_inf_weights_are_a_warning_naming_the_tensors(wan: Path, qwen: Path, tmp_path: Path) -> None:
    def poison(value: float, count: int) -> Any:
        def change(t: Any) -> Any:
            t = t.clone()
            t.view(-1)[:count] = value
            return t

        return change

    edit_tensor(wan / WAN_FILE, "blocks.0.attn1.to_v.weight", poison(math.nan, 3))
    edit_tensor(wan / WAN_FILE, "proj_out.bias", poison(math.inf, 1))
    report = execute(wan_req(wan, tmp_path / "mm"))
    assert report.status == "converted" and (tmp_path / "mm" / MANIFEST).is_file()
    text = "\n".join(report.warnings)
    assert "blocks.0.attn1.to_v.weight (3 NaN)" in text and "proj_out.bias (1 Inf)" in text
    assert "2 tensor(s)" in text

    # Qwen: a merged input (q of the fused QKV) named by its HF key, once although every TP rank reads it
    edit_tensor(qwen / QWEN_FILE, "model.layers.1.self_attn.q_proj.weight", poison(math.nan, 2))
    report = execute(qwen_req(qwen, tmp_path / "qmm", tp=2))
    assert report.status == "converted"
    assert "model.layers.1.self_attn.q_proj.weight (2 NaN)" in "\n".join(report.warnings)
    assert "1 tensor(s)" in "\n".join(report.warnings)

    clean = execute(wan_req(tmp_path / "mm", tmp_path / "hf_back").model_copy(update={"method": "mm_to_hf"}))
    assert clean.status == "converted" and "blocks.0.attn1.to_v.weight" in "\n".join(clean.warnings)


# ---------------------------------------------------------------------------------------------------------
# a disk that fills up while converting


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """`mount(bytes)` -> a fresh tmpfs of that size (unmounted afterwards); skipped where mounting is not
    permitted (needs root, or CAP_SYS_ADMIN)."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (root/CAP_SYS_ADMIN needed): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _page_up(n: int) -> int:
    return (n + 4095) // 4096 * 4096


def test_full_disk_during_conversion_is_reported_as_a_full_disk(
    originals: dict[str, Path], ws: Path, small_disk: Any
) -> None:
    """The plan's estimate counts tensor bytes only, so a disk with just that much room passes the check and
    fills up while the rank file, the manifest and the tracker are written. The real worker reports it as
    the full disk it is, with the fix, and leaves no temp dir behind."""
    source = originals["wan_t2v"]
    req = wan_req(source, Path("/nonexistent"))
    need = plan_conversion(req.model_copy(update={"target": str(ws / "probe"), "confirm": False}))
    assert need.estimate is not None
    disk = small_disk(_page_up(need.estimate.output_bytes) + 4096)
    started = convert_weights(req.model_copy(update={"target": str(disk / "mm")}))
    assert started.run_id is not None
    deadline = time.monotonic() + 120
    while (status := run_status(RunStatusRequest(run_id=started.run_id))).state == "running":
        assert time.monotonic() < deadline, "the conversion did not finish"
        time.sleep(0.2)
    report = final_report(status, started.plan)
    assert report.status == "failed"
    assert "no space left on the device" in report.message, report.message
    assert "fix: free disk space" in report.message
    assert "unexpected pos" not in report.message and "unexpected" not in report.message
    assert str(disk / "mm") in report.message
    assert os.listdir(disk) == [], "a temp dir or partial target was left on the full disk"


def test_torch_writer_failing_on_a_full_disk_is_reported_as_a_full_disk(ws: Path, small_disk: Any) -> None:
    """torch.save's PytorchStreamWriter says only "unexpected pos N vs M" when a write fails: the staging
    area checks the free space then and reports ENOSPC (the OS's own OSError is mapped the same way)."""
    disk = small_disk(16384)
    with pytest.raises(MMAgentError) as full, Staging(disk / "mm") as staging:
        torch.save({"w": torch.zeros(100_000)}, staging.dir / "model_optim_rng.pt")
    assert full.value.message == "no space left on the device"
    assert full.value.fix is not None and "free disk space" in full.value.fix
    assert full.value.file == str(disk / "mm")
    assert [p for p in disk.iterdir() if TEMP_TAG in p.name] == []

    with pytest.raises(MMAgentError) as full, Staging(disk / "mm") as staging:
        (staging.dir / "blob").write_bytes(b"\0" * 100_000)
    assert full.value.message == "no space left on the device"

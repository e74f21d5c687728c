"""WanConverter natively: exact MindSpeed-MM layout, bitwise round trips, atomicity, bad inputs.

Tiny diffusers `WanTransformer3DModel`s (4 blocks) are built from configs and saved with `save_pretrained`,
sharded and unsharded, for t2v, i2v (image embedder + add_k/add_v) and flf2v (pos_embed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from mm_agent.convert.atomic import SLOW_ENV, TEMP_TAG  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.manifest import MANIFEST, read_manifest  # noqa: E402
from mm_agent.convert.mapping import MAPPINGS_DIR, load_mapping  # noqa: E402
from mm_agent.convert.plan import plan_conversion  # noqa: E402
from mm_agent.convert.schema import ConvertReport, ConvertRequest  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402

TRACKER = "latest_checkpointed_iteration.txt"

# MM wandit names, written out here (not derived from the table under test): reference §2.4.
PRE_T2V = {
    "patch_embedding.weight", "patch_embedding.bias",
    "text_embedding.linear_1.weight", "text_embedding.linear_1.bias",
    "text_embedding.linear_2.weight", "text_embedding.linear_2.bias",
    "time_embedding.0.weight", "time_embedding.0.bias",
    "time_embedding.2.weight", "time_embedding.2.bias",
    "time_projection.1.weight", "time_projection.1.bias",
}  # fmt: skip
IMG_EMB = {f"img_emb.proj.{i}.{p}" for i in (0, 1, 3, 4) for p in ("weight", "bias")}
POST = {"head.head.weight", "head.head.bias", "head.modulation"}
BLOCK_T2V = {
    "modulation", "norm3.weight", "norm3.bias",
    "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias",
    *(f"{a}.proj_{p}.{w}" for a in ("self_attn", "cross_attn") for p in "qkv" for w in ("weight", "bias")),
    *(f"{a}.proj_out.{w}" for a in ("self_attn", "cross_attn") for w in ("weight", "bias")),
    *(f"{a}.{n}_norm.weight" for a in ("self_attn", "cross_attn") for n in "qk"),
}  # fmt: skip
BLOCK_I2V = {"cross_attn.k_img.weight", "cross_attn.k_img.bias", "cross_attn.v_img.weight",
             "cross_attn.v_img.bias", "cross_attn.k_norm_img.weight"}  # fmt: skip
# A few renames spelled out exactly as the reference's worked examples (HF -> MM).
EXAMPLES = {
    "blocks.0.attn1.to_q.weight": "blocks.0.self_attn.proj_q.weight",
    "blocks.0.attn2.to_out.0.bias": "blocks.0.cross_attn.proj_out.bias",
    "blocks.3.ffn.net.0.proj.weight": "blocks.3.ffn.0.weight",
    "blocks.3.norm2.weight": "blocks.3.norm3.weight",
    "blocks.3.scale_shift_table": "blocks.3.modulation",
    "scale_shift_table": "head.modulation",
    "proj_out.weight": "head.head.weight",
    "condition_embedder.time_proj.weight": "time_projection.1.weight",
}
I2V_EXAMPLES = {
    "blocks.1.attn2.add_k_proj.weight": "blocks.1.cross_attn.k_img.weight",
    "blocks.1.attn2.add_v_proj.bias": "blocks.1.cross_attn.v_img.bias",
    "blocks.1.attn2.norm_added_k.weight": "blocks.1.cross_attn.k_norm_img.weight",
    "condition_embedder.image_embedder.norm1.weight": "img_emb.proj.0.weight",
    "condition_embedder.image_embedder.norm2.bias": "img_emb.proj.4.bias",
    "condition_embedder.image_embedder.ff.net.0.proj.weight": "img_emb.proj.1.weight",
}


def expected_keys(kind: str) -> tuple[set[str], set[str]]:
    """(top-level MM keys, per-block MM suffixes) of a tiny model of this kind."""
    pre = (
        PRE_T2V | (IMG_EMB if kind != "t2v" else set()) | ({"img_emb.emb_pos"} if kind == "flf2v" else set())
    )
    block = BLOCK_T2V | (BLOCK_I2V if kind != "t2v" else set())
    return pre | POST, block


def build(kind: str, seed: int = 0) -> Any:
    extra: dict[str, Any] = {}
    if kind in ("i2v", "flf2v"):
        extra = {"image_dim": 16, "added_kv_proj_dim": 16}
    if kind == "flf2v":
        extra["pos_embed_seq_len"] = 8
    torch.manual_seed(seed)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=4, rope_max_seq_len=32, **extra,
    )  # fmt: skip
    with torch.no_grad():  # LayerNorm/RMSNorm weights start at 1: make every tensor distinct
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


_CACHE: dict[tuple[str, bool, str], Path] = {}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`get(kind, sharded, dtype)` -> a saved tiny transformer dir (built once per module)."""
    base = tmp_path_factory.mktemp("hf")

    def get(kind: str = "t2v", sharded: bool = False, dtype: str = "float32") -> Path:
        key = (kind, sharded, dtype)
        if key not in _CACHE:
            path = base / f"{kind}-{'sharded' if sharded else 'single'}-{dtype}"
            model = build(kind).to(getattr(torch, dtype))
            model.save_pretrained(path, max_shard_size="20KB" if sharded else "10GB")
            _CACHE[key] = path
        return _CACHE[key]

    return get


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def convert(method: str, source: Path, target: Path, **kw: Any) -> ConvertReport:
    req = ConvertRequest(
        converter="WanConverter", method=method, source=str(source), target=str(target), **kw
    )
    return execute(req)


def hf_tensors(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def rank(target: Path, name: str) -> dict[str, Any]:
    return torch.load(target / "release" / name / "model_optim_rng.pt", weights_only=True)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def assert_bitwise(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------------------------------------------------
# layouts


@pytest.mark.parametrize("kind", ["t2v", "i2v", "flf2v"])
def test_hf_to_mm_pp1_exact_layout_and_keys(hf_models: Any, tmp_path: Path, kind: str) -> None:
    src = hf_models(kind)
    before = digests(src)
    report = convert("hf_to_mm", src, tmp_path / "mm")
    assert report.status == "converted"
    assert files_under(tmp_path / "mm") == {TRACKER, MANIFEST, "release/mp_rank_00/model_optim_rng.pt"}
    assert (tmp_path / "mm" / TRACKER).read_bytes() == b"release"
    obj = rank(tmp_path / "mm", "mp_rank_00")
    assert list(obj) == ["model"]
    top, block = expected_keys(kind)
    want = top | {f"blocks.{i}.{s}" for i in range(4) for s in block}
    assert set(obj["model"]) == want
    hf = hf_tensors(src)
    for hf_name, mm_name in {**EXAMPLES, **(I2V_EXAMPLES if kind != "t2v" else {})}.items():
        assert torch.equal(obj["model"][mm_name], hf[hf_name]), hf_name
    if kind == "flf2v":
        assert torch.equal(obj["model"]["img_emb.emb_pos"], hf["condition_embedder.image_embedder.pos_embed"])
    assert report.keys_converted == len(want) == len(hf)
    assert digests(src) == before


def test_hf_to_mm_lists_keys_in_mindspeed_mm_order(hf_models: Any, tmp_path: Path) -> None:
    """MindSpeed-MM's `_replace_state_dict` appends the exactly renamed keys after the others, in the order of
    its `hf_to_mm_convert_mapping`; the rank file lists them so (and then pickles byte for byte alike)."""
    convert("hf_to_mm", hf_models("i2v"), tmp_path / "mm")
    keys = list(rank(tmp_path / "mm", "mp_rank_00")["model"])
    tail = [
        "text_embedding.linear_1.bias", "text_embedding.linear_1.weight",
        "text_embedding.linear_2.bias", "text_embedding.linear_2.weight",
        "time_embedding.0.bias", "time_embedding.0.weight", "time_embedding.2.bias", "time_embedding.2.weight",
        "time_projection.1.bias", "time_projection.1.weight",
        "img_emb.proj.1.weight", "img_emb.proj.1.bias", "img_emb.proj.3.weight", "img_emb.proj.3.bias",
        "img_emb.proj.0.weight", "img_emb.proj.0.bias", "img_emb.proj.4.weight", "img_emb.proj.4.bias",
        "head.modulation", "head.head.bias", "head.head.weight",
    ]  # fmt: skip
    assert keys[-len(tail) - 2 :] == ["patch_embedding.bias", "patch_embedding.weight", *tail]
    assert keys[:2] == ["blocks.0.self_attn.k_norm.weight", "blocks.0.self_attn.q_norm.weight"]


def test_hf_to_mm_pp2_places_pre_post_and_renumbers(hf_models: Any, tmp_path: Path) -> None:
    src = hf_models("i2v", sharded=True)
    report = convert("hf_to_mm", src, tmp_path / "mm", pp_layers=[1, 3])
    # the image embedder's LayerNorms stay on stage 0, which mm-convert loses: the plan says so, from the table
    assert [n for n in report.plan.notes if "wan-i2v-image-embedder-norms" in n]
    assert not [n for n in plan_conversion(ConvertRequest(
        converter="WanConverter", method="hf_to_mm", source=str(src), target=str(tmp_path / "pp1")
    )).notes if "deviation" in n]  # fmt: skip
    assert [f.path for f in report.files] == [
        "release/mp_rank_00_000/model_optim_rng.pt",
        "release/mp_rank_00_001/model_optim_rng.pt",
    ]
    assert [f.layers for f in report.files] == [[[0]], [[1, 2, 3]]]
    assert files_under(tmp_path / "mm") == {TRACKER, MANIFEST, *(f.path for f in report.files)}
    top, block = expected_keys("i2v")
    first, last = rank(tmp_path / "mm", "mp_rank_00_000"), rank(tmp_path / "mm", "mp_rank_00_001")
    assert list(first) == list(last) == ["model"]
    # i2v image-embedder LayerNorms (img_emb.proj.0/4) stay, on the first stage with the rest of img_emb
    assert set(first["model"]) == (top - POST) | {f"blocks.0.{s}" for s in block}
    assert set(last["model"]) == POST | {f"blocks.{i}.{s}" for i in range(3) for s in block}
    hf = hf_tensors(src)
    assert torch.equal(last["model"]["blocks.2.self_attn.proj_q.weight"], hf["blocks.3.attn1.to_q.weight"])
    assert torch.equal(
        last["model"]["blocks.0.cross_attn.k_img.weight"], hf["blocks.1.attn2.add_k_proj.weight"]
    )
    assert torch.equal(
        first["model"]["img_emb.proj.4.weight"], hf["condition_embedder.image_embedder.norm2.weight"]
    )
    manifest = read_manifest(tmp_path / "mm")
    assert manifest is not None and manifest.pp_layers == [1, 3] and manifest.tp == 1 and manifest.vpp == 1
    assert manifest.key_count == len(hf) and set(manifest.source_files) >= {"config.json"}


def test_hf_to_mm_vpp_is_chunk_major(hf_models: Any, tmp_path: Path) -> None:
    src = hf_models("flf2v")
    report = convert("hf_to_mm", src, tmp_path / "mm", pp_layers=[[1, 1], [1, 1]])
    assert [f.layers for f in report.files] == [[[0], [2]], [[1], [3]]]
    s0, s1 = rank(tmp_path / "mm", "mp_rank_00_000"), rank(tmp_path / "mm", "mp_rank_00_001")
    for obj in (s0, s1):
        assert set(obj) == {"model0", "model1", "checkpoint_version"} and obj["checkpoint_version"] == 3.0
    top, block = expected_keys("flf2v")
    only_block0 = {f"blocks.0.{s}" for s in block}
    assert set(s0["model0"]) == (top - POST) | only_block0
    assert set(s0["model1"]) == set(s1["model0"]) == only_block0
    assert set(s1["model1"]) == POST | only_block0
    hf = hf_tensors(src)
    for obj, chunk, layer in ((s0, 0, 0), (s1, 0, 1), (s0, 1, 2), (s1, 1, 3)):
        assert torch.equal(
            obj[f"model{chunk}"]["blocks.0.ffn.2.weight"], hf[f"blocks.{layer}.ffn.net.2.weight"]
        )
    manifest = read_manifest(tmp_path / "mm")
    assert manifest is not None and manifest.vpp == 2 and manifest.pp_layers == [[1, 1], [1, 1]]
    # one stage with two chunks: upstream's dir name has no _PPP suffix, the file still holds model0/model1
    single = convert("hf_to_mm", src, tmp_path / "one", pp_layers=[[2], [2]])
    assert files_under(tmp_path / "one") == {TRACKER, MANIFEST, "release/mp_rank_00/model_optim_rng.pt"}
    assert set(rank(tmp_path / "one", "mp_rank_00")) == {"model0", "model1", "checkpoint_version"}
    assert single.files[0].layers == [[0, 1], [2, 3]]


# ---------------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize(
    ("kind", "sharded", "dtype", "pp_layers"),
    [
        ("t2v", False, "float32", None),
        ("i2v", True, "float32", [1, 3]),
        ("flf2v", True, "bfloat16", [[1, 1], [1, 1]]),
        ("i2v", False, "bfloat16", [[2], [2]]),
    ],
)
def test_round_trip_is_bitwise_and_loads(
    hf_models: Any, tmp_path: Path, kind: str, sharded: bool, dtype: str, pp_layers: Any
) -> None:
    src = hf_models(kind, sharded, dtype)
    before = digests(src)
    convert("hf_to_mm", src, tmp_path / "mm", pp_layers=pp_layers)
    mm_before = digests(tmp_path / "mm")
    report = convert("mm_to_hf", tmp_path / "mm", tmp_path / "back", hf_dir=str(src))
    assert report.status == "converted" and not report.keys_dropped
    assert_bitwise(hf_tensors(src), hf_tensors(tmp_path / "back"))
    weights = {p.name for p in src.iterdir() if "safetensors" in p.name}
    assert {p.name for p in (tmp_path / "back").iterdir()} == weights | {"config.json", MANIFEST}
    assert (tmp_path / "back" / "config.json").read_bytes() == (src / "config.json").read_bytes()
    loaded = diffusers.WanTransformer3DModel.from_pretrained(tmp_path / "back")
    original = diffusers.WanTransformer3DModel.from_pretrained(src)
    assert_bitwise(original.state_dict(), loaded.state_dict())
    assert digests(src) == before and digests(tmp_path / "mm") == mm_before


def test_mm_to_hf_without_hf_dir_uses_manifest(hf_models: Any, tmp_path: Path) -> None:
    src = hf_models("i2v", sharded=True)
    convert("hf_to_mm", src, tmp_path / "mm", pp_layers=[2, 2])
    report = convert("mm_to_hf", tmp_path / "mm", tmp_path / "back")
    assert "mm_agent_manifest.json" in report.message
    assert_bitwise(hf_tensors(src), hf_tensors(tmp_path / "back"))
    diffusers.WanTransformer3DModel.from_pretrained(tmp_path / "back")


def test_mm_to_hf_of_foreign_checkpoint_needs_hf_dir(hf_models: Any, tmp_path: Path) -> None:
    """A checkpoint without a manifest (e.g. a training save) takes config and sharding from --hf-dir."""
    src = hf_models("t2v")
    convert("hf_to_mm", src, tmp_path / "mm")
    (tmp_path / "mm" / MANIFEST).unlink()
    with pytest.raises(MMAgentError) as err:
        convert("mm_to_hf", tmp_path / "mm", tmp_path / "back")
    assert err.value.field == "hf_dir" and err.value.fix and "--hf-dir" in err.value.fix
    assert not (tmp_path / "back").exists()
    convert("mm_to_hf", tmp_path / "mm", tmp_path / "back", hf_dir=str(src))
    assert {p.name for p in (tmp_path / "back").iterdir()} == {
        "config.json",
        "diffusion_pytorch_model.safetensors",
        MANIFEST,
    }
    assert_bitwise(hf_tensors(src), hf_tensors(tmp_path / "back"))


def test_mm_to_hf_of_a_training_save(hf_models: Any, tmp_path: Path) -> None:
    """Training saves sit in iter_NNNNNNN/ with args (a Namespace) and RNG state beside the weights."""
    import argparse
    import random

    import numpy as np

    src = hf_models("i2v")
    convert("hf_to_mm", src, tmp_path / "conv", pp_layers=[2, 2])
    save = tmp_path / "save"
    for name in ("mp_rank_00_000", "mp_rank_00_001"):
        model = rank(tmp_path / "conv", name)["model"]
        obj = {
            "args": argparse.Namespace(tensor_model_parallel_size=1, params_dtype=torch.float32),
            "iteration": 5,
            "checkpoint_version": 3.0,
            "model": model,
            "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state()}],
        }
        (save / "iter_0000005" / name).mkdir(parents=True)
        torch.save(obj, save / "iter_0000005" / name / "model_optim_rng.pt")
    (save / TRACKER).write_text("5")
    convert("mm_to_hf", save, tmp_path / "back", hf_dir=str(src))
    assert_bitwise(hf_tensors(src), hf_tensors(tmp_path / "back"))


def test_resplit_chain_is_bitwise(hf_models: Any, tmp_path: Path) -> None:
    src = hf_models("i2v", sharded=True)
    convert("hf_to_mm", src, tmp_path / "pp1")
    r2 = convert("resplit", tmp_path / "pp1", tmp_path / "pp2", pp_layers=[3, 1])
    assert [f.layers for f in r2.files] == [[[0, 1, 2]], [[3]]]
    r3 = convert("resplit", tmp_path / "pp2", tmp_path / "vpp", pp_layers=[[1, 1], [1, 1]])
    assert [f.layers for f in r3.files] == [[[0], [2]], [[1], [3]]]
    direct = tmp_path / "vpp-direct"
    convert("hf_to_mm", src, direct, pp_layers=[[1, 1], [1, 1]])
    for name in ("mp_rank_00_000", "mp_rank_00_001"):
        a, b = rank(tmp_path / "vpp", name), rank(direct, name)
        assert a["checkpoint_version"] == b["checkpoint_version"] == 3.0
        assert_bitwise(a["model0"], b["model0"])
        assert_bitwise(a["model1"], b["model1"])
    r4 = convert("resplit", tmp_path / "vpp", tmp_path / "back", pp_layers=None)
    assert [f.path for f in r4.files] == ["release/mp_rank_00/model_optim_rng.pt"]
    assert_bitwise(
        rank(tmp_path / "pp1", "mp_rank_00")["model"], rank(tmp_path / "back", "mp_rank_00")["model"]
    )
    manifest = read_manifest(tmp_path / "back")
    assert manifest is not None and manifest.direction == "resplit" and manifest.hf_config is not None
    # the original HF config travels through resplits: mm_to_hf needs no --hf-dir
    convert("mm_to_hf", tmp_path / "back", tmp_path / "hf")
    assert_bitwise(hf_tensors(src), hf_tensors(tmp_path / "hf"))


# ---------------------------------------------------------------------------------------------------------
# in place, re-runs, kills


def test_in_place_form_rerun_and_conflict(hf_models: Any, tmp_path: Path) -> None:
    work = copy_of(hf_models("i2v", sharded=True), tmp_path / "transformer")
    before = digests(work)
    report = convert("hf_to_mm", work, work, pp_layers=[2, 2])
    assert report.status == "converted"
    added = files_under(work) - set(before)
    assert added == {TRACKER, MANIFEST, *(f.path for f in report.files)}
    assert {k: v for k, v in digests(work).items() if k in before} == before
    assert (work / TRACKER).read_text() == "release"
    again = convert("hf_to_mm", work, work, pp_layers=[2, 2])
    assert again.status == "unchanged" and "nothing to do" in again.message
    same = ConvertRequest(
        converter="WanConverter", method="hf_to_mm", source=str(work), target=str(work), pp_layers=[2, 2]
    )
    assert any("already holds this conversion" in n for n in plan_conversion(same).notes)
    with pytest.raises(MMAgentError) as err:  # the dry run already refuses a conflicting re-run
        plan_conversion(same.model_copy(update={"pp_layers": [1, 3]}))
    assert (
        err.value.field == "target" and "pp_layers: existing [2, 2] vs requested [1, 3]" in err.value.message
    )
    with pytest.raises(MMAgentError) as err:
        convert("hf_to_mm", work, work, pp_layers=[1, 3])
    assert (
        err.value.field == "target" and "pp_layers: existing [2, 2] vs requested [1, 3]" in err.value.message
    )
    assert err.value.fix and "release" in err.value.fix
    assert {k: v for k, v in digests(work).items() if k in before} == before
    # the export finds config.json beside release/ (the in-place form keeps the originals)
    convert("mm_to_hf", work, tmp_path / "back")
    assert_bitwise(hf_tensors(work), hf_tensors(tmp_path / "back"))
    assert not [p for p in work.iterdir() if TEMP_TAG in p.name]


def test_rerun_with_changed_source_is_an_error(hf_models: Any, tmp_path: Path) -> None:
    src = copy_of(hf_models("t2v"), tmp_path / "hf")
    convert("hf_to_mm", src, tmp_path / "mm")
    model = build("t2v", seed=1)
    model.save_pretrained(src)
    with pytest.raises(MMAgentError) as err:
        convert("hf_to_mm", src, tmp_path / "mm")
    assert "source files differ" in err.value.message


def test_foreign_checkpoint_in_target_is_refused(hf_models: Any, tmp_path: Path) -> None:
    target = tmp_path / "mm"
    target.mkdir()
    (target / TRACKER).write_text("release")
    with pytest.raises(MMAgentError) as err:
        convert("hf_to_mm", hf_models("t2v"), target)
    assert err.value.field == "target" and "did not write" in err.value.message


KILL_SCRIPT = """
import sys
from mm_agent.convert.engine import execute
from mm_agent.convert.schema import ConvertRequest
execute(ConvertRequest(converter="WanConverter", method="hf_to_mm", source=sys.argv[1], target=sys.argv[2],
                       pp_layers=[1, 1, 1, 1]))
"""


def _kill_midway(src: Path, target: Path, started: list[subprocess.Popen[bytes]]) -> None:
    """Start a conversion that sleeps after each rank file, SIGKILL it once the first file is staged."""
    env = {**os.environ, SLOW_ENV: "30"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(src), str(target)], env=env)
    started.append(proc)
    staged: list[Path] = []
    while not staged and proc.poll() is None:
        time.sleep(0.05)
        staged = list(target.parent.glob(f"**/*{TEMP_TAG}*/release/*/model_optim_rng.pt"))
    assert proc.poll() is None, "the conversion ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_killed_run_leaves_nothing_valid(hf_models: Any, tmp_path: Path, started: Any) -> None:
    src = hf_models("t2v")
    target = tmp_path / "mm"
    _kill_midway(src, target, started)
    assert not target.exists()  # staged beside it; nothing renamed into place
    report = convert("hf_to_mm", src, target, pp_layers=[1, 1, 1, 1])
    assert report.status == "converted"
    assert not [p for p in tmp_path.iterdir() if TEMP_TAG in p.name]  # the dead run's temp dir is gone


@pytest.mark.slow
def test_killed_in_place_run_leaves_sources_and_no_tracker(
    hf_models: Any, tmp_path: Path, started: Any
) -> None:
    work = copy_of(hf_models("i2v", sharded=True), tmp_path / "transformer")
    before = digests(work)
    _kill_midway(work, work, started)
    assert (
        not (work / TRACKER).exists() and not (work / MANIFEST).exists() and not (work / "release").exists()
    )
    assert {k: v for k, v in digests(work).items() if k in before} == before
    convert("hf_to_mm", work, work, pp_layers=[1, 1, 1, 1])
    assert (work / TRACKER).read_text() == "release"
    assert not [p for p in work.iterdir() if TEMP_TAG in p.name]


@pytest.mark.parametrize("in_place", [False, True])
def test_everything_is_on_disk_before_it_is_published(
    hf_models: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_place: bool
) -> None:
    """Each output file and folder is fsynced while it still sits in the temp dir, before the tracker
    appears in the target: after a power cut a checkpoint that looks valid holds complete rank files."""
    src = hf_models("t2v")
    target = copy_of(src, tmp_path / "transformer") if in_place else tmp_path / "mm"
    real_fsync = os.fsync
    flushed: list[str] = []  # before the tracker is in the target
    after: list[str] = []

    def spy(fd: int) -> None:
        (after if (target / TRACKER).exists() else flushed).append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    report = convert("hf_to_mm", target if in_place else src, target, pp_layers=[2, 2])
    staged = [Path(p) for p in flushed if TEMP_TAG in p]
    assert staged, flushed
    temp = next(p for p in staged[0].parents if TEMP_TAG in p.name)
    written = {TRACKER, MANIFEST, *(f.path for f in report.files)}
    assert {p.relative_to(temp).as_posix() for p in staged if p.is_relative_to(temp)} >= written | {
        "release",
        "release/mp_rank_00_000",
    }
    assert after == [str(target if in_place else target.parent)]  # then the renames themselves


# ---------------------------------------------------------------------------------------------------------
# bad inputs: MMAgentError with the field and the fix


@pytest.mark.parametrize(
    ("case", "field", "words"),
    [
        ("missing_dir", "source", "Directory not found"),
        ("no_safetensors", "source", "No .safetensors files"),
        ("wrong_sum", "pp_layers", "sums to 5 layers but the model has 4"),
        ("ragged_vpp", "pp_layers", "different lengths"),
        ("tp2", "tp", "Tensor Parallel is not support by Converter 'WanConverter'"),
        ("vit", "vit_pp_layers", "VLM"),
    ],
)
def test_bad_inputs(hf_models: Any, tmp_path: Path, case: str, field: str, words: str) -> None:
    src = hf_models("t2v")
    empty = tmp_path / "empty"
    empty.mkdir()
    kw: dict[str, Any] = {
        "missing_dir": {"source": str(tmp_path / "nope")},
        "no_safetensors": {"source": str(empty)},
        "wrong_sum": {"pp_layers": [2, 3]},
        "ragged_vpp": {"pp_layers": [[1, 1], [2]]},
        "tp2": {"tp": 2},
        "vit": {"pp_layers": [2, 2], "vit_pp_layers": [1, 1]},
    }[case]
    req = ConvertRequest(
        converter="WanConverter",
        method="hf_to_mm",
        **{"source": str(src), "target": str(tmp_path / "t"), **kw},
    )
    with pytest.raises(MMAgentError) as err:
        plan_conversion(req)
    assert err.value.field == field and words in err.value.message and err.value.fix
    with pytest.raises(MMAgentError):
        execute(req)
    assert not (tmp_path / "t").exists()


def test_mm_sources_are_checked(hf_models: Any, tmp_path: Path) -> None:
    src = hf_models("t2v")
    convert("hf_to_mm", src, tmp_path / "mm", pp_layers=[2, 2])
    cases = [
        ("resplit", tmp_path / "mm", tmp_path / "mm", {"pp_layers": [1, 3]}, "target"),
        ("resplit", tmp_path / "mm", tmp_path / "r", {"pp_layers": [1, 1]}, "pp_layers"),
        ("mm_to_hf", src, tmp_path / "x", {}, "source"),  # an HF dir is not an MM checkpoint
        ("mm_to_hf", tmp_path / "mm", src, {}, "target"),  # never writes over a non-empty dir
    ]
    for method, source, target, kw, field in cases:
        with pytest.raises(MMAgentError) as err:
            convert(method, source, target, **kw)
        assert err.value.field == field and err.value.fix, (method, err.value)
    shutil.rmtree(tmp_path / "mm" / "release" / "mp_rank_00_001")
    with pytest.raises(MMAgentError) as err:
        convert("mm_to_hf", tmp_path / "mm", tmp_path / "y")
    assert "incomplete" in err.value.message and "mp_rank_00_001" in err.value.message


# ---------------------------------------------------------------------------------------------------------
# planning without torch, the table, the IO primitives


def test_plan_imports_no_torch(hf_models: Any) -> None:
    code = (
        "import sys\n"
        "from mm_agent.convert.plan import plan_conversion\n"
        "from mm_agent.convert.schema import ConvertRequest\n"
        f"p = plan_conversion(ConvertRequest(converter='WanConverter', method='hf_to_mm', source={str(hf_models('i2v'))!r},"
        " target='/nonexistent/x', pp_layers=[1, 3]))\n"
        "assert [f.keys for f in p.layout] == [52, 99], p.layout\n"
        "assert p.native and p.mm_convert_argv[-2:] == ['--cfg.target_parallel_config.pp_layers', '[1,3]']\n"
        "bad = [m for m in ('torch', 'diffusers', 'safetensors') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mapping_table_is_checked_when_loaded(tmp_path: Path) -> None:
    wan = load_mapping("WanConverter")
    assert wan.hf_to_mm("blocks.0.attn1.to_k._extra_state") != "blocks.0.self_attn.proj_k._extra_state"
    good = (MAPPINGS_DIR / "WanConverter.yaml").read_text()
    (tmp_path / "WanConverter.yaml").write_text(good.replace("head.head.bias\n", "head.head.weight\n", 1))
    with pytest.raises(MMAgentError) as err:
        load_mapping("WanConverter", tmp_path)
    assert "exact renames map several HF names" in err.value.message and err.value.field == "exact"
    with pytest.raises(MMAgentError) as err:
        load_mapping("NoSuchConverter")
    assert err.value.field == "converter"


def test_streaming_writers(tmp_path: Path) -> None:
    from mm_agent.convert.mmio import save_stage
    from mm_agent.convert.tensors import SafetensorsFile, Scratch, own_storage, write_safetensors

    big = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    tensors = [
        ("a", big),
        ("b", torch.ones(3, dtype=torch.bfloat16)),
        ("c", torch.zeros(0)),
        ("d", torch.tensor(7)),
    ]
    write_safetensors(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    back = load_file(tmp_path / "x.safetensors")
    assert_bitwise(dict(tensors), back)
    reader = SafetensorsFile(tmp_path / "x.safetensors")
    assert torch.equal(reader.get("a"), big) and reader.get("a").untyped_storage().nbytes() == big.nbytes
    # a view must not drag its whole base into a rank file: it is copied to file-backed scratch
    scratch = Scratch(tmp_path / "scratch")
    view = big[:2]
    assert own_storage(view, scratch) is not view and own_storage(big, scratch) is big
    size = save_stage(tmp_path / "r.pt", [{"v": view}], False, scratch)
    assert size < big.nbytes // 2
    assert torch.equal(torch.load(tmp_path / "r.pt", weights_only=True)["model"]["v"], view)
    scratch.clear()
    assert not list((tmp_path / "scratch").iterdir())


def test_cli_bad_input_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "mm_agent",
        "convert",
        "WanConverter",
        "hf_to_mm",
        "--source",
        str(tmp_path / "nope"),
    ]
    for extra in (["--tp", "2"], ["--pp-layers", "1,2"]):
        proc = subprocess.run(
            [*argv, "--target", str(tmp_path / "t"), *extra], capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in out and "fix:" in out, out

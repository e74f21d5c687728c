"""MLLM rules: attr vs dataset records, <image> tokens, HF model dir, cache_dir on shared mounts,
and a Qwen3-VL `pretrain_transformers.py <yaml>` job."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_validate_support import FIXTURES, assert_one, copy_job, edit_json, errors, new_findings, run, sub

from mm_agent.validate import rules_vlm

SCRIPT = "finetune_qwen2_5_vl_3b.sh"
GOOD = [
    {
        "messages": [
            {"role": "user", "content": "<image>What is this?"},
            {"role": "assistant", "content": "A cat."},
        ],
        "images": ["images/cat.jpg"],
    },
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
]


@pytest.fixture
def mm(tmp_path: Path) -> Path:
    root = tmp_path / "mm"
    hf = root / "ckpt" / "hf_path" / "Qwen2.5-VL-3B-Instruct"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "preprocessor_config.json").write_text("{}")
    converted = root / "ckpt" / "mm_path" / "Qwen2.5-VL-3B-Instruct"
    (converted / "release" / "mp_rank_00").mkdir(parents=True)
    (converted / "latest_checkpointed_iteration.txt").write_text("release")
    (root / "data").mkdir()
    (root / "data" / "mllm_format_llava_instruct_data.json").write_text(json.dumps(GOOD, indent=2))
    (root / "data" / "images").mkdir()
    (root / "data" / "images" / "cat.jpg").write_bytes(b"\xff\xd8\xff")  # the image GOOD names
    (root / "mindspeed_mm" / "tools").mkdir(parents=True)
    (root / "mindspeed_mm" / "tools" / "tools.json").write_text(
        '{"sorafeature": {"save_path": "./sora_features"}}'
    )
    return root


@pytest.fixture
def job(tmp_path: Path) -> Path:
    return copy_job(tmp_path, "qwen25vl_3b")


def _records(mm: Path, records: list[dict]) -> None:
    (mm / "data" / "mllm_format_llava_instruct_data.json").write_text(json.dumps(records, indent=2))


def test_matching_dataset_is_clean(job: Path, mm: Path) -> None:
    report = run(job, mm_root=mm)
    # the hand-made checkpoint has no conversion manifest: that warning is expected
    noisy = [f for f in report.findings if f.severity != "info" and f.rule != "ckpt.manifest_missing"]
    assert not noisy, report.findings
    assert any(s.kind == "vlm_dataset" for s in report.files)


def test_messages_key_mismatch(job: Path, mm: Path) -> None:
    sharegpt = [
        {
            "conversations": [{"from": "human", "value": "<image>Hi"}, {"from": "gpt", "value": "Yo"}],
            "images": ["images/cat.jpg"],
        }
    ]
    found = new_findings(job, lambda: _records(mm, sharegpt), mm_root=mm)
    f = assert_one(found, "vlm.attr_mismatch", "error", job / "data.json", "dataset_param.attr.messages")
    assert "'conversations'" in f.fix


def test_role_names_mismatch(job: Path, mm: Path) -> None:
    roles = [{"messages": [{"role": "human", "content": "Hi"}, {"role": "gpt", "content": "Yo"}]}]
    found = new_findings(job, lambda: _records(mm, roles), mm_root=mm)
    f = assert_one(found, "vlm.attr_mismatch", "error", job / "data.json", "dataset_param.attr.user_tag")
    assert "'human'" in f.message


def test_content_tag_mismatch(job: Path, mm: Path) -> None:
    recs = [{"messages": [{"role": "user", "text": "Hi"}, {"role": "assistant", "text": "Yo"}]}]
    found = new_findings(job, lambda: _records(mm, recs), mm_root=mm)
    assert_one(found, "vlm.attr_mismatch", "error", job / "data.json", "dataset_param.attr.content_tag")


def test_image_token_count(job: Path, mm: Path) -> None:
    recs = [
        {
            "messages": [
                {"role": "user", "content": "<image><image>Compare"},
                {"role": "assistant", "content": "x"},
            ],
            "images": ["images/cat.jpg"],
        }
    ]
    found = new_findings(job, lambda: _records(mm, recs), mm_root=mm)
    dataset = mm / "data" / "mllm_format_llava_instruct_data.json"
    f = assert_one(found, "vlm.image_tokens", "error", dataset, "[0]")
    assert "2 <image> token(s) but 1 images" in f.message


def test_images_key_mismatch(job: Path, mm: Path) -> None:
    recs = [
        {
            "messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}],
            "image": ["a.jpg"],
        }
    ]
    found = new_findings(job, lambda: _records(mm, recs), mm_root=mm)
    f = assert_one(found, "vlm.attr_mismatch", "error", job / "data.json", "dataset_param.attr.images")
    assert "'image'" in f.fix


def test_jsonl_dataset(job: Path, mm: Path) -> None:
    jsonl = mm / "data" / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    data = job / "data.json"
    sub(data, r'"\./data/mllm_format_llava_instruct_data\.json"', '"train.jsonl"')
    assert not errors(run(job, mm_root=mm))
    bad = dict(GOOD[0], images=[])
    found = new_findings(job, lambda: jsonl.write_text(json.dumps(bad) + "\n"), mm_root=mm)
    assert_one(found, "vlm.image_tokens", "error", data)


def test_dataset_missing_is_a_warning(job: Path, mm: Path) -> None:
    found = new_findings(
        job, lambda: (mm / "data" / "mllm_format_llava_instruct_data.json").unlink(), mm_root=mm
    )
    assert_one(found, "path.missing", "warning", job / "data.json", "dataset_param.basic_parameters.dataset")


def test_hf_dir_missing_and_incomplete(job: Path, mm: Path) -> None:
    hf = mm / "ckpt" / "hf_path" / "Qwen2.5-VL-3B-Instruct"
    found = new_findings(
        job, lambda: (hf / "preprocessor_config.json").unlink(), mm_root=mm, include_info=True
    )
    assert_one(
        found,
        "vlm.hf_dir_incomplete",
        "info",
        job / "data.json",
        "dataset_param.preprocess_parameters.model_name_or_path",
    )
    found = new_findings(job, lambda: [p.unlink() for p in hf.iterdir()] and hf.rmdir(), mm_root=mm)
    assert_one(
        found,
        "path.missing",
        "warning",
        job / "data.json",
        "dataset_param.preprocess_parameters.model_name_or_path",
    )


def _mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fstype: str, mount: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/export {mount} {fstype} rw 0 0\n")
    monkeypatch.setattr(rules_vlm, "MOUNTS", table)


def _two_nodes(job: Path) -> None:
    """The fixture on 2 nodes, with a master address the other node can reach (multinode.master_addr)."""
    sub(job / SCRIPT, r"^NNODES=1$", "NNODES=2")
    sub(job / SCRIPT, r"^MASTER_ADDR=localhost$", "MASTER_ADDR=10.0.0.1")


def test_cache_dir_on_shared_mount_multi_node(
    job: Path, mm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mounts(tmp_path, monkeypatch, "nfs4", mm)
    found = new_findings(job, lambda: _two_nodes(job), mm_root=mm)
    f = assert_one(
        found,
        "vlm.cache_dir_shared",
        "warning",
        job / "data.json",
        "dataset_param.basic_parameters.cache_dir",
    )
    assert "nfs4" in f.message


def test_cache_dir_local_or_single_node(
    job: Path, mm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mounts(tmp_path, monkeypatch, "nfs4", mm)
    assert not [f for f in run(job, mm_root=mm).findings if f.rule == "vlm.cache_dir_shared"]
    _mounts(tmp_path, monkeypatch, "xfs", mm)
    assert not new_findings(job, lambda: _two_nodes(job), mm_root=mm)


def test_cache_dir_inside_a_multi_node_job_dir_is_flagged_on_any_filesystem(tmp_path: Path) -> None:
    """The job directory of a multi-node job is on every node (the launchers mount it, the per-node commands
    need it at the same path), so a cache_dir in it is shared even where this machine's mount table shows a
    local disk; a rendered 2-node job keeps its cache node-local and is not flagged."""
    from mm_agent.render import RenderRequest, render_job

    out = tmp_path / "vl2"
    spec = {
        "model": "qwen2.5vl",
        "task": "sft",
        "nnodes": 2,
        "master_addr": "10.0.0.1",
        "launcher": "volcano",
    }
    render_job(RenderRequest(**spec, out_dir=str(out), confirm=True), root=None)
    data = json.loads((out / "data.json").read_text(encoding="utf-8"))
    assert not Path(data["dataset_param"]["basic_parameters"]["cache_dir"]).is_relative_to(out)
    field = "dataset_param.basic_parameters.cache_dir"
    found = new_findings(out, lambda: edit_json(out / "data.json", _cache_in(out / "cache_dir")))
    f = assert_one(found, "vlm.cache_dir_shared", "warning", out / "data.json", field)
    assert str(out) in f.message and "2 nodes" in f.message and "node-local" in f.fix


def _cache_in(path: Path) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        data["dataset_param"]["basic_parameters"]["cache_dir"] = str(path)

    return change


# ---- Qwen3-VL transformers YAML (pretrain_transformers.py <yaml>) ----------------------------------------
YAML = "qwen3vl_full_sft_8B.yaml"
SH = "finetune_qwen3vl_8B.sh"


@pytest.fixture
def qwen3(tmp_path: Path) -> Path:
    job = copy_job(tmp_path, "qwen3vl_8b")
    sub(job / YAML, r"&FSDP2_PATH .*$", f"&FSDP2_PATH {job / 'fsdp2_config.yaml'}")
    return job


def test_transformers_yaml_job_is_clean(qwen3: Path) -> None:
    report = run(qwen3)
    # the script does not cd and no MindSpeed-MM root is given: the relative gpt_args.load cannot be placed,
    # and the warning says which checkpoint checks that costs; nothing else is reported
    (skipped,) = [f for f in report.findings if f.severity != "info"]
    assert (skipped.rule, skipped.field) == ("crossfile.skipped", "gpt_args.load"), report.findings
    assert "checkpoint tracker" in skipped.message
    kinds = {Path(s.path).name: s.kind for s in report.files}
    assert kinds == {SH: "shell", YAML: "transformers_yaml", "fsdp2_config.yaml": "fsdp2_config"}
    assert report.ok and run(FIXTURES / "qwen3vl_8b").ok


def test_transformers_yaml_fsdp2_connections(qwen3: Path) -> None:
    found = new_findings(qwen3, lambda: sub(qwen3 / SH, "MAX_CONNECTIONS=2", "MAX_CONNECTIONS=1"))
    assert_one(found, "fsdp2.max_connections", "error", qwen3 / SH, "CUDA_DEVICE_MAX_CONNECTIONS")


def test_transformers_yaml_fsdp2_config_missing(qwen3: Path) -> None:
    found = new_findings(qwen3, lambda: (qwen3 / "fsdp2_config.yaml").unlink())
    assert_one(found, "fsdp2.config_missing", "error", qwen3 / YAML, "gpt_args.fsdp2_config_path")


def test_transformers_yaml_untie(qwen3: Path) -> None:
    found = new_findings(
        qwen3, lambda: sub(qwen3 / YAML, r"^  untie_embeddings_and_output_weights: true\n", "")
    )
    f = assert_one(found, "fsdp2.untie", "warning", qwen3 / YAML, "gpt_args.use_torch_fsdp2")
    assert f.line == 14


def test_transformers_yaml_keys(qwen3: Path) -> None:
    found = new_findings(qwen3, lambda: sub(qwen3 / YAML, r"^      template: ", "      templte: "))
    assert {(f.rule, f.field) for f in found} == {
        ("keys.unknown", "data.dataset_param.basic_parameters.templte"),
        ("keys.required", "data.dataset_param.basic_parameters.template"),
    }


def test_transformers_yaml_parallel(qwen3: Path) -> None:
    found = new_findings(
        qwen3, lambda: sub(qwen3 / YAML, r"^  context_parallel_size: 1", "  context_parallel_size: 16")
    )
    f = assert_one(found, "parallel.world_size", "error", qwen3 / YAML, "gpt_args.context_parallel_size")
    assert "world_size (8) is not divisible by 16" in f.message and f.line == 12

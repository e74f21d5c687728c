"""route_model and build_pipeline against the real registry (no mocks): requests users actually type."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mm_agent.errors import MMAgentError
from mm_agent.pipeline import PipelineStage, build_pipeline, convert_command
from mm_agent.registry import DATA_DIR, get_registry
from mm_agent.registry.schema import STAGES
from mm_agent.registry.steps import has_steps
from mm_agent.route import RouteRequest, RouteResult, load_vocabulary, route_model


def route(
    text: str = "",
    *,
    model: str | None = None,
    task: str | None = None,
    mm_version: str | None = None,
    npus: int | None = None,
) -> RouteResult:
    return route_model(RouteRequest(request=text, model=model, task=task, mm_version=mm_version, npus=npus))


def stage(result: RouteResult, name: str) -> PipelineStage:
    return next(s for s in result.candidates[0].pipeline if s.stage == name)


def test_wan21_t2v_on_8_npus() -> None:
    r = route("fine-tune Wan2.1 text-to-video on 8 NPUs")
    top = r.candidates[0]
    assert (top.model_id, top.task, top.backend) == ("wan2.1", "t2v", "megatron")
    assert top.needs_feature_extraction and top.feature_script
    assert top.converter == "WanConverter" and top.converter_method == "hf_to_mm"
    assert r.question is None
    assert r.parsed.npus == 8 and r.parsed.models == ["wan2.1"] and "t2v" in r.parsed.tasks
    assert [s.stage for s in top.pipeline] == list(STAGES)
    assert stage(r, "feature_extraction").applies
    assert any("mm-convert WanConverter hf_to_mm" in c for c in stage(r, "weights").commands)
    # the README's launch line, with the layout asked for as the script's variables
    assert stage(r, "training").commands[0] == "bash examples/wan2.1/1.3b/t2v/pretrain.sh"
    assert any("NPUS_PER_NODE=8, NNODES=1" in n for n in stage(r, "training").notes)
    assert any("README.md § 启动训练" in s for s in stage(r, "training").sources)
    assert "git checkout v26.0.0" in stage(r, "env_setup").commands


def test_chinese_vlm_understanding_finetune() -> None:
    top = route("把Qwen2.5-VL做多模态理解微调").candidates[0]
    assert (top.model_id, top.task, top.family) == ("qwen2.5vl", "sft", "vlm")


def test_hf_id_picks_model_size_and_task() -> None:
    r = route("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    top = r.candidates[0]
    assert (top.model_id, top.size, top.task) == ("wan2.1", "1.3b", "t2v")
    assert r.parsed.hf_ids == ["wan-ai/wan2.1-t2v-1.3b-diffusers"]


def test_hf_id_qwen_7b_picks_size() -> None:
    top = route("Qwen/Qwen2.5-VL-7B-Instruct").candidates[0]
    assert (top.model_id, top.size) == ("qwen2.5vl", "7b")


@pytest.mark.parametrize(
    "text", ["wan 2.1 图生视频", "Wan-2.1 image-to-video", "WAN21 i2v", "ｗａｎ２．１ 图生视频"]
)
def test_spellings_of_wan21_i2v(text: str) -> None:
    top = route(text).candidates[0]
    assert (top.model_id, top.task) == ("wan2.1", "i2v")


def test_wan22_never_routes_to_wan21() -> None:
    r = route("fine-tune wan2.2 text-to-video")
    assert {c.model_id for c in r.candidates} == {"wan2.2"}
    assert route("Wan-2.2 5B").candidates[0].size == "5b"


def test_vague_video_request_asks_which_model() -> None:
    r = route("train a video model")
    assert r.question is not None
    ids = [c.model_id for c in r.candidates]
    assert 1 < len(ids) <= 5 and len(set(ids)) == len(ids)
    assert {"wan2.1", "wan2.2"} <= set(ids)
    assert all(c.family == "generative" for c in r.candidates)
    assert "wan2.1" in r.question


def test_removed_model_keeps_candidate_and_suggests_version() -> None:
    r = route("qwen2vl on MindSpeed-MM 26.1.0")
    top = r.candidates[0]
    assert top.model_id == "qwen2vl" and r.parsed.version == "26.1.0"
    assert top.available_in_version is False
    assert top.suggested_version == "26.0.0"
    assert "removed in 26.1.0" in top.explanation


def test_model_added_later_says_added_in() -> None:
    entry = get_registry().get("wan2.2")
    top = route("wan2.2 t2v", mm_version="2.1.0").candidates[0]
    assert not top.available_in_version
    assert f"added in {entry.versions.since}" in top.explanation
    assert top.suggested_version == "master"


def test_dpo_request() -> None:
    top = route("Wan2.1 14B DPO 偏好对齐").candidates[0]
    assert (top.model_id, top.task, top.size) == ("wan2.1", "dpo", "14b")
    assert top.entry_script == "posttrain_sora_dpo.py"


def test_grpo_request() -> None:
    r = route("用GRPO强化学习训练")
    assert r.parsed.tasks == ["grpo"]
    assert r.candidates and all(
        any(t.id == "grpo" for t in get_registry().get(c.model_id).tasks) for c in r.candidates
    )
    assert r.candidates[0].task == "grpo"


def test_chinese_asr_request() -> None:
    if not any(t.id == "asr" for e in get_registry().models.values() for t in e.tasks):
        pytest.skip("no asr task in the registry yet")
    top = route("我想做语音识别微调，8卡").candidates[0]
    assert top.task == "asr" and top.family == "audio"


def test_npu_and_node_counts() -> None:
    r = route("wan2.1 t2v 14b 2机16卡")
    assert (r.parsed.nodes, r.parsed.npus) == (2, 16)
    training = stage(r, "training")
    assert training.commands[0] == "bash examples/wan2.1/14b/t2v/pretrain.sh"  # the README's line
    assert any("NPUS_PER_NODE=8, NNODES=2" in n for n in training.notes)
    assert any("every node" in n and "MASTER_ADDR" in n for n in training.notes)
    assert route("用两机训练wan2.1").parsed.nodes == 2
    assert route("wan2.1 16 npu").parsed.npus == 16


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("wan2.1 v26.1.0", "26.1.0"),
        ("wan2.1 26.0.0", "26.0.0"),
        ("wan2.1 on master", "master"),
        ("wan2.1 MM 26.1", "26.1.0"),
        ("wan2.1", None),
    ],
)
def test_version_parsing(text: str, version: str | None) -> None:
    r = route(text)
    assert r.parsed.version == (version or get_registry().versions.default)
    assert r.candidates[0].model_id == "wan2.1"


def test_hints_override_text() -> None:
    r = route("wan2.1 text-to-video on 8 NPUs", model="qwen2.5vl", task="lora", mm_version="master", npus=16)
    top = r.candidates[0]
    assert (top.model_id, top.task, top.mm_version) == ("qwen2.5vl", "lora", "master")
    assert r.parsed.npus == 16


def test_task_hint_the_model_lacks_is_a_statement_not_a_route() -> None:
    r = route(model="wan2.1", task="grpo")
    assert r.candidates == [] and r.question is not None
    assert "Wan2.1 has no grpo task" in r.question and "dpo" in r.question
    assert r.choices[0].model_id == "wan2.1" and "t2v" in r.choices[0].tasks
    having = {e.id for e in get_registry().models.values() if any(t.id == "grpo" for t in e.tasks)}
    assert {c.model_id for c in r.choices[1:]} <= having and all(c.tasks == ["grpo"] for c in r.choices[1:])


def test_named_model_without_task_takes_first_task() -> None:
    r = route("qwen2.5vl")
    assert r.question is None and r.candidates[0].task == "sft"


def test_unknown_model_hint_did_you_mean() -> None:
    with pytest.raises(MMAgentError) as err:
        route(model="wan2.7x")
    assert err.value.fix and "did you mean" in err.value.fix and "wan2" in err.value.fix


def test_words_inside_other_words_do_not_match() -> None:
    parsed = route("microsoft world model").parsed
    assert "sft" not in parsed.tasks and "grpo" not in parsed.tasks


def test_vocabulary_loads_and_names_real_tasks() -> None:
    vocab = load_vocabulary()
    assert {t.task for t in vocab.tasks} >= {
        "t2v",
        "i2v",
        "flf2v",
        "sft",
        "lora",
        "dpo",
        "grpo",
        "asr",
        "tts",
    }


def test_convert_command_wan_pp4_flat_list() -> None:
    entry = get_registry().get("wan2.1")
    size = entry.size("1.3b")
    assert size is not None
    argv = convert_command(
        entry, size, "26.0.0", source="hf/transformer", target="hf/transformer", pp_layers=[7, 8, 8, 7]
    )
    assert argv[:3] == ["mm-convert", "WanConverter", "hf_to_mm"]
    i = argv.index("--cfg.target_parallel_config.pp_layers")
    assert argv[i + 1] == "[7,8,8,7]"
    # PP=1 layout: no pp_layers flag at all
    assert "--cfg.target_parallel_config.pp_layers" not in convert_command(
        entry, size, "26.0.0", source="a", target="b"
    )


def test_convert_command_qwen25vl_nested_for_hf_to_mm_flat_for_export() -> None:
    entry = get_registry().get("qwen2.5vl")
    size = entry.size("3b")
    assert size is not None
    argv = convert_command(entry, size, "26.0.0", source="hf", target="mm")
    assert argv[:3] == ["mm-convert", "Qwen2_5_VLConverter", "hf_to_mm"]
    assert argv[argv.index("--cfg.parallel_config.llm_pp_layers") + 1] == "[[36]]"
    assert argv[argv.index("--cfg.parallel_config.vit_pp_layers") + 1] == "[[32]]"
    assert argv[argv.index("--cfg.parallel_config.tp_size") + 1] == "1"
    assert argv[argv.index("--cfg.hf_config.hf_dir") + 1] == "hf"
    back = convert_command(entry, size, "26.0.0", source="save", target="out", direction="to_hf")
    assert back[2] == "mm_to_hf" and back[back.index("--cfg.parallel_config.llm_pp_layers") + 1] == "[36]"


@pytest.mark.parametrize(
    ("class_name", "to_training", "to_hf"),
    [
        (
            "Qwen3VLConverter",
            ["--hf_dir", "hf", "--dcp_dir", "out"],
            ["--load_dir", "save", "--save_dir", "out"],
        ),
        (
            "ExpertMergeDcpConverter",
            ["--hf_dir", "hf", "--save_dir", "out"],
            ["--dcp_dir", "save", "--save_dir", "out"],
        ),
    ],
)
def test_convert_command_flat_dcp_style(class_name: str, to_training: list[str], to_hf: list[str]) -> None:
    """Flat converters spell flags per class (README forms), and never take `--cfg.*`."""
    entry = next(
        (e for e in get_registry().models.values() if e.converter and e.converter.class_name == class_name),
        None,
    )
    if entry is None or entry.converter is None:
        pytest.skip(f"no {class_name} entry in the registry")
    size = entry.sizes[0]
    argv = convert_command(entry, size, "master", source="hf", target="out")
    assert argv[2:] == [entry.converter.to_training, *to_training]
    back = convert_command(entry, size, "master", source="save", target="out", direction="to_hf")
    assert back[3:7] == to_hf and not any(a.startswith("--cfg.") for a in argv + back)


def test_convert_command_init_args_go_before_method() -> None:
    with_init = [e for e in get_registry().models.values() if e.converter and e.converter.init_args]
    if not with_init:
        pytest.skip("no converter with init_args in the registry")
    entry = with_init[0]
    assert entry.converter is not None
    argv = convert_command(entry, entry.sizes[0], "26.0.0", source="a", target="b")
    key, value = next(iter(entry.converter.init_args.items()))
    assert argv.index(f"--{key}") < argv.index(entry.converter.to_training)
    assert argv[argv.index(f"--{key}") + 1] == value


def test_convert_command_without_converter_raises() -> None:
    entry = next(e for e in get_registry().models.values() if e.converter is None)
    with pytest.raises(MMAgentError):
        convert_command(entry, entry.sizes[0], "26.0.0", source="a", target="b")


def test_every_registry_entry_builds_eight_stages() -> None:
    """The pipeline is registry-driven: every (model, task) at every version must build without error,
    and every command must be valid shell (quoting of `>=` pins, `[7,8,8,7]` lists, `$VAR`s)."""
    reg = get_registry()
    lines: list[str] = []
    for entry in reg.models.values():
        for task in entry.tasks:
            size = next(s for s in entry.sizes if task.sizes is None or s.id in task.sizes)
            for version in reg.versions.ids:
                stages = build_pipeline(entry, task, size, version)
                assert [s.stage for s in stages] == list(STAGES), entry.id
                # training applies, unless the steps data marks it unsupported there (with the fix)
                training = stages[5]
                assert stages[0].applies
                assert training.applies or any(n.startswith("unsupported:") for n in training.notes), (
                    entry.id,
                    task.id,
                    version,
                )
                if entry.converter is None and not has_steps(entry, version):
                    assert not stages[2].applies  # the registry-derived pipeline: download only
                lines += [c for st in stages for c in st.commands]
    bash = shutil.which("bash")
    if bash:
        check = subprocess.run([bash, "-n"], input="\n".join(lines), text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_feature_extraction_respects_its_versions() -> None:
    entry = get_registry().get("wan2.1")
    task = entry.task("t2v", "megatron")
    assert task is not None and task.feature_extraction is not None
    size = entry.sizes[0]
    for version in get_registry().versions.ids:
        fe = build_pipeline(entry, task, size, version)[4]
        assert fe.applies == task.feature_extraction.versions.contains(version)


def test_model_deps_quotes_pip_specifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no README pin the plan installs today has a `>`, so one overlay gets one in a copy of the registry
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    vace = data / "models" / "vace.yaml"
    vace.write_text(vace.read_text().replace("pip: [diffusers==0.33.1]", 'pip: ["diffusers>=0.33.1"]'))
    monkeypatch.setenv("MM_AGENT_REGISTRY_DIR", str(data))
    entry = get_registry().get("vace")
    deps = build_pipeline(entry, entry.tasks[0], entry.sizes[0], "26.0.0")[1]
    line = next(c for c in deps.commands if c.startswith("pip install ") and ">" in c)
    assert "'" in line  # `>` would be a shell redirect if left unquoted


def test_shared_checkpoint_routes_to_the_recipe_with_the_task() -> None:
    """verl_examples trains Qwen2.5-VL weights with GRPO; GRPO on that checkpoint should find it."""
    users = [
        e
        for e in get_registry().models.values()
        if any(t.id == "grpo" for t in e.tasks)
        and any("Qwen/Qwen2.5-VL-7B-Instruct" in s.hf_ids for s in e.sizes)
    ]
    if not users:
        pytest.skip("no GRPO recipe on Qwen2.5-VL weights in the registry")
    r = route("Qwen/Qwen2.5-VL-7B-Instruct GRPO")
    assert (r.candidates[0].model_id, r.candidates[0].task, r.candidates[0].size) == (
        users[0].id,
        "grpo",
        "7b",
    )
    assert any(c.model_id == "qwen2.5vl" for c in r.candidates)
    # without a task the checkpoint's own model wins and the recipe is not offered
    assert {c.model_id for c in route("Qwen/Qwen2.5-VL-7B-Instruct").candidates} == {"qwen2.5vl"}


def test_moe_size_id_accepts_plain_size() -> None:
    top = route("wan2.2 14b i2v").candidates[0]
    assert (top.model_id, top.size) == ("wan2.2", "a14b") and "no size" not in top.explanation


def test_dependency_versions_are_not_mm_versions() -> None:
    r = route("qwen2.5vl with torch 2.1.0 and diffusers==0.33.1")
    assert r.parsed.version == get_registry().versions.default
    with pytest.raises(MMAgentError):
        route("wan2.1 on MindSpeed-MM 27.0")


def test_no_model_for_task_asks_instead_of_guessing() -> None:
    r = route("v2v", mm_version="2.1.0")
    if any(t.id == "v2v" for e in get_registry().models.values() for t in e.tasks):
        assert r.candidates and r.candidates[0].task == "v2v"
    else:
        assert r.candidates == [] and r.question


def test_a_converter_missing_at_the_version_gives_a_note_not_a_failing_command() -> None:
    """Qwen3TTSConverter ships in checkpoint/ only from 26.1.0: at 26.0.0 the pipeline names the gap and the fix."""
    reg = get_registry()
    entry = reg.get("qwen3tts")
    task, size = entry.tasks[0], entry.sizes[0]
    old = {s.stage: s for s in build_pipeline(entry, task, size, "26.0.0")}
    assert not any("mm-convert" in c for c in old["weights"].commands)  # training reads the HF download
    # the export is marked unsupported in the steps data, with the version that has it
    assert not old["export"].applies
    assert any("26.0.0 has no Qwen3TTSConverter" in n and "26.1.0" in n for n in old["export"].notes)
    with pytest.raises(MMAgentError) as info:
        convert_command(entry, size, "26.0.0", source="hf", target="out")
    assert info.value.field == "mm_version"
    new = {s.stage: s for s in build_pipeline(entry, task, size, "26.1.0")}
    # 26.1.0's Qwen3TTSConverter.hf_to_dcp is `pass`: never offered (issue 26); its dcp_to_hf export is
    assert not any("hf_to_dcp" in c for c in new["weights"].commands)
    assert new["export"].applies
    assert any("mm-convert Qwen3TTSConverter dcp_to_hf" in c for c in new["export"].commands)

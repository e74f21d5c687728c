"""The converter commands the pipeline and `render_job` offer, as MindSpeed-MM's CLI spells them (issue 26).

Without an upstream tree: the argument names and required lists each converter's CLI takes (the fidelity
test `tests/fidelity/test_convert_cli.py` has MindSpeed-MM's own jsonargparse CLI parse every one of them),
the `python -c` form for a converter `mm-convert` cannot find, and the stubs that are never offered.
"""

from __future__ import annotations

import itertools
import shlex
from pathlib import Path

import pytest
from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.pipeline import PipelineStage, build_pipeline, convert_command
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ConverterSpec
from mm_agent.render import RenderRequest, render_job


def _stages(
    model: str, version: str, size: str | None = None, task: str | None = None
) -> dict[str, PipelineStage]:
    entry = get_registry().get(model)
    t = entry.tasks[0] if task is None else next(x for x in entry.tasks if x.id == task)
    s = entry.sizes[0] if size is None else next(x for x in entry.sizes if x.id == size)
    return {st.stage: st for st in build_pipeline(entry, t, s, version)}


def _argv(model: str, size: str, version: str, direction: str = "to_training") -> list[str]:
    entry = get_registry().get(model)
    s = next(x for x in entry.sizes if x.id == size)
    return convert_command(entry, s, version, source="src", target="dst", direction=direction)  # type: ignore[arg-type]


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}


def test_qwen35_hf_to_dcp_writes_to_dcp_dir_and_ties_the_4b_at_26_0_0_only() -> None:
    four = _flags(_argv("qwen3_5", "4b", "26.0.0"))
    assert four["--dcp_dir"] == "dst" and "--save_dir" not in four
    assert four["--tie_weight_mapping"] == '{"lm_head.weight":"model.language_model.embed_tokens.weight"}'
    assert "--tie_weight_mapping" not in _flags(
        _argv("qwen3_5", "4b", "26.1.0")
    )  # 26.1.0 re-ties in training
    assert "--tie_weight_mapping" not in _flags(_argv("qwen3_5", "9b", "26.0.0"))
    assert _flags(_argv("qwen3_6", "27b", "26.1.0"))["--dcp_dir"] == "dst"


def test_mistral3_uses_its_own_argument_names() -> None:
    assert _argv("magistral-2509", "default", "26.0.0")[3:] == ["--hf_dir", "src", "--dcp_dir", "dst"]
    back = _flags(_argv("magistral-2509", "default", "26.0.0", "to_hf"))
    assert set(back) == {"--load_dir", "--save_dir", "--model_assets_dir"}


@pytest.mark.parametrize(
    ("model", "size", "llm", "vit"),
    [
        ("internvl2.5", "4b", "[[36]]", "[[24]]"),
        ("internvl2.5", "78b", "[[0,3,6,6,6,6,6,6,6,6,6,6,5,5,5,2]]", "[[45" + ",0" * 15 + "]]"),
        ("qwen2vl", "2b", "[[28]]", "[[32]]"),
        ("deepseekvl2", "default", "[[13,17]]", "[[27,0]]"),
        ("videoalign", "default", "[[28]]", "[[32]]"),
    ],
)
def test_vlm_conversions_carry_the_stock_layer_lists(model: str, size: str, llm: str, vit: str) -> None:
    flags = _flags(_argv(model, size, "26.0.0"))
    assert flags["--cfg.parallel_config.llm_pp_layers"] == llm
    assert flags["--cfg.parallel_config.vit_pp_layers"] == vit


def test_deepseekvl2_converts_for_the_stock_expert_parallel_size() -> None:
    flags = _flags(_argv("deepseekvl2", "default", "26.0.0"))
    assert flags["--cfg.parallel_config.ep_size"] == "8" and flags["--cfg.trust_remote_code"] == "True"


def test_omni_conversion_keeps_the_audio_encoder() -> None:
    to_mm = _flags(_argv("qwen2.5omni", "7b", "26.0.0"))
    assert to_mm["--cfg.parallel_config.audio_pp_layers"] == "[[32,0]]"
    assert to_mm["--cfg.parallel_config.vit_pp_layers"] == "[[32,0]]"
    assert (
        _flags(_argv("qwen2.5omni", "7b", "26.0.0", "to_hf"))["--cfg.parallel_config.audio_pp_layers"]
        == "[32,0]"
    )


@pytest.mark.parametrize(
    ("model", "module"), [("stepvideo", "stepvideo_converter"), ("opensora2.0", "opensora_converter")]
)
def test_a_converter_mm_convert_cannot_find_is_imported_first(model: str, module: str) -> None:
    weights = _stages(model, "26.0.0")["weights"]
    (command,) = [c for c in weights.commands if "convert_cli" in c]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"]
    assert (
        argv[2] == f"import checkpoint.sora_model.{module}; from checkpoint.convert_cli import main; main()"
    )
    assert argv[3] == get_registry().get(model).converter.class_name  # type: ignore[union-attr]
    assert any("does not import" in n and "mm-convert" in n for n in weights.notes), weights.notes
    assert not any(c.startswith("mm-convert") for c in weights.commands)


def test_render_next_steps_run_stepvideo_s_converter_through_its_module(tmp_path: Path) -> None:
    result = render_job(
        RenderRequest(
            model="stepvideo", task="t2v", size="default", mm_version="26.0.0", out_dir=str(tmp_path / "j")
        ),
        root=None,
    )
    lines = [s for s in result.next_steps if "StepVideoConverter" in s]
    assert lines and not any(" mm-convert " in f" {s} " for s in lines), lines
    assert any("python -c 'import checkpoint.sora_model.stepvideo_converter;" in s for s in lines), lines


@pytest.mark.parametrize(("model", "version"), [("glm4.1v", "26.0.0"), ("deepseekvl2", "26.0.0")])
def test_a_stub_export_is_no_step(model: str, version: str) -> None:
    export = _stages(model, version)["export"]
    assert not export.applies and not export.commands
    said = " ".join([export.summary, *export.notes])
    assert "only a stub" in said and "mm_to_hf" in said and "no other way back to Hugging Face" in said, said


@pytest.mark.parametrize("model", ["qwen3tts", "moss_tts"])
def test_a_stub_conversion_is_never_offered(model: str, tmp_path: Path) -> None:
    """hf_to_dcp is `pass` / raises NotImplementedError upstream: no step runs it, and the command builder
    refuses it with the stub's fix (the training reads the downloaded Hugging Face weights)."""
    entry = get_registry().get(model)
    weights = _stages(model, "26.1.0")["weights"]
    assert not any("hf_to_dcp" in c for c in weights.commands), weights.commands
    steps = render_job(
        RenderRequest(model=model, task=entry.tasks[0].id, mm_version="26.1.0", out_dir=str(tmp_path / "j")),
        root=None,
    ).next_steps
    assert not any("hf_to_dcp" in s and not s.startswith("#") for s in steps), steps
    with pytest.raises(MMAgentError, match="only a stub") as refused:
        _argv(model, entry.sizes[0].id, "26.1.0")
    assert "Hugging Face weights" in (refused.value.fix or "")


def _spec(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "class": "XConverter",
        "methods": ["hf_to_mm", "mm_to_hf"],
        "target_format": "mm",
        "to_training": "hf_to_mm",
        "to_hf": "mm_to_hf",
        "arg_style": "cfg",
    }
    return {**base, **extra}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"cli_registered": False}, "needs `module`"),
        ({"stubs": {"resplit": {"fix": "convert again from HF"}}}, "not in methods"),
        ({"extra_args": [{"method": "hf_to_mm", "args": ["--a"], "source": "README.md:1-2"}]}, "at least 2"),
        ({"extra_args": [{"method": "hf_to_mm", "args": ["a", "b"], "source": "README.md:1-2"}]}, "pairs"),
        ({"module": "os.path"}, "pattern"),
    ],
)
def test_converter_data_is_checked_at_load(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ConverterSpec.model_validate(_spec(**extra))
    assert ConverterSpec.model_validate(_spec(cli_registered=False, module="checkpoint.sora_model.x")).module


def test_convert_weights_runs_the_imported_form_with_mm_convert_s_python(tmp_path: Path) -> None:
    """`convert_weights` runs the plan's command: mm-convert as found on PATH, the `python -c` form with the
    interpreter mm-convert's own script names (the MindSpeed-MM install that has `checkpoint`)."""
    from mm_agent.convert.upstream import _program
    from mm_agent.pipeline import converter_program

    exe = tmp_path / "mm-convert"
    exe.write_text(
        "#!/opt/mm/venv/bin/python3.10\nfrom checkpoint.convert_cli import main\n", encoding="utf-8"
    )
    stepvideo = get_registry().get("stepvideo").converter
    assert stepvideo is not None
    argv = [*converter_program(stepvideo), "StepVideoConverter", "hf_to_mm", "--cfg.source_path", "s"]
    assert _program(str(exe), argv) == ["/opt/mm/venv/bin/python3.10", *argv[1:]]
    assert _program(str(exe), ["mm-convert", "WanConverter", "hf_to_mm"]) == [
        str(exe),
        "WanConverter",
        "hf_to_mm",
    ]


def test_a_magistral_lora_starts_from_the_lora_base_conversion() -> None:
    """examples/magistral-2509/README.md (lora权重转换): the LoRA job converts with --is_lora_base true; SFT not."""
    entry = get_registry().get("magistral-2509")
    lora = {
        s.stage: s
        for s in build_pipeline(entry, entry.task("lora") or entry.tasks[0], entry.sizes[0], "26.0.0")
    }
    sft = {
        s.stage: s
        for s in build_pipeline(entry, entry.task("sft") or entry.tasks[0], entry.sizes[0], "26.0.0")
    }
    assert any("--is_lora_base true" in c for c in lora["weights"].commands), lora["weights"].commands
    assert not any("--is_lora_base" in c for c in sft["weights"].commands), sft["weights"].commands

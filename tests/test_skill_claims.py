"""The nine wrong claims of the seed skills (reference mindspeed-mm.md §7.4), each kept corrected.

Every test reads the GENERATED skills (`skills/**`, what `mm-agent skills build` renders and what an assistant
loads) and checks that the correct fact is stated and the wrong one is not. Facts that live in the registry
are taken from it, so a registry change that the skills fail to follow fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mm_agent.registry import get_registry
from mm_agent.skills.context import list_signatures

SKILLS = Path(__file__).resolve().parent.parent / "skills"
GEN = "mindspeed-mm-generative"
VLM = "mindspeed-mm-vlm"
ENV = "mindspeed-mm-env-setup"
WEIGHTS = "mindspeed-mm-weight-prep"
TROUBLE = "mindspeed-mm-troubleshooting"
ROUTER = "mindspeed-mm-pipeline"


def text(skill: str, rel: str = "SKILL.md") -> str:
    path = SKILLS / skill / rel
    assert path.is_file(), f"{path} is missing: run `mm-agent skills build`"
    return path.read_text(encoding="utf-8")


def every_file() -> dict[str, str]:
    files = {p.relative_to(SKILLS).as_posix(): p.read_text(encoding="utf-8") for p in SKILLS.rglob("*.md")}
    assert len(files) >= 6, "the six skills are not built"
    return files


def rows(markdown: str, first_cell: str) -> list[list[str]]:
    """Cells of the table rows whose first cell is `first_cell` (backticks ignored)."""
    found = []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if cells[0].strip("`") == first_cell:
                found.append(cells)
    return found


def test_1_feature_extraction_configs_use_ae_text_encoder_and_mm_args() -> None:
    skill = text(GEN) + text(GEN, "references/feature-extraction.md")
    assert "`model_t2v.json` has the blocks `ae` (VAE) and `text_encoder`" in skill
    for flag in ("--mm-data", "--mm-model", "--mm-tool"):
        assert f"`{flag}`" in skill
    for path, body in every_file().items():
        # model-steps.md quotes other projects' launch lines as their READMEs give them (Self-Forcing's
        # inference.py and verl's GRPO scripts do take --data_path); each is re-found by test_step_citations.py
        if path.endswith("references/model-steps.md"):
            body = "\n".join(line for line in body.splitlines() if "--data_path" not in line)
        for wrong in ("--model_config", "--data_config", "--data_path"):
            assert wrong not in body, f"{path} names the made-up flag {wrong}"
        assert not re.search(r"[\"']vae[\"']\s*:", body), f"{path} shows a `vae` block in model_t2v.json"


def test_2_training_reads_feature_data_json_not_a_data_txt() -> None:
    skill = text(GEN)
    assert "Training reads `feature_data.json`: `dataset_param.basic_parameters.data_path`" in skill
    assert "`data_folder` (the `save_path` folder itself" in skill
    assert (
        "The only data.txt" in skill and "is feature extraction's input, `feature_extract/data.txt`" in skill
    )
    for path, body in every_file().items():
        assert "t2v/data.txt" not in body, f"{path} names examples/wan2.1/1.3b/t2v/data.txt"
        claim = re.search(r"train(ing|s)?\s+(reads|uses|loads|needs)\b[^.|]*data\.txt", body, re.I)
        assert claim is None, f"{path}: {claim.group(0) if claim else ''}"


def test_3_feature_file_names() -> None:
    skill = text(GEN) + text(GEN, "references/feature-extraction.md")
    assert "`features/<basename with dots replaced by _>.pt`" in skill
    assert "`video0001.mp4` → `features/video0001_mp4.pt`" in skill
    assert "collision-safe names" in skill  # mm-agent's own runtime
    assert "overwrite each other" in skill
    for path, body in every_file().items():
        assert "test_0000" not in body, f"{path} shows the made-up name test_0000.pt"


def test_4_wan_pp_layers_flat_is_pp_nested_is_vpp_and_layer_counts_come_from_the_registry() -> None:
    weights, gen = text(WEIGHTS), text(GEN)
    for skill in (weights, gen):
        assert "`[7,8,8,7]`" in skill and "`[[3,4,4,4],[3,4,4,4]]`" in skill
    assert "`pp_layers` is a flat list with one number per PP stage" in weights
    assert "A nested list means VPP" in weights and "a nested list means VPP" in gen
    for size in get_registry().get("wan2.1").sizes:  # 1.3b: 30 layers, 14b: 40
        layers = size.arch["num_layers"]
        assert f"`wan2.1` {size.id}: {layers} layers" in weights
        assert [c[:3] for c in rows(gen, "wan2.1") if c[1] == size.id] == [["`wan2.1`", size.id, str(layers)]]
    for path, body in every_file().items():
        assert "[[6,6,6,6]]" not in body and "24-layer" not in body, path
        for line in body.splitlines():
            if "[[7,8,8,7]]" in line:
                assert "VPP" in line, f"{path}: [[7,8,8,7]] presented as plain PP: {line}"


def test_5_install_sh_is_used_where_the_readmes_use_it() -> None:
    env, gen = text(ENV), text(GEN)
    users = {
        (m.id, " ".join(d.install_sh)) for m in get_registry().models.values() for d in m.deps if d.install_sh
    }
    assert {"wan2.2", "hunyuanvideo_1.5"} <= {mid for mid, _ in users}
    for model_id, args in users:
        assert any(f"bash scripts/install.sh {args}" in " ".join(c) for c in rows(env, model_id)), model_id
    for model_id in ("wan2.2", "hunyuanvideo_1.5"):
        assert re.search(rf"`{re.escape(model_id)}` 26\.\d\.\d", gen), f"generative skill omits {model_id}"
    for path, body in every_file().items():
        assert not re.search(r"(do not|don't|never)\s+use\s+`?bash scripts/install\.sh", body, re.I), path


def test_6_converters_and_their_methods_come_from_the_registry() -> None:
    converters = text(WEIGHTS, "references/converters.md")
    seen: dict[str, list[str]] = {}
    stubs: dict[str, set[str]] = {}
    for m in get_registry().models.values():
        if m.converter is not None:
            seen[m.converter.class_name] = m.converter.methods
            stubs[m.converter.class_name] = set(m.converter.stubs)
    for name, methods in seen.items():
        (row,) = rows(converters, name)
        listed = row[1].split(", ")
        assert [re.sub(r" \(a stub[^)]*\)$", "", m) for m in listed] == methods, f"{name}: {row[1]}"
        marked = {m.split(" ")[0] for m in listed if "(a stub" in m}
        assert marked == stubs[name], f"{name}: stubs upstream {sorted(stubs[name])}, marked {row[1]}"
    wan = seen["WanConverter"]
    assert {"lora_hf_to_mm", "layerzero_to_mm", "merge_lora_to_base", "mm_to_dcp"} <= set(wan)
    assert "lora_hf_to_dcp" in seen["Qwen3VLConverter"]
    models = text(GEN, "references/models.md")
    hv15 = rows(models, "hunyuanvideo_1.5")[0]  # the model table comes first
    assert hv15[4] == "none (loads HF weights)"  # it loads the original DiT; no HunyuanVideoConverter
    assert rows(models, "hunyuanvideo")[0][4].startswith("HunyuanVideoConverter:")


def test_7_models_removed_in_26_1_0_are_marked() -> None:
    registry = get_registry()
    removed = {m.id for m in registry.models.values() if m.versions.until == "26.0.0"}
    assert {"internvl2.5", "deepseekvl2", "whisper", "lumina", "qwen2vl", "cogvideox", "stepvideo"} <= removed
    index = text(ROUTER, "references/model-index.md")
    for model_id in sorted(registry.models):
        (row,) = rows(index, model_id)
        assert ("removed in 26.1.0" in row[6]) == (model_id in removed), (model_id, row[6])
    router = text(ROUTER)
    (line,) = [ln for ln in router.split("\n\n") if ln.startswith("Removed in MindSpeed-MM 26.1.0")]
    assert {s.strip(" .\n") for s in line.split(":", 1)[1].split(",")} == removed
    gone = ("pretrain_internvl.py", "pretrain_deepseekvl.py", "pretrain_whisper.py", "pretrain_lumina.py")
    for path, body in every_file().items():
        for row in (ln for ln in body.splitlines() if ln.startswith("| `")):
            if any(script in row for script in (*gone, "posttrain_qwen2vl_dpo.py")):
                assert "removed in 26.1.0" in row, f"{path}: {row[:120]}"


@pytest.mark.parametrize("skill", [ENV, GEN, VLM])
def test_8_base_pins_are_per_version(skill: str) -> None:
    body = text(skill) if skill == ENV else text(skill, "references/deps.md")
    versions = get_registry().versions
    for v in versions.versions:
        (row,) = rows(body, v.id + (" (default)" if v.id == versions.default else ""))
        pins = row[-1].split(", ")
        for name, spec in v.base_pins.items():
            assert name + (spec if spec[0] in "<>=!~" else f"=={spec}") in pins, (v.id, name, row[-1])
    assert versions.get("26.1.0").base_pins["diffusers"] != versions.get("26.0.0").base_pins["diffusers"]
    for path, file_text in every_file().items():
        assert "transformers==4.57.0, diffusers==0.30.3, peft==0.7.1" not in file_text, path


def test_9_hccl_bind_errors_are_fixed_with_hccl_ports_not_master_port() -> None:
    skill = text(TROUBLE)
    (paragraph,) = [
        p for p in skill.split("\n\n") if "Communication_Error_Bind_IP_Port" in p and "MASTER" in p
    ]
    assert "changing `MASTER_PORT` does not fix" in paragraph
    assert "`HCCL_IF_BASE_PORT`" in paragraph and "`HCCL_NPU_SOCKET_PORT_RANGE`" in paragraph
    by_id = {s.id: s for s in list_signatures()}
    host, npu = rows(skill, "hccl_host_port_in_use"), rows(skill, "hccl_npu_port_in_use")
    assert "HCCL_IF_BASE_PORT" in host[0][2] and "MASTER_PORT" not in host[0][2]
    assert "HCCL_NPU_SOCKET_PORT_RANGE" in npu[0][2]
    assert "HCCL_IF_BASE_PORT" in by_id["hccl_host_port_in_use"].env_vars  # the catalog agrees
    signatures = text(TROUBLE, "references/signatures.md")
    (row,) = rows(signatures, "hccl_host_port_in_use")
    assert "HCCL_IF_BASE_PORT" in row[-1] and "MASTER_PORT" not in row[-1]


def test_a_rehearsal_is_routed_to_the_demo_of_its_family() -> None:
    """Issue 27: "try the VLM pipeline on this machine first" leads to `mm-agent demo --vlm` (router table,
    router rule, the VLM skill's description and decisions); the generative skill keeps `mm-agent demo`.
    The demos and what runtime=bundled trains come from route_model's vocabulary and render_job's check."""
    from mm_agent.route import load_vocabulary
    from mm_agent.skills.context import bundled_tasks

    router, vlm, gen = text(ROUTER), text(VLM), text(GEN)
    for d in load_vocabulary().rehearsal.demos:
        assert f"`{d.command}` ({d.model} {d.task})" in router, d
    (row,) = rows(router, '"try Qwen2.5-VL sft on this machine first"')
    assert row[1:] == ["`mindspeed-mm-vlm`", "`mm-agent demo --vlm` (CLI), then `finetune-vlm`"]
    (row,) = rows(router, '"try Wan2.1 t2v on this machine first"')
    assert row[1:] == ["`mindspeed-mm-generative`", "`mm-agent demo` (CLI), then `finetune-generative`"]
    assert (
        f"`runtime=bundled` then trains real data on CPU/GPU: {', '.join(bundled_tasks(get_registry()))}."
        in router
    )
    description = vlm.split("---")[1]
    assert "on this machine first without NPUs (mm-agent demo --vlm" in description
    assert "- **Rehearse first**" in vlm and "`mm-agent demo --vlm --lora`" in vlm
    assert "`mm-agent demo`, `mm-agent demo --lora`" in gen and "--vlm" not in gen

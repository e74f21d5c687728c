"""The model registry data: it loads, is complete, agrees with itself and with the release matrix.

Everything here loads the real data files (no mocks). Facts checked against the MindSpeed-MM research notes
(/work/shared/reference/mindspeed-mm.md §4 model catalog, §6.2 per-model deps, §7.4 skill errata).
"""

from __future__ import annotations

import itertools
import unicodedata
from pathlib import Path

import pytest
import yaml

from mm_agent.errors import MMAgentError
from mm_agent.registry import DATA_DIR, get_registry, load_models, load_unregistered_examples, load_versions
from mm_agent.registry.schema import ConverterSpec, ModelEntry, ScriptRef, SizeSpec, VersionRange
from mm_agent.templating import templates_dir

# Every examples/ directory of the §4 catalog (the "(≤2.2 only)" row is out of scope) -> registry id.
CATALOG_DIRS: dict[str, str] = {
    "examples/wan2.1": "wan2.1",
    "examples/wan2.2": "wan2.2",
    "examples/vace": "vace",
    "examples/hunyuanvideo_1.5": "hunyuanvideo_1.5",
    "examples/ltx2": "ltx2",
    "examples/bagel": "bagel",
    "examples/dancegrpo": "dancegrpo",
    "examples/self_forcing": "self_forcing",
    "examples/diffusers/flux": "flux",
    "examples/diffusers/flux-kontext": "flux-kontext",
    "examples/diffusers/flux2": "flux2",
    "examples/diffusers/qwen_image": "qwen_image",
    "examples/diffusers/sd3": "sd3",
    "examples/diffusers/sdxl": "sdxl",
    "examples/diffusers/hidream": "hidream",
    "examples/diffusers/kolors": "kolors",
    "examples/diffusers/sana": "sana",
    "examples/diffsynth/qwen_image_edit": "qwen_image_edit",
    "examples/qwen2.5vl": "qwen2.5vl",
    "examples/qwen2.5omni": "qwen2.5omni",
    "examples/qwen3vl": "qwen3vl",
    "examples/qwen3omni": "qwen3omni",
    "examples/internvl3.5": "internvl3.5",
    "examples/glm4.5v": "glm4.5v",
    "examples/magistral-2509": "magistral-2509",
    "examples/qwen3_5": "qwen3_5",
    "examples/qwen3_6": "qwen3_6",
    "examples/mcore/qwen3_5": "qwen3_5_mcore",
    "examples/kimik2_5": "kimik2_5",
    "examples/kimi_k3": "kimi_k3",
    "examples/mimov2_5": "mimov2_5",
    "examples/step3_vl": "step3_vl",
    "examples/qwen3_asr": "qwen3_asr",
    "examples/qwen3tts": "qwen3tts",
    "examples/moss_tts": "moss_tts",
    "examples/cosyvoice3": "cosyvoice3",
    "examples/funasr": "funasr",
    "examples/deepseekocr2": "deepseekocr2",
    "examples/verl_examples": "verl_examples",
    "examples/qwen2vl": "qwen2vl",
    "examples/internvl2.5": "internvl2.5",
    "examples/internvl3": "internvl3",
    "examples/glm4.1v": "glm4.1v",
    "examples/deepseekvl2": "deepseekvl2",
    "examples/deepseekocr": "deepseekocr",
    "examples/cogvideox": "cogvideox",
    "examples/hunyuanvideo": "hunyuanvideo",
    "examples/opensoraplan1.3": "opensoraplan1.3",
    "examples/opensoraplan1.5": "opensoraplan1.5",
    "examples/opensora2.0": "opensora2.0",
    "examples/stepvideo": "stepvideo",
    "examples/lumina": "lumina",
    "examples/whisper": "whisper",
    "examples/videoalign": "videoalign",
    "examples/ming": "ming",
    "examples/JanusPro": "januspro",
    "examples/qihoo_t2x": "qihoo_t2x",
    "examples/vae": "vae",
}

# Examples dirs removed at v26.1.0 (§4 "≤26.0", §7.4 #7).
REMOVED_AT_26_1 = [
    "qwen2vl",
    "internvl2.5",
    "deepseekvl2",
    "cogvideox",
    "hunyuanvideo",
    "opensoraplan1.3",
    "stepvideo",
    "lumina",
    "whisper",
]

SKILL_BY_FAMILY = {
    "generative": "mindspeed-mm-generative",
    "vlm": "mindspeed-mm-vlm",
    "omni": "mindspeed-mm-vlm",
    "audio": "mindspeed-mm-vlm",
}
SEPARATORS = " -_."


@pytest.fixture(scope="module")
def models() -> dict[str, ModelEntry]:
    return get_registry().models


@pytest.fixture(scope="module")
def version_ids() -> list[str]:
    return load_versions().ids


def _fold(text: str) -> str:
    """How the router compares names: NFKC, lower case, separators ignored."""
    folded = unicodedata.normalize("NFKC", text).lower()
    return "".join(ch for ch in folded if ch not in SEPARATORS)


def _scripts(entry: ModelEntry) -> list[tuple[str, VersionRange, ScriptRef]]:
    """(where, task range, script) for every entry/inference script of every task."""
    out = []
    for i, task in enumerate(entry.tasks):
        out.append((f"{entry.id}.tasks.{i}.entry_script", task.versions, task.entry_script))
        if task.inference_script is not None:
            out.append((f"{entry.id}.tasks.{i}.inference_script", task.versions, task.inference_script))
        if task.evaluation is not None:
            out.append((f"{entry.id}.tasks.{i}.evaluation.script", task.versions, task.evaluation.script))
    return out


# ------------------------------------------------------------------------------------------------ loading


def test_registry_loads_all_catalog_dirs(models: dict[str, ModelEntry]) -> None:
    assert len(models) >= 40
    assert len(models) == len(load_models())
    for example_dir, model_id in CATALOG_DIRS.items():
        assert model_id in models, f"no registry entry for {example_dir}"
        assert models[model_id].example_dir == example_dir


def test_every_file_is_a_catalog_dir(models: dict[str, ModelEntry]) -> None:
    assert set(models) == set(CATALOG_DIRS.values())


def test_registry_data_dir_is_the_package_one() -> None:
    assert (DATA_DIR / "models" / "wan2.1.yaml").is_file()
    assert (DATA_DIR / "versions.yaml").is_file()


# ------------------------------------------------------------------------------------------ completeness


def test_entries_are_complete(models: dict[str, ModelEntry]) -> None:
    for entry in models.values():
        where = entry.id
        assert entry.name.strip() and len(entry.description) >= 20, where
        assert entry.example_dir.startswith("examples/"), where
        if entry.family in SKILL_BY_FAMILY:
            assert entry.skill == SKILL_BY_FAMILY[entry.family], where
        else:
            assert entry.skill in set(SKILL_BY_FAMILY.values()), where
        assert entry.sizes and entry.tasks, where
        for size in entry.sizes:
            assert size.id == size.id.lower() and size.id.strip(), where
            assert len(set(size.hf_ids)) == len(size.hf_ids), f"{where} size {size.id}: duplicate hf_ids"
            for role, path in size.config_files.items():
                assert path.startswith("examples/"), f"{where} size {size.id} {role}: {path}"
        for task in entry.tasks:
            if task.example_script is not None:
                assert task.example_script.startswith("examples/"), f"{where} {task.id}"
            assert task.entry_script.path.strip(), f"{where} {task.id}"


def test_task_sizes_exist(models: dict[str, ModelEntry]) -> None:
    for entry in models.values():
        size_ids = {s.id for s in entry.sizes}
        for task in entry.tasks:
            assert set(task.sizes or []) <= size_ids, f"{entry.id} {task.id}: {task.sizes} vs {size_ids}"
            if task.sizes is not None:
                assert task.sizes, f"{entry.id} {task.id}: empty size list (use null for all sizes)"


def test_feature_extraction_names_a_script(models: dict[str, ModelEntry]) -> None:
    seen = 0
    for entry in models.values():
        for task in entry.tasks:
            fe = task.feature_extraction
            if task.template == "megatron_generative" and fe is None:
                # the set's pretrain.sh trains on extracted features; a raw-video model brings its own
                own = templates_dir() / "models" / entry.id / task.template / "pretrain.sh.j2"
                assert own.is_file(), f"{entry.id} {task.id}: no feature_extraction and no {own}"
            if fe is None:
                continue
            seen += 1
            assert fe.script.startswith(("mindspeed_mm/tools/feature_extraction/", "examples/")), entry.id
            assert fe.script.endswith(".py"), entry.id
            assert fe.example_dir.startswith(entry.example_dir + "/"), entry.id
    assert seen >= 10


def test_converters_are_consistent(models: dict[str, ModelEntry]) -> None:
    for entry in models.values():
        conv = entry.converter
        if conv is None:
            continue
        assert conv.to_training in conv.methods, entry.id
        assert conv.to_hf is None or conv.to_hf in conv.methods, entry.id
        assert len(set(conv.methods)) == len(conv.methods), entry.id
        # DCP converters take flat flags, the sora/VLM Megatron converters a pydantic --cfg.
        assert conv.arg_style == ("flat" if conv.target_format == "dcp" else "cfg"), entry.id


def test_templates_match_backends(models: dict[str, ModelEntry]) -> None:
    expected = {
        "megatron_vlm": {"megatron"},
        "megatron_fsdp2_generative": {"megatron+fsdp2"},
        "transformers_fsdp2": {"megatron+fsdp2"},
        "fsdp2_native": {"fsdp2-native"},
        "accelerate_deepspeed": {"accelerate+deepspeed"},
        "megatron_generative": {"megatron", "megatron+fsdp2"},
    }
    for entry in models.values():
        for task in entry.tasks:
            if task.template in expected:
                assert task.backend in expected[task.template], f"{entry.id} {task.id}"
            if task.template == "fsdp2_native":
                assert task.entry_script.path == "mindspeed_mm/fsdp/train/trainer.py", entry.id
            if task.template == "transformers_fsdp2":
                assert task.entry_script.path == "pretrain_transformers.py", entry.id
            if task.template == "megatron_vlm":
                assert task.entry_script.path == "pretrain_vlm.py", entry.id
            if task.template == "accelerate_deepspeed":
                assert task.launcher == "accelerate", entry.id


# ------------------------------------------------------------------------------------------------ versions


def test_every_version_is_known(models: dict[str, ModelEntry], version_ids: list[str]) -> None:
    known = {*version_ids, "1.0.0"}
    for entry in models.values():
        ranges = [entry.versions]
        ranges += [t.versions for t in entry.tasks]
        ranges += [s.versions for s in entry.sizes]
        ranges += [d.versions for d in entry.deps]
        ranges += [ref.versions for _, _, ref in _scripts(entry)]
        ranges += [t.feature_extraction.versions for t in entry.tasks if t.feature_extraction]
        ranges += [rng for s in entry.sizes for rng in s.config_file_versions.values()]
        if entry.converter is not None:
            ranges += [entry.converter.versions, *entry.converter.method_versions.values()]
        for rng in ranges:
            assert rng.since in known, f"{entry.id}: {rng.since}"
            assert rng.until is None or rng.until in version_ids, f"{entry.id}: {rng.until}"


def test_every_task_exists_in_some_version(models: dict[str, ModelEntry], version_ids: list[str]) -> None:
    for entry in models.values():
        assert any(entry.versions.contains(v) for v in version_ids), entry.id
        for task in entry.tasks:
            live = [v for v in version_ids if entry.versions.contains(v) and task.versions.contains(v)]
            assert live, f"{entry.id} {task.id} exists in no version"
            assert any(task.entry_script.versions.contains(v) for v in live), f"{entry.id} {task.id}"


def test_root_entry_points_are_in_the_release_matrix(models: dict[str, ModelEntry]) -> None:
    table = load_versions()
    checked = 0
    for entry in models.values():
        for where, task_range, ref in _scripts(entry):
            if "/" in ref.path:
                continue
            for info in table.versions:
                v = info.id
                if entry.versions.contains(v) and task_range.contains(v) and ref.versions.contains(v):
                    checked += 1
                    assert ref.path in info.root_entry_points, f"{where}: {ref.path} is not in MM {v}"
    assert checked > 100


def test_scripts_removed_at_26_1_are_bounded(models: dict[str, ModelEntry]) -> None:
    table = load_versions()
    head = set(table.get("26.1.0").root_entry_points)  # type: ignore[union-attr]
    old = set(table.get("26.0.0").root_entry_points)  # type: ignore[union-attr]
    removed = old - head
    assert {
        "pretrain_internvl.py",
        "pretrain_deepseekvl.py",
        "pretrain_whisper.py",
        "pretrain_lumina.py",
        "posttrain_qwen2vl_dpo.py",
    } <= removed
    for entry in models.values():
        for where, _, ref in _scripts(entry):
            if ref.path in removed:
                assert ref.versions.until == "26.0.0", f"{where}: {ref.path} needs versions.until 26.0.0"


@pytest.mark.parametrize("model_id", REMOVED_AT_26_1)
def test_models_removed_at_26_1(models: dict[str, ModelEntry], model_id: str) -> None:
    entry = models[model_id]
    assert entry.versions.contains("26.0.0")
    assert not entry.versions.contains("26.1.0")
    assert not entry.versions.contains("master")


def test_deps_overlays_do_not_overlap(models: dict[str, ModelEntry], version_ids: list[str]) -> None:
    for entry in models.values():
        for a, b in itertools.combinations(entry.deps, 2):
            both = [v for v in version_ids if a.versions.contains(v) and b.versions.contains(v)]
            assert not both, f"{entry.id}: deps overlays overlap in {both}"


def test_deps_cover_the_model_range(models: dict[str, ModelEntry], version_ids: list[str]) -> None:
    for entry in models.values():
        if not entry.deps:
            continue
        for v in version_ids:
            if entry.versions.contains(v):
                assert entry.deps_for(v) is not None, f"{entry.id}: no deps overlay for {v}"


def test_version_facts(models: dict[str, ModelEntry]) -> None:
    wan22_26_0 = models["wan2.2"].deps_for("26.0.0")
    assert wan22_26_0 is not None
    assert {"diffusers==0.35.1", "peft==0.17.1"} <= set(wan22_26_0.pins())  # what requirements.txt holds
    assert [a.requirements for a in wan22_26_0.steps] == ["mm:examples/wan2.2/requirements.txt"]
    assert wan22_26_0.install_sh == ["--megatron", "--msid", "96bc0a3bf3398bf45ac26e0bded95ee174ac449b"]
    wan22_head = models["wan2.2"].deps_for("26.1.0")
    assert wan22_head is not None and wan22_head.requirements_file is None and not wan22_head.steps
    assert not any(p.startswith("diffusers") for p in wan22_head.pins())

    wan21 = models["wan2.1"].deps_for("26.0.0")
    assert wan21 is not None and "diffusers==0.33.1" in wan21.pip
    wan21_head = models["wan2.1"].deps_for("26.1.0")
    assert wan21_head is not None and not any(p.startswith("diffusers") for p in wan21_head.pip)

    hv15 = models["hunyuanvideo_1.5"]
    assert hv15.converter is None
    hv15_deps = hv15.deps_for("26.0.0")
    assert hv15_deps is not None and {"diffusers==0.35.0", "transformers==4.57.1"} <= set(hv15_deps.pins())
    assert not hv15.versions.contains("2.3.0")

    assert models["qwen3vl"].converter is not None
    assert models["qwen3vl"].converter.class_name == "Qwen3VLConverter"
    assert "lora_hf_to_dcp" in models["qwen3vl"].converter.methods
    assert {"layerzero_to_mm", "merge_lora_to_base", "mm_to_dcp"} <= set(models["wan2.2"].converter.methods)

    wan22_5b = models["wan2.2"].size("5B")
    assert wan22_5b is not None and wan22_5b.parallel.pipeline_num_layers == [30]
    assert wan22_5b.arch["hidden_size"] == 3072 and wan22_5b.arch["num_heads"] == 24

    cog = models["cogvideox"].converter
    assert cog is not None and cog.init_args == {"version": "t2v"}
    assert models["dancegrpo"].family == "post-training"
    assert models["verl_examples"].family == "post-training"


# ------------------------------------------------------------------------------------------------- aliases


def test_aliases_are_unique_across_models(models: dict[str, ModelEntry]) -> None:
    owner: dict[str, str] = {}
    for entry in models.values():
        for alias in entry.aliases:
            key = _fold(alias)
            assert key, f"{entry.id}: empty alias"
            assert owner.setdefault(key, entry.id) == entry.id, (
                f"alias {alias!r} of {entry.id} clashes with {owner[key]}"
            )


def test_no_alias_names_another_model(models: dict[str, ModelEntry]) -> None:
    ids = {_fold(model_id): model_id for model_id in models}
    names = {_fold(entry.name): entry.id for entry in models.values()}
    for entry in models.values():
        for alias in entry.aliases:
            for table in (ids, names):
                other = table.get(_fold(alias), entry.id)
                assert other == entry.id, f"alias {alias!r} of {entry.id} is the id/name of {other}"


def test_model_ids_and_names_are_distinct(models: dict[str, ModelEntry]) -> None:
    folded_ids = [_fold(model_id) for model_id in models]
    assert len(set(folded_ids)) == len(folded_ids)
    folded_names = [_fold(entry.name) for entry in models.values()]
    assert len(set(folded_names)) == len(folded_names)


def test_ascii_aliases_are_lower_case_except_hf_ids(models: dict[str, ModelEntry]) -> None:
    for entry in models.values():
        for alias in entry.aliases:
            assert alias == alias.strip(), f"{entry.id}: {alias!r}"
            if "/" not in alias and alias.isascii():
                assert alias == alias.lower(), f"{entry.id}: {alias!r} should be lower case"


# --------------------------------------------------------------------------------------- malformed data


def _copy_entry(tmp_path: Path, model_id: str, name: str | None = None) -> tuple[dict, Path]:
    raw = yaml.safe_load((DATA_DIR / "models" / f"{model_id}.yaml").read_text(encoding="utf-8"))
    target = tmp_path / "models" / f"{name or model_id}.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    return raw, target


def test_bad_backend_names_file_and_field(tmp_path: Path) -> None:
    raw, target = _copy_entry(tmp_path, "wan2.1")
    raw["tasks"][0]["backend"] = "megatorn"
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(tmp_path)
    text = str(err.value)
    assert "wan2.1.yaml" in text
    assert "tasks.0.backend" in text
    assert err.value.field == "tasks.0.backend"


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    raw, target = _copy_entry(tmp_path, "qwen3vl")
    raw["sizes"][0]["hf_id"] = "Qwen/Qwen3-VL-8B-Instruct"  # typo for hf_ids
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(tmp_path)
    assert "qwen3vl.yaml" in str(err.value)
    assert "sizes.0.hf_id" in str(err.value)


def test_converter_method_must_exist(tmp_path: Path) -> None:
    raw, target = _copy_entry(tmp_path, "wan2.2")
    raw["converter"]["to_hf"] = "dcp_to_hf"
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(tmp_path)
    assert "wan2.2.yaml" in str(err.value) and "converter" in str(err.value)


def test_id_must_match_file_name(tmp_path: Path) -> None:
    raw, target = _copy_entry(tmp_path, "wan2.1", name="wan9")
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(tmp_path)
    assert "wan9.yaml" in str(err.value)
    assert err.value.field == "id"


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "models" / "broken.yaml"
    target.parent.mkdir(parents=True)
    target.write_text("id: broken\ntasks: [\n", encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(tmp_path)
    assert "broken.yaml" in str(err.value)


def test_empty_models_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(MMAgentError):
        load_models(tmp_path)


# ------------------------------------------------------------------------- version-scoped files and methods


def test_config_file_versions_scope_roles() -> None:
    size = SizeSpec.model_validate(
        {
            "id": "5b",
            "config_files": {"model": "examples/m/model.json", "fsdp2": "examples/m/5B/fsdp2.yaml"},
            "config_file_versions": {"fsdp2": {"since": "2.3.0"}},
            "versions": {"since": "2.2.0"},
        }
    )
    assert size.config_files_at("2.1.0") == {}
    assert size.config_files_at("2.2.0") == {"model": "examples/m/model.json"}
    assert size.config_files_at("26.0.0") == size.config_files
    with pytest.raises(ValueError, match="not config_files roles"):
        SizeSpec.model_validate({"id": "5b", "config_files": {}, "config_file_versions": {"fsdp2": {}}})
    wan22 = get_registry().get("wan2.2").size("a14b")
    assert wan22 is not None
    assert wan22.config_files_at("2.2.0")["fsdp2_shared"] == "examples/wan2.2/fsdp2_config.yaml"
    assert "fsdp2_shared" not in wan22.config_files_at("26.0.0")


def test_converter_method_versions() -> None:
    base = {"class": "C", "methods": ["hf_to_mm", "lora_hf_to_mm"], "target_format": "mm"}
    base |= {"to_training": "hf_to_mm", "arg_style": "cfg", "versions": {"since": "2.2.0"}}
    conv = ConverterSpec.model_validate(base | {"method_versions": {"lora_hf_to_mm": {"since": "2.3.0"}}})
    assert conv.has_method("hf_to_mm", "2.2.0") and not conv.has_method("hf_to_mm", "2.1.0")
    assert not conv.has_method("lora_hf_to_mm", "2.2.0") and conv.has_method("lora_hf_to_mm", "master")
    assert not conv.has_method("mm_to_hf", "26.0.0")
    with pytest.raises(ValueError, match="not in methods"):
        ConverterSpec.model_validate(base | {"method_versions": {"nope": {}}})
    with pytest.raises(ValueError, match="narrow the converter's versions"):
        ConverterSpec.model_validate(base | {"method_versions": {"hf_to_mm": {"since": "2.3.0"}}})
    qwen25 = get_registry().get("qwen2.5vl").converter
    assert qwen25 is not None and not qwen25.has_method("hf_to_mm_ldt", "26.0.0")
    assert qwen25.has_method("hf_to_mm_ldt", "26.1.0")
    assert get_registry().get("stepvideo").converter.cli_registered is False  # type: ignore[union-attr]


def test_unregistered_examples_are_not_models(models: dict[str, ModelEntry]) -> None:
    dirs = load_unregistered_examples()
    model_dirs = {entry.example_dir for entry in models.values()}
    assert {d.dir for d in dirs}.isdisjoint(model_dirs)
    containers = {d.dir for d in dirs if d.kind == "container"}
    for entry in models.values():
        parent = entry.example_dir.rsplit("/", 1)[0]
        assert parent == "examples" or parent in containers, f"{entry.id}: {parent} is not a container"


def test_unregistered_examples_errors_name_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "versions.yaml").write_text((DATA_DIR / "versions.yaml").read_text(encoding="utf-8"))
    raw = yaml.safe_load((DATA_DIR / "unregistered_examples.yaml").read_text(encoding="utf-8"))
    raw["dirs"][1]["versions"] = {"since": "2.9.0"}
    target = tmp_path / "unregistered_examples.yaml"
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_unregistered_examples(tmp_path)
    assert "unregistered_examples.yaml" in str(err.value) and err.value.field == "dirs.1.versions"
    raw["dirs"][1] = dict(raw["dirs"][0])
    target.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(MMAgentError, match="duplicate dirs"):
        load_unregistered_examples(tmp_path)

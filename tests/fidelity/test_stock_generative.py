"""Generative jobs rendered with defaults against MindSpeed-MM's stock examples of the same version.

Every registry (model, task, backend, size) on the `megatron_generative` / `megatron_fsdp2_generative`
template sets is rendered (dry run) at 26.0.0 and 26.1.0. Each rendered script is compared with its stock
counterpart (training, inference, feature extraction) flag by flag and exported env var by env var; each
config the script passes (`--mm-data`, `--mm-model`, `--mm-tool`, `--fsdp2-config-path`,
`--layerzero-config`) is compared key by key with the file the stock script passes for the same flag.
What is left after user choices and declared deviations (`registry/data/deviations/`) fails, named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.registry.deviations import deviations_for
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script
from tests.fidelity.stockdiff import ABSENT, Difference, diff_config, diff_script, registry_cases, undeclared

SETS = ("megatron_generative", "megatron_fsdp2_generative")
VERSIONS = ("26.0.0", "26.1.0")
CONFIG_FLAGS = ("--mm-data", "--mm-model", "--mm-tool", "--fsdp2-config-path", "--layerzero-config")
STAGE_OF_SCRIPT = {
    "pretrain.sh": "train",
    "finetune.sh": "train",
    "inference.sh": "sample",
    "feature_extract/feature_extraction.sh": "extract",
}

# The stock script each rendered stage mirrors, per (model, task, backend, size): the registry names one
# example script per task (for its first size); the stages and the other sizes are listed here, and
# `test_every_case_has_a_stock_map` keeps this table in step with the registry. Paths are relative to
# the MindSpeed-MM root; None = the stock example has no such script. A key "<stage> <flag>" names the stock
# config to compare with where the stock README tells the user to swap the one the script passes.
STOCK: dict[tuple[str, str, str, str], dict[str, str | None]] = {
    **{
        ("wan2.1", task, "megatron", size): {
            "train": f"examples/wan2.1/{size}/{task}/pretrain.sh",
            "sample": f"examples/wan2.1/{size}/{task}/inference.sh",
            "extract": "examples/wan2.1/feature_extract/feature_extraction.sh",
            # the stock extraction script names model_t2v.json; its README swaps in model_i2v.json for i2v
            "extract --mm-model": f"examples/wan2.1/feature_extract/model_{task}.json",
        }
        for task in ("t2v", "i2v")
        for size in ("1.3b", "14b")
    },
    **{
        ("wan2.1", "lora", "megatron", size): {
            "train": f"examples/wan2.1/{size}/t2v/finetune_lora.sh",
            "sample": f"examples/wan2.1/{size}/t2v/inference.sh",
            "extract": "examples/wan2.1/feature_extract/feature_extraction.sh",
            "extract --mm-model": "examples/wan2.1/feature_extract/model_t2v.json",
        }
        for size in ("1.3b", "14b")
    },
    ("wan2.1", "t2v", "megatron+fsdp2", "14b"): {
        "train": "examples/wan2.1/14b/t2v/pretrain_fsdp2.sh",
        "sample": "examples/wan2.1/14b/t2v/inference.sh",
        "extract": "examples/wan2.1/feature_extract/feature_extraction.sh",
    },
    ("wan2.2", "t2v", "megatron+fsdp2", "5b"): {
        "train": "examples/wan2.2/5B/t2v/pretrain.sh",
        "sample": "examples/wan2.2/5B/t2v/inference.sh",
    },
    ("wan2.2", "ti2v", "megatron+fsdp2", "5b"): {
        "train": "examples/wan2.2/5B/ti2v/pretrain.sh",
        "sample": "examples/wan2.2/5B/ti2v/inference.sh",
    },
    ("wan2.2", "t2v", "megatron+fsdp2", "a14b"): {
        "train": "examples/wan2.2/A14B/t2v/pretrain_high.sh",
        "sample": "examples/wan2.2/A14B/t2v/inference.sh",
    },
    ("wan2.2", "i2v", "megatron+fsdp2", "a14b"): {
        "train": "examples/wan2.2/A14B/i2v/pretrain_high.sh",
        "sample": "examples/wan2.2/A14B/i2v/inference.sh",
    },
    ("wan2.2", "lora", "megatron+fsdp2", "a14b"): {
        "train": "examples/wan2.2/A14B/t2v/finetune_lora_high.sh",
        "sample": "examples/wan2.2/A14B/t2v/inference.sh",
    },
    **{
        ("hunyuanvideo_1.5", task, "megatron+fsdp2", "default"): {
            "train": f"examples/hunyuanvideo_1.5/{task}/pretrain_hunyuanvideo_15.sh",
            "sample": f"examples/hunyuanvideo_1.5/{task}/inference_hunyuanvideo_15.sh",
        }
        for task in ("t2v", "i2v")
    },
    **{
        ("cogvideox", task, "megatron", size): {
            "train": f"examples/cogvideox/{task}_{size}/pretrain_cogvideox_{task}{'' if size == '1.0' else '_1.5'}.sh",
            "sample": f"examples/cogvideox/{task}_{size}/inference_cogvideox_{task}{'' if size == '1.0' else '_1.5'}.sh",
        }
        for task in ("t2v", "i2v")
        for size in ("1.0", "1.5")
    },
    ("cogvideox", "lora", "megatron", "1.5"): {
        "train": "examples/cogvideox/t2v_1.5/finetune_cogvideox_lora_t2v_1.5.sh",
        "sample": "examples/cogvideox/t2v_1.5/inference_cogvideox_t2v_1.5.sh",
    },
    ("hunyuanvideo", "t2v", "megatron", "default"): {
        "train": "examples/hunyuanvideo/t2v/pretrain_hunyuanvideo.sh",
        "sample": "examples/hunyuanvideo/t2v/inference_hunyuanvideo.sh",
        "extract": "examples/hunyuanvideo/feature_extract/feature_extraction.sh",
    },
    ("hunyuanvideo", "i2v", "megatron", "default"): {
        "train": "examples/hunyuanvideo/i2v/pretrain_hunyuanvideo.sh",
        "sample": "examples/hunyuanvideo/i2v/inference_hunyuanvideo.sh",
        "extract": "examples/hunyuanvideo/feature_extract/feature_extraction_i2v.sh",
    },
    ("hunyuanvideo", "lora", "megatron", "default"): {
        "train": "examples/hunyuanvideo/i2v/pretrain_hunyuanvideo_lora.sh",
        "sample": "examples/hunyuanvideo/i2v/inference_hunyuanvideo.sh",
        "extract": "examples/hunyuanvideo/feature_extract/feature_extraction_i2v.sh",
    },
    ("opensoraplan1.3", "t2v", "megatron", "default"): {
        "train": "examples/opensoraplan1.3/t2v_A3/pretrain_t2v_A2.sh",
        "sample": "examples/opensoraplan1.3/t2v/inference_t2v.sh",
        "extract": "examples/opensoraplan1.3/t2v_A3/feature_extract/extract_feature.sh",
    },
    ("stepvideo", "t2v", "megatron", "default"): {
        "train": "examples/stepvideo/t2v/pretrain_t2v.sh",
        "sample": "examples/stepvideo/t2v/inference_t2v.sh",
        "extract": "examples/stepvideo/feature_extract/feature_extraction.sh",
    },
    ("stepvideo", "i2v", "megatron", "default"): {
        "train": "examples/stepvideo/i2v/pretrain_i2v.sh",
        "sample": "examples/stepvideo/i2v/inference_i2v.sh",
        "extract": "examples/stepvideo/feature_extract/feature_extraction_i2v.sh",
    },
    **{
        ("vace", "v2v", "megatron+fsdp2", size): {
            "train": f"examples/vace/{folder}/{script}",
            "sample": None,  # stock inference is examples/vace/inference/Wan-VACE-Inference.py, no script
            "extract": "examples/vace/feature_extract/feature_extraction.sh",
        }
        for size, folder, script in (
            ("1.3b", "1.3B", "pretrain_fsdp.sh"),
            ("14b", "14B", "pretrain_fsdp.sh"),
            ("a14b", "A14B_wan2.2", "pretrain_fsdp_high.sh"),
        )
    },
}


# A LoRA that adapts another stock model (registry `also_adapts`, render_job `adapts`): its stock scripts
ADAPTED: dict[tuple[str, str, str, str, str], dict[str, str | None]] = {
    ("wan2.1", "lora", "megatron", "14b", "i2v"): {
        "train": "examples/wan2.1/14b/i2v/finetune_lora.sh",
        "sample": "examples/wan2.1/14b/i2v/inference.sh",
        "extract": "examples/wan2.1/feature_extract/feature_extraction.sh",
        "extract --mm-model": "examples/wan2.1/feature_extract/model_i2v.json",
    },
}

CASES = registry_cases(SETS, VERSIONS)
PARAMS = [pytest.param(*case, id="-".join(case)) for case in CASES]


def test_every_case_has_a_stock_map() -> None:
    keys = {case[:4] for case in CASES}
    assert keys, "no generative registry task on the megatron template sets"
    assert sorted(keys - set(STOCK)) == [], "registry cases with no stock scripts listed in STOCK"
    assert sorted(set(STOCK) - keys) == [], "STOCK lists cases the registry no longer has"


def _load(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


class Job:
    """A dry-run render, with a fake job folder the scripts' `$JOB_DIR` resolves to."""

    def __init__(
        self,
        model: str,
        task: str,
        backend: str,
        size: str,
        version: str,
        out: Path,
        adapts: str | None = None,
    ) -> None:
        request = RenderRequest(
            model=model,
            task=task,
            adapts=adapts,
            backend=backend,
            size=size,
            mm_version=version,
            out_dir=str(out),
        )
        result = render_job(request)
        self.dir = Path(result.job_dir)
        self.files = {f.path: f.content or "" for f in result.files}


def _config_paths(script_path: str, text: str, root: Path, mm_root_default: str | None) -> dict[str, str]:
    """flag -> path of each config file the script's launch command passes (absolute paths as they are,
    relative ones against the MindSpeed-MM root the script runs in)."""
    info = parse_script(script_path, text)
    out: dict[str, str] = {}
    for cmd in info.commands:
        for flag in CONFIG_FLAGS:
            value = cmd.value(flag)
            if value is None:
                continue
            if mm_root_default and value.startswith(mm_root_default.rstrip("/") + "/"):
                value = value[len(mm_root_default.rstrip("/")) + 1 :]
            out[flag] = value if value.startswith("/") else str(root / value)
    return out


def compare_job(
    model: str,
    task: str,
    backend: str,
    size: str,
    version: str,
    tree: Path,
    out: Path,
    adapts: str | None = None,
) -> tuple[list[Difference], int]:
    """Every difference of the rendered job from the stock example, and the number of files compared (a LoRA
    job that adapts another stock model, `adapts`, against ADAPTED's scripts)."""
    job = Job(model, task, backend, size, version, out, adapts)
    stock = ADAPTED[(model, task, backend, size, adapts)] if adapts else STOCK[(model, task, backend, size)]
    diffs: list[Difference] = []
    compared = 0
    configs_seen: set[str] = set()
    for rel, stage in _stages(job.files):
        stock_rel = stock.get(stage)
        if stock_rel is None:
            diffs.append(Difference(rel, "<file>", "rendered", ABSENT))
            continue
        stock_path = tree / stock_rel
        assert stock_path.is_file(), f"{stock_rel} is not in MindSpeed-MM {version} (fix STOCK)"
        text, stock_text = job.files[rel], stock_path.read_text(encoding="utf-8")
        script_path = str(job.dir / rel)
        diffs += diff_script(text, stock_text, rel, rendered_path=script_path, stock_path=str(stock_path))
        compared += 1
        mm_default = parse_script(script_path, text).env.get("MM_ROOT_DEFAULT")
        mine = _config_paths(script_path, text, tree, mm_default)
        theirs = _config_paths(str(stock_path), stock_text, tree, None)
        theirs.update(
            {f: str(tree / stock[f"{stage} {f}"]) for f in CONFIG_FLAGS if stock.get(f"{stage} {f}")}
        )
        for flag in sorted(set(mine) | set(theirs)):
            if flag not in mine or flag not in theirs:
                continue  # the flag itself is already a script difference
            path = Path(mine[flag])
            if path.is_relative_to(job.dir):
                name = path.relative_to(job.dir).as_posix()
                rendered: Any = _load_text(name, job.files.get(name))
            else:
                name = f"{rel} {flag}"
                diffs.append(Difference(rel, f"{flag} <not rendered>", str(path), theirs[flag]))
                rendered = _load(path) if path.is_file() else ABSENT
            configs_seen.add(name)
            stock_cfg = Path(theirs[flag])
            if not stock_cfg.is_file():
                diffs.append(Difference(name, "<file>", "rendered", f"{theirs[flag]} (missing upstream)"))
                continue
            diffs += diff_config(rendered, _load(stock_cfg), name)
            compared += 1
    for stage, stock_rel in stock.items():
        if stock_rel is not None and " " not in stage and stage not in {s for _, s in _stages(job.files)}:
            diffs.append(Difference(f"<{stage} script>", "<file>", ABSENT, stock_rel))
    for rel in job.files:
        if rel.endswith((".json", ".yaml", ".yml")) and rel not in configs_seen and rel != "job.yaml":
            diffs.append(Difference(rel, "<file>", "rendered", "no stock script passes it"))
    return diffs, compared


def _load_text(name: str, text: str | None) -> Any:
    if text is None:
        return ABSENT
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def _stages(files: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(rendered script, stage) of each rendered launch script; an unknown script is its own stage."""
    for rel in sorted(files):
        if rel.endswith(".sh"):
            yield rel, STAGE_OF_SCRIPT.get(rel, rel)


@pytest.mark.parametrize(("model", "task", "backend", "size", "version"), PARAMS)
def test_defaults_match_stock(
    model: str, task: str, backend: str, size: str, version: str, mm_tree: Any, tmp_path: Path
) -> None:
    tree = mm_tree.version_dir(version)
    assert tree is not None, f"no MindSpeed-MM {version} tree under {mm_tree.root}"
    diffs, compared = compare_job(model, task, backend, size, version, tree, tmp_path / "job")
    assert compared > 0
    left = undeclared(diffs, model=model, task=task, size=size, version=version, backend=backend)
    assert not left, (
        f"{model} {task} {backend} {size} @ {version}: {len(left)} undeclared difference(s) from the stock "
        "example (fix the template/registry, or declare it in mm_agent/registry/data/deviations/"
        f"{model}.yaml with its reason and upstream evidence):\n" + "\n".join(f"  {d}" for d in left)
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(ADAPTED), ids="-".join)
def test_adapted_lora_defaults_match_stock(
    case: tuple[str, str, str, str, str], version: str, mm_tree: Any, tmp_path: Path
) -> None:
    """The 14B image-to-video LoRA (adapts=i2v) against the stock 14b/i2v/finetune_lora.sh and its i2v
    configs, with the same declared deviations as every job of the model."""
    model, task, backend, size, adapts = case
    diffs, compared = compare_job(
        model, task, backend, size, version, mm_tree.version_dir(version), tmp_path / "job", adapts
    )
    assert compared > 0
    left = undeclared(diffs, model=model, task=task, size=size, version=version, backend=backend)
    assert not left, f"{case} @ {version}:\n" + "\n".join(f"  {d}" for d in left)


def test_every_declared_deviation_is_used(mm_tree: Any, tmp_path: Path) -> None:
    """A deviation entry of these models that no rendered job needs any more is stale: it would hide a
    future regression on that key. Each entry must excuse at least one difference."""
    models = {case[0] for case in CASES}
    entries = {(m, i): d for m in models for i, d in enumerate(deviations_for(m))}
    used: set[tuple[str, int]] = set()
    for n, (model, task, backend, size, version) in enumerate(CASES):
        if model not in models:
            continue
        diffs, _ = compare_job(
            model, task, backend, size, version, mm_tree.version_dir(version), tmp_path / str(n)
        )
        for diff in diffs:
            for (m, i), entry in entries.items():
                if m == model and entry.applies(
                    model=model,
                    task=task,
                    size=size,
                    version=version,
                    backend=backend,
                    file=diff.file,
                    key=diff.key,
                ):
                    used.add((m, i))
    stale = [
        f"deviations/{m}.yaml entry {i}: {entries[(m, i)].file} {entries[(m, i)].key}"
        for m, i in entries
        if (m, i) not in used
    ]
    assert not stale, "declared deviations no rendered job needs (remove them):\n" + "\n".join(stale)


def test_two_stage_pipeline_rule_names_the_scripts_that_read_it(mm_tree: Any) -> None:
    """validate's fe.train_pipeline rule (video_only / video_and_first_frame) applies to exactly the upstream
    feature-extraction scripts that raise without those keys (get_vace_feature.py, for one, never reads them)."""
    from mm_agent.validate.rules_generative import TWO_STAGE_FE_SCRIPTS

    for version in VERSIONS:
        tree = mm_tree.version_dir(version)
        scripts = sorted((tree / "mindspeed_mm/tools/feature_extraction").glob("get_*_feature.py"))
        assert scripts, f"no feature-extraction scripts in MindSpeed-MM {version}"
        reading = {
            p.stem
            for p in scripts
            if all(
                f'"{key}" key not found' in p.read_text(encoding="utf-8")
                for key in ("video_only", "video_and_first_frame")
            )
        }
        named = {m for m in TWO_STAGE_FE_SCRIPTS if not m.startswith("runtime.")}
        assert reading == named, (
            f"MindSpeed-MM {version}: scripts needing the two-stage pipeline {sorted(reading)}"
        )

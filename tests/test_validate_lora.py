"""LoRA rules (`lora.*`) on a rendered Wan2.1 LoRA job: clean as rendered, one rule per broken variant."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_validate_support import assert_one, new_findings, run, sub

from mm_agent.errors import MMAgentError
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.rules_lora import (
    LORA_MODULES_FILE,
    load_lora_modules_file,
    wan_merged_targets,
    wan_modules,
)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    out = tmp_path / "job"
    render_job(
        RenderRequest(
            model="wan2.1", task="lora", size="1.3b", mm_version="26.0.0", out_dir=str(out), confirm=True
        )
    )
    return out


def test_rendered_lora_job_is_clean(job: Path) -> None:
    report = run(job)
    assert [f for f in report.findings if f.severity == "error" or f.rule.startswith("lora.")] == []
    script = (job / "pretrain.sh").read_text(encoding="utf-8")
    assert "--lora-target-modules ffn.2 ffn.0 proj_q proj_k proj_v proj_out" in script
    assert "merge_lora_to_base" in (job / "inference.sh").read_text(encoding="utf-8")


def test_zero_rank(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"--lora-r 16", "--lora-r 0"))
    assert "LoRA rank can not be 0" in assert_one(found, "lora.rank", "error", script, "--lora-r").message


def test_alpha_missing(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^ *--lora-alpha 16 \\\n", ""))
    assert_one(found, "lora.alpha_missing", "warning", script, "--lora-alpha")


def test_unknown_target(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"proj_v proj_out", "proj_v to_out"))
    f = assert_one(found, "lora.target_unknown", "error", script, "--lora-target-modules")
    assert "to_out" in f.message and "proj_out" in f.fix


def test_comma_separated_targets_are_read_like_mindspeed_mm(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(
        job, lambda: sub(script, r"ffn\.2 ffn\.0 proj_q proj_k proj_v proj_out", "ffn.2,ffn.0,proj_q")
    )
    assert found == []


def test_target_the_merge_drops(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"proj_v proj_out", "proj_v proj_out k_img"))
    assert_one(found, "lora.target_not_merged", "warning", script, "--lora-target-modules")


def test_targets_missing(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^ *--lora-target-modules [^\n]*\n", ""))
    assert_one(found, "lora.targets_missing", "error", script, "--lora-target-modules")


def test_forward_hook_missing_with_full_recompute(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^ *--lora-register-forward-hook [^\n]*\n", ""))
    assert_one(found, "lora.forward_hook", "error", script, "--lora-register-forward-hook")


def test_no_base_checkpoint(job: Path) -> None:
    script = job / "pretrain.sh"

    def drop_load() -> None:
        sub(script, r"^LOAD_PATH=[^\n]*\n", "")
        sub(script, r'^ *--load "\$LOAD_PATH" \\\n', "")

    assert_one(new_findings(job, drop_load), "lora.base_missing", "error", script, "--load")


def test_save_into_the_base(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^SAVE_PATH=[^\n]*$", 'SAVE_PATH="$LOAD_PATH/"'))
    assert_one(found, "lora.save_is_base", "error", script, "SAVE_PATH")


def _resume_flags(script: Path) -> None:
    sub(
        script,
        r'^ *--load "\$LOAD_PATH" \\\n',
        '    --load-base-model "$LOAD_PATH" \\\n    --load "$SAVE_PATH" \\\n',
    )


def _saved_adapter(folder: Path) -> None:
    """What a LoRA run leaves in its --save folder: the tracker and the iteration it names."""
    (folder / "iter_0000010" / "mp_rank_00").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("10\n", encoding="utf-8")


def test_resume_from_the_save_folder_with_a_separate_base(job: Path) -> None:
    """--load-base-model names the base; --load may then resume the adapter from the save folder once it holds
    a checkpoint."""
    script = job / "pretrain.sh"
    _saved_adapter(job / "checkpoints")
    found = new_findings(job, lambda: _resume_flags(script))
    assert [f.rule for f in found if f.rule.startswith("lora.")] == []
    found = new_findings(
        job, lambda: sub(script, r'^ *--load-base-model "\$LOAD_PATH"', '    --load-base-model "$SAVE_PATH"')
    )
    assert_one(found, "lora.save_is_base", "error", script, "SAVE_PATH")


def test_first_run_with_load_base_model_starts_from_random(job: Path) -> None:
    """MindSpeed-MM reads --load-base-model only when --load held a checkpoint (lora_patch.py
    `_load_base_checkpoint_wrapper`: `state_dict is not None`); on a first run the save folder is empty, Megatron's
    `_load_base_checkpoint` returns nothing ('will not load any checkpoints and will start from random') and the
    base is never merged: the adapter trains on a random model."""
    script = job / "pretrain.sh"
    found = [f for f in new_findings(job, lambda: _resume_flags(script)) if f.rule != "path.missing"]
    finding = assert_one(found, "lora.first_run_random", "error", script, "--load")
    assert "random" in finding.message and '--load "$LOAD_PATH"' in finding.fix


def test_optimizer_state_switches(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^ *--no-load-optim \\\n", ""))
    assert_one(found, "lora.save_load_switches", "warning", script, "--no-load-optim")


def test_full_finetune_has_no_lora_findings(tmp_path: Path) -> None:
    out = tmp_path / "t2v"
    render_job(
        RenderRequest(
            model="wan2.1", task="t2v", size="1.3b", mm_version="26.0.0", out_dir=str(out), confirm=True
        )
    )
    assert [f.rule for f in run(out).findings if f.rule.startswith("lora.")] == []


UPSTREAM = os.environ.get("MM_UPSTREAM")


@pytest.mark.skipif(not UPSTREAM, reason="MM_UPSTREAM (MindSpeed-MM source trees) not set")
@pytest.mark.parametrize("version", ["v26.0.0", "v26.1.0"])
def test_wan_module_names_match_upstream(version: str) -> None:
    """Each module name the rules accept is assigned in MindSpeed-MM's Wan DiT sources, and the merge list is
    WanConverter's own `lora_target_modules`."""
    tree = Path(str(UPSTREAM)) / "MindSpeed-MM" / version
    models = tree / "mindspeed_mm/models"
    source = "\n".join(
        (models / rel).read_text(encoding="utf-8")
        for rel in (
            "predictor/dits/wan_dit.py",
            "common/attention.py",
            "common/embeddings/text_embeddings.py",
        )
    )
    for path in (*wan_modules().modules, *wan_modules().hook_names):
        named = [part for part in path.split(".") if not part.isdigit()]
        for name in named:
            assert re.search(rf"self\.{name} = ", source), f"{name} ({path}) is not a module in {version}"
    converter = (tree / "checkpoint/sora_model/wan_converter.py").read_text(encoding="utf-8")
    listed = re.search(r"lora_target_modules = \[([^\]]*)\]", converter)
    assert listed is not None
    assert sorted(re.findall(r'"([^"]+)"', listed.group(1))) == sorted(wan_merged_targets())


def test_lora_modules_file_is_checked(tmp_path: Path) -> None:
    broken = tmp_path / "lora_modules.yaml"
    broken.write_text(
        LORA_MODULES_FILE.read_text(encoding="utf-8").replace("    modules:", "    module_list:")
    )
    with pytest.raises(MMAgentError) as err:
        load_lora_modules_file(broken)
    assert err.value.file and err.value.file.endswith("lora_modules.yaml") and "module" in str(err.value)

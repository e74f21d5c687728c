"""Job directories as users have them (issue 25): a job copied off the cluster keeps its cross-file checks.

The hole: scripts that run from the job directory (no `cd`) while `MM_ROOT` names a checkout that is not on
this machine had every relative path resolved against that `MM_ROOT`, so the config a launch passes, its
`--load` directory and the paths inside its configs were "not in the checkout here; not checked": TP/CP vs
attention heads, LoRA targets vs the model, the checkpoint's rank layout and the dataset's record keys were all
lost without an error. Now a relative path resolves where the named file exists: the directory the launch runs
in when the script says so (a `cd` into a directory that is here), else the job directory, the script's
directory, then `MM_ROOT`; an info finding says which was used, and only a file that exists nowhere keeps a
warning naming it, the directories tried and the fix.

Every job here is a real `render_job` output (Wan2.1 T2V, Wan2.1 LoRA, Qwen2.5-VL 3B, a two-node pdsh job),
copied to a new place the way a user keeps it: the launch scripts in `scripts/`, run from the job directory
(`bash scripts/pretrain.sh`, as `mm-agent launch` and `launch_all.sh` do), every path relative to the job
directory, `MM_ROOT` at /cluster/path/MindSpeed-MM, which does not exist here. Each test breaks one cross-file
invariant and requires the rule that guards it to fire.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import Finding, ValidateRequest, ValidationReport, validate_configs

CLUSTER = "/cluster/path/MindSpeed-MM"
JOBS = {
    "wan21_t2v": {"model": "wan2.1", "task": "t2v"},
    "wan21_lora": {"model": "wan2.1", "task": "lora"},
    "qwen25vl_3b": {"model": "qwen2.5vl", "task": "sft", "size": "3b"},
    "wan21_pdsh": {
        "model": "wan2.1",
        "task": "t2v",
        "nnodes": 2,
        "master_addr": "10.0.0.1",
        "launcher": "pdsh",
    },
}
TRAINING = {
    "wan21_t2v": "pretrain.sh",
    "wan21_lora": "pretrain.sh",
    "qwen25vl_3b": "finetune.sh",
    "wan21_pdsh": "pretrain.sh",
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("rendered")
    out = {}
    for name, fields in JOBS.items():
        result = render_job(RenderRequest(**fields, out_dir=str(base / name), confirm=True), root=None)  # type: ignore[arg-type]
        assert result.status == "written"
        out[name] = base / name
    assert not Path(CLUSTER).exists(), f"{CLUSTER} must not exist on the test machine"
    return out


def _sub(path: Path, pattern: str, repl: str) -> None:
    text = path.read_text(encoding="utf-8")
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    assert n, f"{pattern!r} not found in {path}"
    path.write_text(new, encoding="utf-8")


def copied(rendered: dict[str, Path], name: str, dest: Path) -> Path:
    """The rendered job as a user has it after copying it off the cluster (see the module docstring)."""
    src = rendered[name]
    job = dest / name
    shutil.copytree(src, job)
    (job / "scripts").mkdir()
    for script in job.glob("*.sh"):
        if script.name != "launch_all.sh":
            script.rename(job / "scripts" / script.name)
    for path in [*job.rglob("*.sh"), *job.rglob("*.json"), *job.rglob("*.txt"), *job.rglob("*.yaml")]:
        text = path.read_text(encoding="utf-8")
        text = text.replace(f"{src}/", "").replace(str(src), ".")  # relative to the job directory
        if path.suffix == ".sh":
            text = re.sub(r"^MM_ROOT_DEFAULT=.*$", f"MM_ROOT_DEFAULT={CLUSTER}", text, flags=re.M)
            text = re.sub(r'^cd "\$MM_ROOT"\n', "", text, flags=re.M)  # runs from the job directory
            text = text.replace('"$JOB_DIR/', '"')
            text = re.sub(r"^SCRIPT=(\S+)$", r"SCRIPT=scripts/\1", text, flags=re.M)
            text = re.sub(r"^JOB_DIR=\.$", f"JOB_DIR={job}", text, flags=re.M)  # launch_all.sh's
        elif path.name == "job.yaml":
            text = re.sub(r"^mm_root: .*$", f"mm_root: {CLUSTER}", text, flags=re.M)
        path.write_text(text, encoding="utf-8")
    for script in job.rglob("*.sh"):
        assert "$JOB_DIR/" not in script.read_text() and 'cd "$MM_ROOT"' not in script.read_text(), script
    return job


def validate(*paths: Path, mm_root: Path | None = None) -> ValidationReport:
    req = ValidateRequest(paths=[str(p) for p in paths], mm_root=str(mm_root) if mm_root else None)
    return validate_configs(req)


def hits(report: ValidationReport, rule: str, file: Path | None = None) -> list[Finding]:
    return [f for f in report.findings if f.rule == rule and (file is None or f.file == str(file.resolve()))]


def lost(report: ValidationReport) -> list[Finding]:
    """Findings that say a check was not done: skipped, or a path that is "not checked". inference.sh and
    evaluate.sh load the training's output (`checkpoints`), which exists nowhere before the training ran: that
    one is right."""
    return [
        f
        for f in report.findings
        if (f.rule == "crossfile.skipped" or (f.rule == "path.unresolved" and "not checked" in f.message))
        and not (f.file.endswith(("inference.sh", "evaluate.sh")) and "'checkpoints'" in f.message)
    ]


def test_the_copied_jobs_keep_every_cross_file_check(rendered: dict[str, Path], tmp_path: Path) -> None:
    """Untouched, no copied job loses a check, and each says where a launch's relative config was found."""
    for name in JOBS:
        job = copied(rendered, name, tmp_path)
        report = validate(job)
        assert not lost(report), (name, [(f.file, f.message) for f in lost(report)])
        script = job / "scripts" / TRAINING[name]
        (note,) = [f for f in hits(report, "path.resolved", script) if f.field == "MM_MODEL"]
        assert (
            note.severity == "info" and str(job.resolve()) in note.message and "job directory" in note.message
        )


def test_wan21_t2v_cp_that_does_not_divide_the_heads(rendered: dict[str, Path], tmp_path: Path) -> None:
    job = copied(rendered, "wan21_t2v", tmp_path)
    _sub(job / "scripts" / "pretrain.sh", r"^CP=1$", "CP=8")  # Wan2.1 1.3B has 12 heads
    report = validate(job)
    (found,) = hits(report, "parallel.heads_divisible", job / "pretrain_model.json")
    assert found.severity == "error" and "CP=8" in found.message
    assert not lost(report), lost(report)


def _dataset(root: Path, records: list[dict[str, object]]) -> None:
    root.mkdir()
    (root / "data.json").write_text(json.dumps(records, indent=1), encoding="utf-8")


def test_wan21_t2v_dataset_records_without_cap(rendered: dict[str, Path], tmp_path: Path) -> None:
    """The raw dataset sits beside the job (`../dataset`), named relative to the job directory in data.txt, which
    the feature extraction config names relative to the job directory too."""
    job = copied(rendered, "wan21_t2v", tmp_path)
    clip = {"num_frames": 81, "fps": 16, "resolution": {"height": 480, "width": 832}}
    records = [
        {"path": f"v{i}.mp4", **({"cap": f"clip {i}"} if i % 2 else {"text": f"clip {i}"}), **clip}
        for i in range(8)
    ]
    _dataset(tmp_path / "dataset", records)
    (job / "feature_extract" / "data.txt").write_text("../dataset,../dataset/data.json\n", encoding="utf-8")
    report = validate(job)
    (found,) = hits(report, "dataset.keys", tmp_path / "dataset" / "data.json")
    # MindSpeed-MM drops a record without `cap` (OpensoraplanVideoProcessor.select_valid_data), it does not stop
    assert found.severity == "warning", found
    assert "4 of the first 8" in found.message and "KeyError: 'cap'" not in found.message
    assert "select_valid_data" in found.message and "drop" in found.message
    assert "text → cap" in found.fix
    assert not lost(report), lost(report)


def test_records_without_path_still_stop_the_run(rendered: dict[str, Path], tmp_path: Path) -> None:
    """A record without `path` is a KeyError while the dataset loads (DataFileReader._change_path): an error."""
    job = copied(rendered, "wan21_t2v", tmp_path)
    _dataset(tmp_path / "dataset", [{"video": "v0.mp4", "cap": "a clip"}, {"path": "v1.mp4", "cap": "b"}])
    (job / "feature_extract" / "data.txt").write_text("../dataset,../dataset/data.json\n", encoding="utf-8")
    (found,) = hits(validate(job), "dataset.keys", tmp_path / "dataset" / "data.json")
    assert found.severity == "error" and "KeyError: 'path'" in found.message and "video → path" in found.fix


def test_wan21_lora_target_that_does_not_exist(rendered: dict[str, Path], tmp_path: Path) -> None:
    job = copied(rendered, "wan21_lora", tmp_path)
    _sub(job / "scripts" / "pretrain.sh", r"--lora-target-modules ffn\.2 ", "--lora-target-modules ffn.9 ")
    report = validate(job)
    (found,) = hits(report, "lora.target_unknown", job / "scripts" / "pretrain.sh")
    assert found.severity == "error" and "ffn.9" in found.message
    assert not lost(report), lost(report)


def test_qwen25vl_tp_that_splits_kv_heads(rendered: dict[str, Path], tmp_path: Path) -> None:
    job = copied(rendered, "qwen25vl_3b", tmp_path)
    _sub(job / "scripts" / "finetune.sh", r"^TP=1$", "TP=4")  # Qwen2.5-VL 3B: 2 KV heads
    report = validate(job)
    (found,) = hits(report, "parallel.query_groups", job / "model.json")
    assert found.severity == "error" and "TP=4" in found.message
    assert not lost(report), lost(report)


def _checkpoint(job: Path, ranks: list[str]) -> None:
    release = job / "ckpt" / "release"
    for rank in ranks:
        (release / rank).mkdir(parents=True)
        (release / rank / "model_optim_rng.pt").write_bytes(b"")
    (job / "ckpt" / "latest_checkpointed_iteration.txt").write_text("release\n", encoding="utf-8")


def test_multinode_checkpoint_layout_that_does_not_match_tp(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    """The two-node pdsh job: launch_all.sh runs `cd $JOB_DIR && bash scripts/pretrain.sh` on every node; the
    converted checkpoint in the job directory has one TP rank, the script asks for two."""
    job = copied(rendered, "wan21_pdsh", tmp_path)
    script = job / "scripts" / "pretrain.sh"
    _checkpoint(job, ["mp_rank_00"])
    _sub(script, r"^LOAD_PATH=.*$", "LOAD_PATH=ckpt")
    _sub(script, r"^TP=1$", "TP=2")
    report = validate(job)
    (found,) = hits(report, "ckpt.rank_dirs", script)
    assert found.severity == "error" and "missing mp_rank_01" in found.message
    assert not lost(report), lost(report)


def test_a_script_that_cds_into_an_existing_checkout_resolves_there(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    """`cd "$MM_ROOT"` with the checkout here: the run reads the checkout's file, so that is the one judged, even
    with a file of the same name in the job directory."""
    job = copied(rendered, "wan21_t2v", tmp_path)
    mm = tmp_path / "MindSpeed-MM"
    (mm / "examples" / "wan2.1").mkdir(parents=True)
    shutil.copy(job / "pretrain_model.json", mm / "examples" / "wan2.1" / "pretrain_model.json")
    (job / "examples" / "wan2.1").mkdir(parents=True)  # a decoy of the same name, which the run never reads
    shutil.copy(job / "pretrain_model.json", job / "examples" / "wan2.1" / "pretrain_model.json")
    script = job / "scripts" / "pretrain.sh"
    _sub(script, r"^MM_ROOT_DEFAULT=.*$", f"MM_ROOT_DEFAULT={mm}")
    _sub(script, r"^(MM_ROOT=.*)$", '\\1\ncd "$MM_ROOT"')
    _sub(script, r"^MM_MODEL=.*$", 'MM_MODEL="examples/wan2.1/pretrain_model.json"')
    _sub(script, r"^CP=1$", "CP=8")
    report = validate(job)
    (found,) = hits(report, "parallel.heads_divisible")
    assert found.file == str(mm / "examples" / "wan2.1" / "pretrain_model.json")
    assert not [f for f in hits(report, "path.resolved", script) if f.field == "MM_MODEL"]
    # the same through --mm-root, with the script's MM_ROOT still naming the cluster's checkout
    _sub(script, r"^MM_ROOT_DEFAULT=.*$", f"MM_ROOT_DEFAULT={CLUSTER}")
    (found,) = hits(validate(job, mm_root=mm), "parallel.heads_divisible")
    assert found.file == str(mm / "examples" / "wan2.1" / "pretrain_model.json")
    # and with MM_ROOT from the user's environment (`pushd "$MM_ROOT"`): --mm-root names it; without it, the
    # job's own root (job.yaml: the cluster's) is not here, so the job's copy is judged and the info says so
    _sub(script, r"^MM_ROOT_DEFAULT=.*\nMM_ROOT=.*\ncd .*$", 'pushd "$MM_ROOT"')
    (found,) = hits(validate(job, mm_root=mm), "parallel.heads_divisible")
    assert found.file == str(mm / "examples" / "wan2.1" / "pretrain_model.json")
    report = validate(job)
    assert hits(report, "parallel.heads_divisible", job / "examples" / "wan2.1" / "pretrain_model.json")
    (note,) = [f for f in hits(report, "path.resolved", script) if f.field == "MM_MODEL"]
    assert CLUSTER in note.message and "not on this machine" in note.message


def test_a_cd_into_a_checkout_not_here_falls_back_to_the_job_copy(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    """`cd "$MM_ROOT"` into the cluster's checkout: the run-time directory is known but not on this machine, so
    the job directory's copy is judged, and the info says the run reads it from the checkout."""
    job = copied(rendered, "wan21_t2v", tmp_path)
    script = job / "scripts" / "pretrain.sh"
    _sub(script, r"^(MM_ROOT=.*)$", '\\1\ncd "$MM_ROOT"')
    _sub(script, r"^CP=1$", "CP=8")
    report = validate(job)
    assert hits(report, "parallel.heads_divisible", job / "pretrain_model.json")
    (note,) = [f for f in hits(report, "path.resolved", script) if f.field == "MM_MODEL"]
    assert CLUSTER in note.message and str(job.resolve()) in note.message


def test_a_config_that_exists_nowhere_is_a_warning_naming_what_was_tried(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    job = copied(rendered, "wan21_t2v", tmp_path)
    script = job / "scripts" / "pretrain.sh"
    _sub(script, r"^MM_MODEL=.*$", 'MM_MODEL="examples/wan2.1/model.json"')
    report = validate(job)
    (skipped,) = [f for f in hits(report, "crossfile.skipped", script) if f.field == "MM_MODEL"]
    assert skipped.severity == "warning"
    assert "'examples/wan2.1/model.json'" in skipped.message and "CP/TP vs attention heads" in skipped.message
    for tried in (str(job.resolve()), str(script.parent.resolve()), CLUSTER):
        assert tried in skipped.message, (tried, skipped.message)
    assert "--mm-root" in skipped.fix and "job directory" in skipped.fix

"""train_iters / lr / num_workers / save_interval: a request that leaves them unset gets the stock example's
values (registry `tasks[].train_defaults`, a size's `arch.task_defaults`), not one value for every model; a
value the request gives always wins; the bundled runtime keeps its own generic defaults."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mm_agent.errors import MMAgentError
from mm_agent.jobfile import load_job_spec
from mm_agent.jobspec import GENERIC_TRAIN_DEFAULTS, TRAIN_FIELDS, JobSpec, resolve_job
from mm_agent.registry import DATA_DIR, get_registry, load_models
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script


def _values(tmp_path: Path, **spec: object) -> dict[str, object]:
    job = resolve_job(JobSpec.model_validate(spec), tmp_path / "job", base=tmp_path)
    return {name: getattr(job, name) for name in TRAIN_FIELDS}


def test_unset_fields_are_none_and_left_out_of_job_yaml(tmp_path: Path) -> None:
    spec = JobSpec(model="internvl3", task="sft")
    assert all(getattr(spec, name) is None for name in TRAIN_FIELDS)
    out = render_job(RenderRequest(model="internvl3", task="sft", out_dir=str(tmp_path / "a"), confirm=True))
    saved = yaml.safe_load((Path(out.job_dir) / "job.yaml").read_text(encoding="utf-8"))
    assert not set(TRAIN_FIELDS) & set(saved)  # re-rendering takes the stock values again


def test_stock_values_per_model(tmp_path: Path) -> None:
    """Each registry value reaches the resolved job; models without one get the generic values."""
    generic = GENERIC_TRAIN_DEFAULTS.model_dump()
    assert _values(tmp_path, model="internvl3", task="sft") == {
        **generic,
        "lr": 2e-5,
        "num_workers": 4,
        "save_interval": 5000,
    }
    assert _values(tmp_path, model="qwen2.5vl", task="sft") == {**generic, "train_iters": 10000}
    assert _values(tmp_path, model="qwen2.5omni", task="sft") == {
        **generic,
        "train_iters": 10000,
        "num_workers": 2,
    }
    assert _values(tmp_path, model="wan2.1", task="t2v") == generic
    # a size's arch.task_defaults (Wan2.2 A14B LoRA: lr 1e-4) applies to the fields the request left unset
    assert _values(tmp_path, model="wan2.2", task="lora", size="a14b")["lr"] == 1e-4


def test_registry_train_defaults_differ_from_the_generic_values() -> None:
    reg = get_registry()
    checked = 0
    for entry in reg.models.values():
        for task in entry.tasks:
            stock = task.train_defaults
            for name in TRAIN_FIELDS:
                value = getattr(stock, name)
                assert value is None or value != getattr(GENERIC_TRAIN_DEFAULTS, name), (
                    f"models/{entry.id}.yaml tasks[{task.id}].train_defaults.{name} equals the generic "
                    "value: drop it"
                )
                checked += value is not None
    assert checked >= 20


def test_stock_values_follow_the_version(tmp_path: Path) -> None:
    """A value the stock example changed between versions (train_defaults_changes): each version's own, and
    the request's over both."""
    at = {v: _values(tmp_path, model="qwen3tts", task="tts", mm_version=v) for v in ("26.0.0", "26.1.0")}
    assert (at["26.0.0"]["lr"], at["26.1.0"]["lr"]) == (2e-5, 1e-6)
    assert at["26.0.0"]["train_iters"] == at["26.1.0"]["train_iters"] == 200  # unchanged fields carry over
    assert _values(tmp_path, model="qwen3tts", task="tts", mm_version="26.1.0", lr=3e-5)["lr"] == 3e-5


def test_a_change_needs_a_version_and_valid_values(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "models" / "qwen3tts.yaml"
    text = path.read_text(encoding="utf-8")
    old = 'train_defaults_changes: [{since: "26.1.0", lr: 1.0e-6}]'
    assert old in text
    for bad, field in (
        ("train_defaults_changes: [{lr: 1.0e-6}]", "tasks.0.train_defaults_changes.0.since"),
        ('train_defaults_changes: [{since: "26.1.0", lr: -1}]', "tasks.0.train_defaults_changes.0.lr"),
    ):
        path.write_text(text.replace(old, bad), encoding="utf-8")
        with pytest.raises(MMAgentError) as err:
            load_models(data)
        assert err.value.file == str(path) and err.value.field == field


def test_request_wins_over_stock_and_task_defaults(tmp_path: Path) -> None:
    given = {"train_iters": 7, "lr": 3e-4, "num_workers": 1, "save_interval": 3}
    assert _values(tmp_path, model="internvl3", task="sft", **given) == given
    assert _values(tmp_path, model="wan2.2", task="lora", size="a14b", lr=2e-6)["lr"] == 2e-6
    out = render_job(
        RenderRequest(model="internvl3", task="sft", out_dir=str(tmp_path / "b"), confirm=True, **given)
    )
    job_dir = Path(out.job_dir)
    cmd = parse_script(str(job_dir / "finetune.sh"), (job_dir / "finetune.sh").read_text()).commands[0]
    assert [cmd.value(f) for f in ("--train-iters", "--lr", "--num-workers", "--save-interval")] == [
        "7",
        "0.0003",
        "1",
        "3",
    ]
    spec = load_job_spec(job_dir / "job.yaml")
    assert {name: getattr(spec, name) for name in TRAIN_FIELDS} == given


def test_rendered_defaults_print_the_stock_values(tmp_path: Path) -> None:
    out = render_job(RenderRequest(model="internvl3", task="sft", out_dir=str(tmp_path / "c"), confirm=True))
    job_dir = Path(out.job_dir)
    cmd = parse_script(str(job_dir / "finetune.sh"), (job_dir / "finetune.sh").read_text()).commands[0]
    assert [cmd.value(f) for f in ("--lr", "--num-workers", "--save-interval", "--eval-interval")] == [
        "2e-05",
        "4",
        "5000",
        "5000",
    ]
    native = render_job(
        RenderRequest(
            model="step3_vl", task="sft", mm_version="26.1.0", out_dir=str(tmp_path / "d"), confirm=True
        )
    )
    cfg = yaml.safe_load((Path(native.job_dir) / "config.yaml").read_text(encoding="utf-8"))
    assert cfg["training"]["train_iters"] == 10 and cfg["training"]["save_interval"] == 1000
    assert cfg["data"]["dataloader_param"]["num_workers"] == 0


def test_bundled_runtime_keeps_its_generic_defaults(tmp_path: Path) -> None:
    """The bundled runtime is mm-agent's own trainer: the stock MindSpeed-MM values do not apply to it."""
    values = _values(tmp_path, model="wan2.1", task="t2v", runtime="bundled")
    assert values == GENERIC_TRAIN_DEFAULTS.model_dump()


def test_bad_train_defaults_name_file_and_field(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "models" / "internvl3.yaml"
    text = path.read_text(encoding="utf-8")
    assert "train_defaults: {lr: 2.0e-5" in text
    path.write_text(text.replace("train_defaults: {lr: 2.0e-5", "train_defaults: {lr: 0"), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(data)
    assert err.value.file == str(path) and err.value.field == "tasks.0.train_defaults.lr"
    path.write_text(text.replace("train_defaults: {lr:", "train_defaults: {learning_rate:"), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_models(data)
    assert err.value.field == "tasks.0.train_defaults.learning_rate"

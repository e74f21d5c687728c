"""The CLI face, run through its real entry point: the same models as the MCP tools, clean errors, exit "
"codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mm_agent.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_models_json_lists_every_registry_model(capsys: pytest.CaptureFixture[str]) -> None:
    from mm_agent.registry import get_registry

    code, data = run_json(capsys, "models")
    assert code == 0
    assert data["count"] == len(get_registry().models) == len(data["models"])
    code, vlm = run_json(capsys, "models", "--family", "vlm")
    assert {m["family"] for m in vlm["models"]} == {"vlm"}


def test_route_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "route", "fine-tune Wan2.1 text-to-video on 8 NPUs")
    assert code == 0
    assert set(data) >= {"candidates", "question"}
    top = data["candidates"][0]
    assert {"model_id", "task", "backend", "entry_script"} <= set(top)
    assert (top["model_id"], top["task"], top["entry_script"]) == ("wan2.1", "t2v", "pretrain_sora.py")


def test_render_then_validate_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job"
    code, rendered = run_json(
        capsys, "render", "wan2.1", "--task", "t2v", "--out", str(out), "--npus-per-node", "8"
    )
    assert code == 0 and rendered["status"] == "written"
    code, report = run_json(capsys, "validate", str(out))
    assert code == 0, report
    assert set(report) >= {"ok", "findings"} and report["ok"] is True
    for finding in report["findings"]:
        assert {"severity", "rule", "file", "field", "message", "fix"} <= set(finding)


def test_validate_exit_code_1_on_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job"
    assert main(["render", "wan2.1", "--task", "t2v", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    model = out / "pretrain_model.json"
    cfg = json.loads(model.read_text())
    cfg["predictor"]["num_layers"] = 31  # pipeline_num_layers no longer sums to num_layers
    model.write_text(json.dumps(cfg, indent=2))
    code, report = run_json(capsys, "validate", str(out))
    assert code == 1 and report["ok"] is False
    assert any(f["severity"] == "error" and "pretrain_model.json" in f["file"] for f in report["findings"])


def test_validate_text_shows_bracketed_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A field such as `[server_count]` is text, not a rich style tag: the plain output keeps it."""
    out = tmp_path / "job"
    assert main(["render", "wan2.1", "--task", "t2v", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    (out / "hccl.json").write_text(
        '{"version": "1.0", "server_count": "2", "server_list": [], "status": "completed"}'
    )
    assert main(["validate", str(out)]) == 1
    assert "[server_count]" in capsys.readouterr().out


def test_rerender_from_job_yaml_is_noop_and_force_keeps_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job"
    assert main(["render", "qwen2.5vl", "--task", "sft", "--size", "7b", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    code, again = run_json(capsys, "render", "--from", str(out / "job.yaml"), "--out", str(out))
    assert code == 0 and again["status"] == "unchanged"

    # a different job into the same directory is refused, and nothing is lost
    before = (out / "job.yaml").read_text()
    code = main(["render", "--from", str(out / "job.yaml"), "--out", str(out), "--train-iters", "10"])
    assert code == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "job.yaml").read_text() == before

    code, replaced = run_json(
        capsys, "render", "--from", str(out / "job.yaml"), "--out", str(out), "--train-iters", "10", "--force"
    )
    assert code == 0 and replaced["status"] == "replaced"
    assert Path(replaced["backup_dir"], "job.yaml").read_text() == before
    assert "train_iters: 10" in (out / "job.yaml").read_text()


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(
        capsys, "render", "wan2.1", "--task", "i2v", "--out", str(tmp_path / "j"), "--dry-run"
    )
    assert code == 0 and data["status"] == "dry_run"
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["render", "wan9", "--task", "t2v", "--out", "x"], "unknown model 'wan9'"),
        (["render", "wan2.1", "--task", "sft", "--out", "x"], "has no task 'sft'"),
        (["render", "wan2.1", "--task", "t2v", "--out", "x", "--tp", "3"], "not divisible"),
        (
            ["render", "wan2.1", "--task", "t2v", "--out", "x", "--mm-version", "9.9"],
            "unknown MindSpeed-MM version",
        ),
    ],
)
def test_bad_input_exits_2_with_fix_and_no_traceback(
    argv: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_console_script_entry_point(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("mm-agent")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mm_agent"]
    out = subprocess.run(
        [*cmd, "route", "wan 2.1 图生视频", "--json"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["candidates"][0]["task"] == "i2v"


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`mm-agent models --json | head -1`: the reader leaves early; no traceback, SIGPIPE's exit status."""
    exe = Path(sys.executable).with_name("mm-agent")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mm_agent"]
    proc = subprocess.Popen(
        [*cmd, "models", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has written anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err

"""convert_weights through its faces: the CLI, the MCP server and background runs of the real worker.

A tiny diffusers WanTransformer3DModel (30 layers, hidden 16) is built from a config and saved with
save_pretrained; conversions run in the real worker subprocess. Converters mm-agent does not implement
run MindSpeed-MM's mm-convert, which cannot exist here: a stand-in script first on PATH records its argv
and writes a minimal layout (or fails, or hangs), so the run machinery around it is real.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mm_agent.cli import main
from mm_agent.cli.convert import parse_layers
from mm_agent.convert import ConvertReport, ConvertRequest, convert_weights, final_report
from mm_agent.convert.layout import TRACKER
from mm_agent.convert.manifest import MANIFEST
from mm_agent.convert.upstream import plan_upstream
from mm_agent.errors import MMAgentError
from mm_agent.jobs import stop_job
from mm_agent.procs import StopRequest, stop_process
from mm_agent.render import RenderRequest, render_job
from mm_agent.runs import RunStatus, RunStatusRequest, list_runs, run_status, wait_run
from mm_agent.server import build_server
from mm_agent.validate import ValidateRequest, validate_configs

LAYERS = 30  # Wan2.1-1.3B's block count, so a rendered wan2.1 job's pipeline_num_layers fits the weights
DEADLINE_S = 120  # guard against a hung wait; never reached when the code works


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def wan_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=LAYERS,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=32,
    )
    out = tmp_path_factory.mktemp("hf") / "Wan2.1-T2V-1.3B-Diffusers" / "transformer"
    model.save_pretrained(out)
    return out


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The workspace (also the cwd) with a private state dir; runs a test left running are stopped."""
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    yield root
    for run in list_runs().runs:
        if run.state == "running":
            stop_process(StopRequest(pid=run.pid, confirm=True, timeout_s=5))


@pytest.fixture
def hf(ws: Path, wan_hf: Path) -> Path:
    """The tiny Wan model copied to `<ws>/hf`."""
    (ws / "hf").mkdir()
    for f in wan_hf.iterdir():
        (ws / "hf" / f.name).write_bytes(f.read_bytes())
    return ws / "hf"


def _wait(run_id: str, until: str) -> RunStatus:
    """Poll a run until `until` (a predicate name) holds; fails instead of hanging."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        status = run_status(RunStatusRequest(run_id=run_id))
        if until == "first_file" and status.progress.done >= 1:
            return status
        if status.state != "running":
            return status
        time.sleep(0.1)
    pytest.fail(f"run {run_id} did not reach {until}")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ---------------------------------------------------------------------------------------------------------
# dry runs


def test_cli_dry_run_prints_plan_and_writes_nothing(
    ws: Path, hf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["convert", "WanConverter", "hf_to_mm", "--source", "hf", "--target", "mm", "--pp-layers", "15,15"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "release/mp_rank_00_000/model_optim_rng.pt" in out and "release/mp_rank_00_001" in out
    assert "mm-convert WanConverter hf_to_mm --cfg.source_path" in out and "'[15,15]'" in out
    assert "estimate:" in out and "dry run: nothing was written" in out
    assert not (ws / "mm").exists() and not (ws.parent / "state" / "runs").exists()


def test_cli_json_dry_run_is_the_report_model(ws: Path, hf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", "WanConverter", "hf_to_mm", "--source", "hf", "--target", "mm", "--json"])
    report = ConvertReport.model_validate_json(capsys.readouterr().out)
    assert code == 0 and report.status == "dry_run" and report.plan.native
    assert [f.path for f in report.plan.layout] == ["release/mp_rank_00/model_optim_rng.pt"]
    assert report.plan.estimate is not None and report.plan.estimate.fits


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7,8,8,7", [7, 8, 8, 7]),
        ("[7,8,8,7]", [7, 8, 8, 7]),
        ("[[3,4,4,4],[3,4,4,4]]", [[3, 4, 4, 4], [3, 4, 4, 4]]),
    ],
)
def test_pp_layers_forms(text: str, value: list[int] | list[list[int]]) -> None:
    assert parse_layers(text, "--pp-layers") == value


@pytest.mark.parametrize("text", ["7,x", "[7,[8]]", "{}", "[1.5]"])
def test_bad_pp_layers_is_a_usage_error(text: str, ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["convert", "WanConverter", "hf_to_mm", "--source", "hf", "--target", "mm", "--pp-layers", text]
    )
    assert code == 2 and "--pp-layers" in capsys.readouterr().err


def test_cli_bad_tp_is_a_usage_error(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", "WanConverter", "hf_to_mm", "--source", "hf", "--target", "mm", "--tp", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--tp" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------------------
# native runs through the worker


def test_native_run_succeeds_with_manifest(ws: Path, hf: Path) -> None:
    started = convert_weights(
        ConvertRequest(
            converter="WanConverter",
            method="hf_to_mm",
            source="hf",
            target="mm",
            pp_layers=[15, 15],
            confirm=True,
        )
    )
    assert started.status == "started" and started.run_id
    assert "mm-agent stop" in started.message
    final = wait_run(started.run_id)
    assert final.state == "succeeded", final.log_tail
    report = final_report(final, started.plan)
    assert report.status == "converted" and report.run_id == started.run_id
    assert [f.path for f in report.files] == [f.path for f in started.plan.layout]
    assert report.keys_converted > 0 and report.bytes_written > 0
    assert (ws / "mm" / TRACKER).read_text() == "release"
    manifest = json.loads((ws / "mm" / MANIFEST).read_text())
    assert manifest["tp"] == 1 and manifest["pp_layers"] == [15, 15]
    assert final.progress.done == final.progress.total > 0 and final.finished is not None
    assert final.stop_hint is None and any("converted" in line for line in final.log_tail)
    assert [r.run_id for r in list_runs().runs] == [started.run_id]


def test_killed_worker_is_reported_killed_and_leaves_no_valid_target(
    ws: Path, hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the engine sleeps after each output file when this is set (atomic.SLOW_ENV): the run is stopped
    # after its first rank file, half-way through, deterministically
    monkeypatch.setenv("MM_AGENT_CONVERT_TEST_DELAY", "600")
    req = ConvertRequest(
        converter="WanConverter",
        method="hf_to_mm",
        source="hf",
        target="mm",
        pp_layers=[15, 15],
        confirm=True,
    )
    started = convert_weights(req)
    assert started.run_id is not None
    running = _wait(started.run_id, "first_file")
    assert running.state == "running" and running.report is None
    assert running.progress.total == 2 and running.progress.updated
    assert running.stop_hint and str(running.pid) in running.stop_hint
    stopped = stop_process(StopRequest(pid=running.pid, confirm=True, timeout_s=5))
    assert stopped.status == "stopped"
    after = run_status(RunStatusRequest(run_id=started.run_id))
    assert after.state == "killed" and after.report is None
    assert not (ws / "mm" / TRACKER).exists() and not (ws / "mm" / MANIFEST).exists()
    report = final_report(after, started.plan)
    assert report.status == "failed" and "without a report" in report.message


def test_cli_yes_converts_and_prints_the_report(
    ws: Path, hf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["convert", "WanConverter", "hf_to_mm", "--source", "hf", "--target", "mm", "--yes", "--json"]
    assert main(argv) == 0
    report = ConvertReport.model_validate_json(capsys.readouterr().out)
    assert report.status == "converted" and report.files[0].path == "release/mp_rank_00/model_optim_rng.pt"
    assert main(argv) == 0  # the same conversion again is a no-op
    assert ConvertReport.model_validate_json(capsys.readouterr().out).status == "unchanged"
    assert main(["runs"]) == 0
    listing = capsys.readouterr().out
    assert listing.count("succeeded") == 2
    run_id = report.run_id
    assert run_id is not None and main(["runs", run_id, "--lines", "5"]) == 0
    assert "succeeded" in capsys.readouterr().out


def test_unknown_or_bad_run_id(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "../../etc"]) == 2
    assert "invalid run id" in capsys.readouterr().err
    assert main(["runs", "convert-19700101-000000-abcdef"]) == 2
    assert "no run" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# MCP


@pytest.mark.anyio
async def test_mcp_dry_run_then_run_then_status(ws: Path, hf: Path) -> None:
    req = {"converter": "WanConverter", "method": "hf_to_mm", "source": "hf", "target": "out/mm"}
    async with Client(build_server(ws), raise_exceptions=True) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        ann = tools["convert_weights"].annotations
        # hints left out take MCP's defaults (read-only false)
        assert ann is not None and (bool(ann.read_only_hint), ann.destructive_hint, ann.idempotent_hint) == (
            False,
            False,
            True,
        )
        dry = await client.call_tool("convert_weights", req)
        assert not dry.is_error and dry.structured_content is not None
        assert dry.structured_content["status"] == "dry_run"
        assert dry.structured_content["plan"]["mm_convert_argv"][:3] == [
            "mm-convert",
            "WanConverter",
            "hf_to_mm",
        ]
        assert not (ws / "out").exists()

        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        started = await client.call_tool(
            "convert_weights", {**req, "confirm": True}, progress_callback=on_progress
        )
        assert started.structured_content is not None
        run_id = started.structured_content["run_id"]
        assert started.structured_content["status"] == "started" and run_id
        assert seen and run_id in (seen[0][2] or "")
        end = time.monotonic() + DEADLINE_S
        while True:
            status = await client.call_tool("job_status", {"run_id": run_id, "detail": True})
            assert not status.is_error and status.structured_content is not None
            if status.structured_content["state"] != "running" or time.monotonic() > end:
                break
            await anyio.sleep(0.2)
        body = status.structured_content
        assert body["state"] == "succeeded", body["log_tail"]
        assert body["report"]["status"] == "converted" and body["report"]["run_id"] == run_id
    assert (ws / "out" / "mm" / MANIFEST).is_file()


@pytest.mark.anyio
async def test_mcp_paths_outside_workspace_refused(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "escape").symlink_to(outside)
    base = {"converter": "WanConverter", "method": "hf_to_mm", "source": "hf", "target": "mm"}
    async with Client(build_server(ws)) as client:
        for change in (
            {"source": "../outside"},
            {"target": "/etc/mm-agent-convert"},
            {"target": "escape/mm", "confirm": True},
            {"method": "mm_to_hf", "source": "hf", "hf_dir": "/etc"},
        ):
            r = await client.call_tool("convert_weights", {**base, **change})
            assert r.is_error, change
            assert "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
        r = await client.call_tool("job_status", {"run_id": "../x"})
        assert r.is_error
        r = await client.call_tool("job_status", {"run_id": "convert-nope"})
        assert r.is_error and "no run" in r.content[0].text  # type: ignore[union-attr]
    assert not any(outside.iterdir())


# ---------------------------------------------------------------------------------------------------------
# converters mm-agent does not implement: mm-convert


@pytest.fixture
def hf_vlm(ws: Path) -> Path:
    """A Qwen2-VL-shaped HF dir: config.json with the layer and KV-head counts, one safetensors file."""
    path = ws / "qwen2vl"
    path.mkdir()
    config = {"num_hidden_layers": 28, "num_key_value_heads": 4, "vision_config": {"depth": 32}}
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


@pytest.fixture
def cog_hf(ws: Path) -> Path:
    path = ws / "cog" / "transformer"
    path.mkdir(parents=True)
    (path / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * 64)
    return path


def test_upstream_dry_run_gives_the_exact_command(ws: Path, cog_hf: Path, hf_vlm: Path) -> None:
    cog = convert_weights(
        ConvertRequest(
            converter="CogVideoConverter",
            method="hf_to_mm",
            source="cog/transformer",
            target="cog-mm",
            pp_layers=[21, 21],
        )
    )
    assert not cog.plan.native and cog.status == "dry_run"
    assert cog.plan.mm_convert_argv == [
        "mm-convert", "CogVideoConverter", "--version", "t2v", "hf_to_mm",
        "--cfg.source_path", str(cog_hf), "--cfg.target_path", str(ws / "cog-mm"),
        "--cfg.target_parallel_config.pp_layers", "[21,21]",
    ]  # fmt: skip
    assert [f.path for f in cog.plan.layout] == [
        "release/mp_rank_00_000/model_optim_rng.pt",
        "release/mp_rank_00_001/model_optim_rng.pt",
    ]
    assert any("not on PATH" in n for n in cog.plan.notes)
    i2v = plan_upstream(
        ConvertRequest(
            converter="CogVideoConverter",
            method="hf_to_mm",
            source=str(cog_hf),
            target=str(ws / "x"),
            converter_version="i2v",
        )
    )
    assert i2v.mm_convert_argv[2:4] == ["--version", "i2v"]

    vlm = convert_weights(
        ConvertRequest(converter="Qwen2VLConverter", method="hf_to_mm", source="qwen2vl", target="q-mm", tp=2)
    )
    assert vlm.plan.mm_convert_argv == [
        "mm-convert", "Qwen2VLConverter", "hf_to_mm",
        "--cfg.mm_dir", str(ws / "q-mm"), "--cfg.hf_config.hf_dir", str(hf_vlm),
        "--cfg.parallel_config.llm_pp_layers", "[[28]]", "--cfg.parallel_config.vit_pp_layers", "[[32]]",
        "--cfg.parallel_config.tp_size", "2",
    ]  # fmt: skip
    assert [f.path for f in vlm.plan.layout] == [
        "release/mp_rank_00/model_optim_rng.pt",
        "release/mp_rank_01/model_optim_rng.pt",
    ]
    assert vlm.plan.estimate is not None and vlm.plan.estimate.peak_memory_bytes == 3 * 64


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        (
            {"pp_layers": [10, 10], "vit_pp_layers": [32, 0]},
            "pp_layers",
            "sums to 20 layers but the model has 28",
        ),
        ({"tp": 3}, "tp", "does not divide num_key_value_heads 4"),
        ({"pp_layers": [[10, 18], [1]], "vit_pp_layers": [[32, 0], [0]]}, "pp_layers", "different lengths"),
        # (a dry run of a missing source plans from the registry: tests/test_convert_predownload.py)
        ({"source": "nowhere", "confirm": True}, "source", "the weights are not downloaded yet"),
        ({"method": "lora_hf_to_mm"}, "method", "has no method"),
        ({"converter": "Qwen2VLConverterX"}, "converter", "did you mean Qwen2VLConverter"),
        ({"verify": True}, "verify", "runs mm-convert"),
    ],
)
def test_upstream_arguments_checked_like_native_ones(
    ws: Path, hf_vlm: Path, change: dict[str, object], field: str, text: str
) -> None:
    base: dict[str, object] = {
        "converter": "Qwen2VLConverter",
        "method": "hf_to_mm",
        "source": "qwen2vl",
        "target": "q",
    }
    with pytest.raises(MMAgentError) as err:
        convert_weights(ConvertRequest.model_validate({**base, **change}))
    assert err.value.field == field and text in err.value.render() and err.value.fix


def test_upstream_refusals(ws: Path, cog_hf: Path) -> None:
    with pytest.raises(MMAgentError, match="not split by TP/PP"):
        plan_upstream(
            ConvertRequest(
                converter="ExpertMergeDcpConverter", method="hf_to_dcp", source=str(cog_hf), target="d", tp=2
            )
        )
    (ws / "full").mkdir()
    (ws / "full" / TRACKER).write_text("release")
    with pytest.raises(MMAgentError, match="not empty") as err:
        convert_weights(
            ConvertRequest(
                converter="CogVideoConverter", method="hf_to_mm", source="cog/transformer", target="full"
            )
        )
    assert "never overwrites" in (err.value.fix or "")
    with pytest.raises(MMAgentError, match="init arguments") as err:
        plan_upstream(
            ConvertRequest(
                converter="OpenSoraPlanConverter", method="hf_to_mm", source=str(cog_hf), target="o"
            )
        )
    assert err.value.field == "converter_version"
    # the in-place form (target = source dir of a sora converter) is allowed
    inplace = convert_weights(
        ConvertRequest(
            converter="CogVideoConverter",
            method="hf_to_mm",
            source="cog/transformer",
            target="cog/transformer",
        )
    )
    assert any("in-place" in n for n in inplace.plan.notes)


def test_upstream_without_mm_convert_is_a_clear_error(
    ws: Path, cog_hf: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(ws / "empty-bin"))
    argv = [
        "convert",
        "CogVideoConverter",
        "hf_to_mm",
        "--source",
        "cog/transformer",
        "--target",
        "c",
        "--yes",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "mm-convert, which is not on PATH" in err and "cd MindSpeed-MM && pip install -e ." in err
    assert not (ws.parent / "state" / "runs").exists()


FAKE_MM_CONVERT = """#!{python}
# stand-in for MindSpeed-MM's mm-convert: records argv, writes a minimal layout, or fails / hangs
import json, os, pathlib, sys, time
args = sys.argv[1:]
pathlib.Path(os.environ["FAKE_MM_CONVERT_ARGV"]).write_text(json.dumps(args))
target = pathlib.Path(args[args.index("--cfg.target_path") + 1])
flag = "--cfg.target_parallel_config.pp_layers"
stages = len(json.loads(args[args.index(flag) + 1])) if flag in args else 1
ranks = [target / "release" / ("mp_rank_00" if stages == 1 else f"mp_rank_00_{{p:03d}}") for p in range(stages)]
mode = os.environ.get("FAKE_MM_CONVERT_MODE", "ok")
if mode == "fail":
    print("Traceback (most recent call last):")
    print(f"FileExistsError: [Errno 17] File exists: '{{ranks[0]}}'", flush=True)
    sys.exit(1)
for rank in ranks:
    rank.mkdir(parents=True)
    (rank / "model_optim_rng.pt").write_bytes(b"x" * 1000)
    print("saving", rank, flush=True)
if mode == "hang":
    time.sleep(600)
(target / "latest_checkpointed_iteration.txt").write_text("release")
"""


@pytest.fixture
def fake_mm_convert(ws: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = ws.parent / "bin"
    bin_dir.mkdir()
    script = bin_dir / "mm-convert"
    script.write_text(FAKE_MM_CONVERT.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = ws.parent / "argv.json"
    monkeypatch.setenv("FAKE_MM_CONVERT_ARGV", str(record))
    return record


def test_upstream_run_executes_mm_convert_with_the_planned_argv(
    ws: Path, cog_hf: Path, fake_mm_convert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["convert", "CogVideoConverter", "hf_to_mm", "--source", "cog/transformer", "--target", "c"]
    assert main([*argv, "--pp-layers", "21,21", "--json"]) == 0
    planned = ConvertReport.model_validate_json(capsys.readouterr().out).plan.mm_convert_argv
    assert not (ws / "c").exists()
    assert main([*argv, "--pp-layers", "21,21", "--yes", "--json"]) == 0
    report = ConvertReport.model_validate_json(capsys.readouterr().out)
    assert json.loads(fake_mm_convert.read_text()) == planned[1:]
    assert report.status == "converted" and report.bytes_written >= 2000
    assert (ws / "c" / TRACKER).is_file()
    # the split is recorded like a native conversion's, so validate_configs can check it
    manifest = json.loads((ws / "c" / MANIFEST).read_text())
    assert (manifest["converter"], manifest["tp"], manifest["pp_layers"]) == (
        "CogVideoConverter",
        1,
        [21, 21],
    )
    assert [f["path"] for f in manifest["files"]] == [f.path for f in report.plan.layout]
    assert list(manifest["source_files"]) == ["diffusion_pytorch_model.safetensors"]
    assert report.run_id is not None
    status = run_status(RunStatusRequest(run_id=report.run_id))
    assert status.state == "succeeded" and any(
        line.startswith("$ mm-convert CogVideoConverter") for line in status.log_tail
    )


def test_upstream_failure_is_diagnosed(
    ws: Path,
    cog_hf: Path,
    fake_mm_convert: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAKE_MM_CONVERT_MODE", "fail")
    argv = [
        "convert",
        "CogVideoConverter",
        "hf_to_mm",
        "--source",
        "cog/transformer",
        "--target",
        "c",
        "--yes",
    ]
    assert main([*argv, "--json"]) == 1
    report = ConvertReport.model_validate_json(capsys.readouterr().out)
    assert report.status == "failed" and "mm-convert exited with 1" in report.message
    assert "diagnosis: mm-convert target already holds a converted checkpoint" in report.message
    assert report.run_id and run_status(RunStatusRequest(run_id=report.run_id)).state == "failed"


def test_upstream_run_stopped_midway_is_killed(
    ws: Path, cog_hf: Path, fake_mm_convert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MM_CONVERT_MODE", "hang")
    started = convert_weights(
        ConvertRequest(
            converter="CogVideoConverter",
            method="hf_to_mm",
            source="cog/transformer",
            target="c",
            confirm=True,
        )
    )
    assert started.run_id is not None
    end = time.monotonic() + DEADLINE_S
    while True:  # until the stand-in has written its first file and the worker reported it running
        status = run_status(RunStatusRequest(run_id=started.run_id))
        partial = (ws / "c" / "release" / "mp_rank_00" / "model_optim_rng.pt").exists()
        if partial and status.progress.message.startswith("mm-convert"):
            break
        assert time.monotonic() < end and status.state == "running", status
        time.sleep(0.1)
    stopped = stop_job(started.run_id, confirm=True, timeout_s=5)  # by run id, as its stop hint says
    assert len(stopped.targets) >= 2  # the worker and mm-convert under it
    after = run_status(RunStatusRequest(run_id=started.run_id))
    assert after.state == stopped.state == "killed" and not (ws / "c" / TRACKER).exists()


# ---------------------------------------------------------------------------------------------------------
# the manifest against a rendered training job


def _render(ws: Path, load_path: Path, pipeline: list[int], pp: int, name: str) -> Path:
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            out_dir=name,
            load_path=str(load_path),
            pp=pp,
            pipeline_num_layers=pipeline,
            npus_per_node=2,
            confirm=True,
        ),
        root=ws,
    )
    return ws / name


def _ckpt_findings(ws: Path, job: Path) -> list[tuple[str, str]]:
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=ws)
    return [(f.severity, f.rule) for f in report.findings if f.rule.startswith("ckpt.")]


def _convert_here(req: ConvertRequest) -> ConvertReport:
    """In this process (no worker): these tests are about the validator."""
    from mm_agent.convert.engine import execute

    return execute(req)


def test_validate_accepts_matching_manifest_and_flags_a_different_split(ws: Path, hf: Path) -> None:
    _convert_here(
        ConvertRequest(
            converter="WanConverter",
            method="hf_to_mm",
            source=str(ws / "hf"),
            target=str(ws / "mm"),
            pp_layers=[15, 15],
            confirm=True,
        )
    )
    job = _render(ws, ws / "mm", [15, 15], pp=2, name="job-ok")
    assert _ckpt_findings(ws, job) == []

    job = _render(ws, ws / "mm", [14, 16], pp=2, name="job-other-split")
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=ws)
    bad = [f for f in report.findings if f.rule == "ckpt.manifest_mismatch"]
    assert len(bad) == 1 and not report.ok
    assert bad[0].severity == "error" and bad[0].field == "LOAD_PATH"
    assert "pp_layers [15, 15]" in bad[0].message and "[14, 16]" in bad[0].message
    assert "mm-agent convert WanConverter resplit" in bad[0].fix and "--pp-layers 14,16" in bad[0].fix


def test_validate_flags_vpp_manifest_against_a_plain_pp_job(ws: Path, hf: Path) -> None:
    _convert_here(
        ConvertRequest(
            converter="WanConverter",
            method="hf_to_mm",
            source=str(ws / "hf"),
            target=str(ws / "vpp"),
            pp_layers=[[8, 7], [7, 8]],
            confirm=True,
        )
    )
    job = _render(ws, ws / "vpp", [15, 15], pp=2, name="job-pp")
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=ws)
    bad = [f for f in report.findings if f.rule == "ckpt.manifest_mismatch"]
    assert len(bad) == 1 and "VPP 2 (job: 1)" in bad[0].message


def test_validate_warns_when_manifest_missing(ws: Path, hf: Path) -> None:
    _convert_here(
        ConvertRequest(
            converter="WanConverter",
            method="hf_to_mm",
            source=str(ws / "hf"),
            target=str(ws / "mm"),
            pp_layers=[15, 15],
            confirm=True,
        )
    )
    (ws / "mm" / MANIFEST).unlink()  # as if mm-convert had written it
    job = _render(ws, ws / "mm", [15, 15], pp=2, name="job")
    assert _ckpt_findings(ws, job) == [("warning", "ckpt.manifest_missing")]

"""MCP resources and prompts through real clients: in-process sessions (both protocol eras), a stdio
subprocess and the MCP Inspector CLI. Confinement of job-file URIs is checked for every traversal form."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS
from test_mcp import _inspector

from mm_agent import resources, uris
from mm_agent.catalog import ListModelsRequest, list_models
from mm_agent.render import RenderRequest, render_job
from mm_agent.route import RouteRequest, route_model
from mm_agent.runs import RunMeta
from mm_agent.server import build_server
from mm_agent.skills.build import skills_dir
from mm_agent.skills.workflows import load_workflows

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = {
    "mm-agent://models/{model_id}",
    "mm-agent://jobs/{+path}",
    "mm-agent://skills/{name}",
    "mm-agent://skills/{name}/references/{file}",
    "skill://{name}/SKILL.md",
    "skill://{name}/references/{file}",
}
PROMPTS = {
    "finetune_generative": "finetune-generative",
    "finetune_vlm": "finetune-vlm",
    "recover_failed_run": "recover-failed-run",
    "new_model": "new-model",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace holding one rendered Wan2.1 t2v job (jobs/wan21), a dataset folder and a log."""
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "train.jsonl").write_text('{"image": "a.jpg"}\n', encoding="utf-8")
    (ws / "logs").mkdir()
    (ws / "logs" / "rank0.log").write_text("iteration 1\n", encoding="utf-8")
    render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/wan21", confirm=True), root=ws)
    return ws


def _job_uris(ws: Path) -> set[str]:
    result = render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/wan21"), root=ws)
    return {f"mm-agent://jobs/jobs/wan21/{f.path}" for f in result.files}


async def _read(client: Client, uri: str) -> str:
    result = await client.read_resource(uri)
    assert len(result.contents) == 1
    return result.contents[0].text  # type: ignore[union-attr]


async def _refused(client: Client, uri: str) -> MCPError:
    with pytest.raises(MCPError) as info:
        await client.read_resource(uri)
    return info.value


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_resources_and_templates_listed(workspace: Path, mode: str) -> None:
    job = workspace / "jobs" / "wan21"
    (job / ".env").write_text("TOKEN=x\n", encoding="utf-8")
    (job / "features").mkdir()
    (job / "features" / "0.pt").write_bytes(b"\x00\x01")
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        listed = {str(r.uri): r for r in (await client.list_resources()).resources}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    assert templates == TEMPLATES
    assert listed["mm-agent://models"].mime_type == "application/json"
    job_uris = {u for u in listed if u.startswith("mm-agent://jobs/")}
    assert job_uris == _job_uris(workspace), "resources/list names exactly the rendered job's files"
    pretrain = listed["mm-agent://jobs/jobs/wan21/pretrain.sh"]
    assert pretrain.size == (job / "pretrain.sh").stat().st_size
    assert all("wan21" not in (r.description or "") for r in listed.values()), "descriptions are static"


@pytest.mark.anyio
async def test_read_catalog_and_one_model(workspace: Path) -> None:
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        catalog = json.loads(await _read(client, "mm-agent://models"))
        wan = json.loads(await _read(client, "mm-agent://models/wan2.1"))
        qwen = json.loads(await _read(client, "mm-agent://models/qwen2.5vl"))
    assert catalog == list_models(ListModelsRequest()).model_dump(mode="json")
    for detail, model_id in ((wan, "wan2.1"), (qwen, "qwen2.5vl")):
        top = route_model(RouteRequest(model=model_id)).candidates[0]
        assert detail["model"]["id"] == model_id
        assert (detail["task"], detail["size"], detail["backend"]) == (top.task, top.size, top.backend)
        assert [s["stage"] for s in detail["pipeline"]] == [s.stage for s in top.pipeline]
    assert wan["model"]["converter"]["class_name"] == "WanConverter"


@pytest.mark.anyio
async def test_unknown_model_is_resource_not_found_with_closest_ids(workspace: Path) -> None:
    async with Client(build_server(workspace)) as client:
        err = await _refused(client, "mm-agent://models/wan2.3")
        slash = await _refused(client, "mm-agent://models/wan2.1%2F..%2F..")
    assert err.code == INVALID_PARAMS
    assert "unknown model 'wan2.3'" in err.message and "wan2.1" in err.message and "wan2.2" in err.message
    assert slash.code == INVALID_PARAMS


@pytest.mark.anyio
async def test_read_job_file_and_job_index(workspace: Path) -> None:
    job = workspace / "jobs" / "wan21"
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        script = await _read(client, "mm-agent://jobs/jobs/wan21/pretrain.sh")
        nested = await _read(client, "mm-agent://jobs/jobs/wan21/feature_extract/feature_extraction.sh")
        index = json.loads(await _read(client, "mm-agent://jobs/jobs/wan21"))
    assert script == (job / "pretrain.sh").read_text(encoding="utf-8")
    assert nested == (job / "feature_extract" / "feature_extraction.sh").read_text(encoding="utf-8")
    assert index["job_dir"] == "jobs/wan21"
    assert {f["uri"] for f in index["files"]} == _job_uris(workspace)


@pytest.mark.anyio
async def test_job_file_uris_are_confined(workspace: Path, tmp_path: Path) -> None:
    job = workspace / "jobs" / "wan21"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"token": "s3cret"}', encoding="utf-8")
    (job / "escape.json").symlink_to(outside / "secret.json")
    (job / "escape_dir").symlink_to(outside)
    (workspace / "notes.txt").write_text("not a job file\n", encoding="utf-8")
    (job / "notes_link.txt").symlink_to(workspace / "notes.txt")
    (job / ".env").write_text("TOKEN=x\n", encoding="utf-8")
    refused = [
        "mm-agent://jobs/../outside/secret.json",
        "mm-agent://jobs/jobs/../../outside/secret.json",
        "mm-agent://jobs/%2e%2e/outside/secret.json",
        "mm-agent://jobs/jobs%2F..%2F..%2F..%2Foutside%2Fsecret.json",
        "mm-agent://jobs/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "mm-agent://jobs//etc/passwd",
        "mm-agent://jobs/%2Fetc%2Fpasswd",
        f"mm-agent://jobs/{outside / 'secret.json'}",
        "mm-agent://jobs/jobs/wan21/pretrain.sh%00.txt",
        "mm-agent://jobs/jobs/wan21/escape.json",
        "mm-agent://jobs/jobs/wan21/escape_dir/secret.json",
        "mm-agent://jobs/jobs/wan21/notes_link.txt",
        "mm-agent://jobs/notes.txt",
        "mm-agent://jobs/data/train.jsonl",
        "mm-agent://jobs/jobs/wan21/.env",
        "mm-agent://jobs/jobs/wan21/missing.json",
        "mm-agent://jobs/jobs/wan21/feature_extract",
        "mm-agent://jobs/",
    ]
    async with Client(build_server(workspace)) as client:
        for uri in refused:
            err = await _refused(client, uri)
            assert err.code == INVALID_PARAMS, uri
            assert "s3cret" not in err.message and "TOKEN" not in err.message, uri


def test_core_reader_refuses_what_the_sdk_would_catch_first(workspace: Path) -> None:
    """The SDK rejects `..`/absolute template values before the handler; the core refuses them too."""
    for path in (
        "../ws/jobs/wan21/job.yaml",
        "jobs/../jobs/wan21/job.yaml",
        "/etc/passwd",
        "C:x",
        "a\\b",
        "",
    ):
        with pytest.raises(uris.UnknownResource):
            resources.read_job_file(path, workspace)
    assert resources.read_job_file("jobs/wan21/job.yaml", workspace).job_dir == "jobs/wan21"


def test_job_search_is_bounded(workspace: Path) -> None:
    """resources/list walks the workspace on each call: hidden folders, symlinks, jobs inside jobs and
    anything deeper than JOB_SEARCH_DEPTH are not searched."""
    for rel in (".cache/j", "jobs/wan21/sub", "x/y/z/w", "a/b/c"):
        (workspace / rel).mkdir(parents=True, exist_ok=True)
        (workspace / rel / "job.yaml").write_text("model: wan2.1\n", encoding="utf-8")
    (workspace / "linked").symlink_to(workspace / "a")
    found = {p.relative_to(workspace).as_posix() for p in resources.find_jobs(workspace)}
    assert found == {"jobs/wan21", "a/b/c"}


@pytest.mark.anyio
async def test_binary_and_oversized_job_files_refused(workspace: Path) -> None:
    job = workspace / "jobs" / "wan21"
    (job / "weights.json").write_bytes(b"{\x00\x01}")
    (job / "big.txt").write_text("x" * (uris.MAX_FILE_BYTES + 1), encoding="utf-8")
    async with Client(build_server(workspace)) as client:
        binary = await _refused(client, "mm-agent://jobs/jobs/wan21/weights.json")
        big = await _refused(client, "mm-agent://jobs/jobs/wan21/big.txt")
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
    assert binary.code == INTERNAL_ERROR and "not UTF-8 text" in binary.message
    assert big.code == INTERNAL_ERROR and "limit" in big.message
    assert "mm-agent://jobs/jobs/wan21/big.txt" not in listed


def _skill_tree(base: Path) -> None:
    skill = base / "mindspeed-mm-demo"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: mindspeed-mm-demo\n---\n# Demo\n", encoding="utf-8")
    (skill / "references" / "models.md").write_text("| id |\n", encoding="utf-8")
    (base / "not-a-skill").mkdir()


@pytest.mark.anyio
async def test_skills_listed_and_read(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "skills"
    _skill_tree(base)
    (tmp_path / "outside.md").write_text("secret\n", encoding="utf-8")
    (base / "mindspeed-mm-demo" / "references" / "leak.md").symlink_to(tmp_path / "outside.md")
    monkeypatch.setenv("MM_AGENT_SKILLS", str(base))
    async with Client(build_server(workspace)) as client:
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        skill = await _read(client, "mm-agent://skills/mindspeed-mm-demo")
        ref = await _read(client, "mm-agent://skills/mindspeed-mm-demo/references/models.md")
        missing = await _refused(client, "mm-agent://skills/mindspeed-mm-nope")
        leak = await _refused(client, "mm-agent://skills/mindspeed-mm-demo/references/leak.md")
        traversal = await _refused(client, "mm-agent://skills/..%2Fws")
    assert {u for u in listed if u.startswith("mm-agent://skills/")} == {
        "mm-agent://skills/mindspeed-mm-demo"
    }
    assert skill.startswith("---\nname: mindspeed-mm-demo") and ref == "| id |\n"
    assert missing.code == INVALID_PARAMS and "mindspeed-mm-demo" in missing.message
    assert leak.code == INVALID_PARAMS and traversal.code == INVALID_PARAMS


@pytest.mark.anyio
async def test_generated_skills_served_when_built(workspace: Path) -> None:
    built = resources.list_skills()
    if not built:
        pytest.skip("no generated skills/ in this checkout yet (mm-agent skills build)")
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        for name in built:
            text = await _read(client, f"mm-agent://skills/{name}")
            assert text == (skills_dir() / name / "SKILL.md").read_text(encoding="utf-8")


def _assert_steps_in_order(text: str, scenario: str) -> None:
    """Every step's tool appears, numbered, in the workflow's order, with [confirm] on mutating steps."""
    positions = []
    for i, step in enumerate(load_workflows().get(scenario).steps, start=1):
        mark = " [confirm]" if step.confirm else ""
        needle = f"{i}. `{step.tool}`{mark} ({step.id})"
        assert needle in text, needle
        positions.append(text.index(needle))
    assert positions == sorted(positions)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_prompts_render_the_workflows(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    state = tmp_path / "state"
    (state / "runs" / "train-wan21-1").mkdir(parents=True)
    meta = RunMeta(  # a run this workspace's server started (a server answers only for its own runs)
        run_id="train-wan21-1",
        kind="train",
        argv=[],
        pid=1,
        create_time=None,
        started="2026-01-01T00:00:00+00:00",
        cwd=None,
        workspace=str(workspace.resolve()),
    )
    (state / "runs" / "train-wan21-1" / "run.json").write_text(meta.model_dump_json(), encoding="utf-8")
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(state))
    calls = {
        "finetune_generative": {
            "request": "fine-tune Wan2.1 t2v on my videos",
            "dataset_dir": "data",
            "weights_dir": "jobs",
        },
        "finetune_vlm": {"request": "fine-tune Qwen2.5-VL-3B on my data", "dataset_file": "data/train.jsonl"},
        "recover_failed_run": {"log_path": "logs"},
        "new_model": {"request": "add my own DiT video model", "name": "tinydit"},
    }
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        listed = {p.name: p for p in (await client.list_prompts()).prompts}
        rendered = {name: await client.get_prompt(name, args) for name, args in calls.items()}
        by_run = await client.get_prompt("recover_failed_run", {"run_id": "train-wan21-1"})
    assert set(listed) == set(PROMPTS)
    required = {name: {a.name for a in p.arguments or [] if a.required} for name, p in listed.items()}
    assert required == {
        "finetune_generative": {"request", "dataset_dir"},
        "finetune_vlm": {"request", "dataset_file"},
        "recover_failed_run": set(),
        "new_model": {"request", "name"},
    }
    for name, result in rendered.items():
        assert len(result.messages) == 1 and result.messages[0].role == "user"
        text = result.messages[0].content.text  # type: ignore[union-attr]
        _assert_steps_in_order(text, PROMPTS[name])
        for value in calls[name].values():
            assert value in text, value
        assert "do not call job_status in a loop" in text and "confirm=true only after they agree" in text
    generative = rendered["finetune_generative"].messages[0].content.text  # type: ignore[union-attr]
    assert "mm-agent route 'fine-tune Wan2.1 t2v on my videos' --json" in generative
    assert "--weights-dir jobs " in generative and "--dataset-dir data " in generative
    run_text = by_run.messages[0].content.text  # type: ignore[union-attr]
    _assert_steps_in_order(run_text, "recover-failed-run")
    assert "mm-agent status train-wan21-1" in run_text


@pytest.mark.anyio
async def test_prompts_start_a_rehearsal_with_its_demo(workspace: Path) -> None:
    """A request to try it on this machine first puts the routed model's demo before the steps: the VLM
    demo for Qwen2.5-VL (English and Chinese), `mm-agent demo` for Wan; other requests get no such note."""
    calls = [  # (prompt, request, the demo named, what it trains)
        (
            "finetune_vlm",
            "try the Qwen2.5-VL fine-tuning pipeline on this machine first",
            "--vlm",
            "qwen2.5vl sft",
        ),
        ("finetune_vlm", "没有NPU，先在本机演练一下多模态理解微调", "--vlm", "qwen2.5vl sft"),
        ("finetune_vlm", "rehearse a VLM LoRA without NPUs", "--vlm --lora", "qwen2.5vl lora"),
        # Qwen3-VL has no demo: the workflow's own, named with what it trains
        ("finetune_vlm", "try Qwen3-VL on this machine first", "--vlm", "qwen2.5vl sft"),
        ("finetune_generative", "rehearse Wan2.1 text-to-video without NPUs", "", "wan2.1 t2v"),
        ("finetune_vlm", "fine-tune Qwen2.5-VL-3B on my data", None, None),
        ("finetune_generative", "fine-tune Wan2.1 t2v on 8 NPUs", None, None),
    ]
    paths = {
        "finetune_vlm": {"dataset_file": "data/train.jsonl"},
        "finetune_generative": {"dataset_dir": "data"},
    }
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        for name, request, flags, trains in calls:
            got = await client.get_prompt(name, {"request": request, **paths[name]})
            text = got.messages[0].content.text  # type: ignore[union-attr]
            _assert_steps_in_order(text, PROMPTS[name])
            if flags is None:
                assert "First rehearse it" not in text, request
            else:
                demo = f"mm-agent demo {flags}".strip()
                assert f"First rehearse it on this machine: run `{demo}` (CLI; {trains} on tiny" in text, (
                    request
                )
                assert text.index(f"`{demo}`") < text.index("Steps (MCP tool"), request


@pytest.mark.anyio
async def test_prompt_arguments_validated(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    bad = [
        ("finetune_generative", {"request": "x", "dataset_dir": "../outside"}, "outside the workspace"),
        ("finetune_generative", {"request": "x", "dataset_dir": "nope"}, "not an existing directory"),
        (
            "finetune_generative",
            {"request": "x", "dataset_dir": "data", "weights_dir": "/etc"},
            "weights_dir",
        ),
        ("finetune_generative", {"request": "a\nb", "dataset_dir": "data"}, "control characters"),
        ("finetune_generative", {"request": "x" * 501, "dataset_dir": "data"}, "longer than 500"),
        ("finetune_generative", {"request": "  ", "dataset_dir": "data"}, "request is empty"),
        ("finetune_vlm", {"request": "x", "dataset_file": "data"}, "not an existing file"),
        ("recover_failed_run", {}, "exactly one of log_path or run_id"),
        ("recover_failed_run", {"log_path": "logs", "run_id": "abc"}, "exactly one of log_path or run_id"),
        ("recover_failed_run", {"run_id": "../x"}, "run_id"),
        ("recover_failed_run", {"run_id": "train-nope-1"}, "no run 'train-nope-1'"),
    ]
    async with Client(build_server(workspace)) as client:
        for name, args, expected in bad:
            with pytest.raises(MCPError) as info:
                await client.get_prompt(name, args)
            assert info.value.code == INVALID_PARAMS, (name, args)
            assert expected in info.value.message, (name, args, info.value.message)
        with pytest.raises(MCPError) as missing:
            await client.get_prompt("finetune_vlm", {"request": "x"})
        assert missing.value.code == INVALID_PARAMS and "dataset_file" in missing.value.message
        with pytest.raises(MCPError) as unknown:
            await client.get_prompt("finetune", {})
        assert unknown.value.code == INVALID_PARAMS and "finetune_vlm" in unknown.value.message


@pytest.mark.anyio
async def test_stdio_subprocess_reads_resources_and_prompts(workspace: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mm_agent", "serve", "--workspace", str(workspace)], cwd=str(REPO)
    )
    async with Client(params) as client:
        script = await _read(client, "mm-agent://jobs/jobs/wan21/pretrain.sh")
        model = json.loads(await _read(client, "mm-agent://models/wan2.1"))
        err = await _refused(client, "mm-agent://jobs/%2e%2e/%2e%2e/etc/passwd")
        prompt = await client.get_prompt("recover_failed_run", {"log_path": "logs/rank0.log"})
    assert script == (workspace / "jobs/wan21/pretrain.sh").read_text(encoding="utf-8")
    assert model["model"]["id"] == "wan2.1" and len(model["pipeline"]) == 8
    assert err.code == INVALID_PARAMS
    _assert_steps_in_order(prompt.messages[0].content.text, "recover-failed-run")  # type: ignore[union-attr]


@pytest.mark.slow
def test_inspector_cli_resources_and_prompts(workspace: Path) -> None:
    listed = _inspector(workspace, "--method", "resources/list")
    assert listed.returncode == 0, listed.stderr
    uris = {r["uri"] for r in json.loads(listed.stdout)["resources"]}
    assert "mm-agent://models" in uris and _job_uris(workspace) <= uris

    got = _inspector(
        workspace,
        "--method",
        "prompts/get",
        "--prompt-name",
        "finetune_vlm",
        "--prompt-args",
        "request=fine-tune Qwen2.5-VL-3B",
        "dataset_file=data/train.jsonl",
    )
    assert got.returncode == 0, got.stderr
    text = json.loads(got.stdout)["messages"][0]["content"]["text"]
    _assert_steps_in_order(text, "finetune-vlm")
    assert re.search(r"^Inputs:$", text, re.M)

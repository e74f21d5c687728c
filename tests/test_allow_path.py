"""Data and weights outside the workspace, on purpose (issue 14, item 4), through a real in-process MCP client,
the CLI and the core.

- `mm-agent serve --allow-path DIR` (repeatable; `--allow-root` is the older name) admits paths under DIR;
  every refusal of a path outside says which roots ARE allowed and how to add one.
- A Wan `weights_dir` render cannot read for sizing is an error naming the file, the field and the fix,
  never a silent fallback to the registry's 1.3B dimensions. A folder not downloaded yet (missing or
  empty) still renders with the registry's size, and next_steps include the download.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mm_agent.cli import build_parser, main
from mm_agent.cli.serve import run as serve_run
from mm_agent.errors import MMAgentError
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server

REPO = Path(__file__).resolve().parents[1]
# diffusers WanTransformer3DModel config of a tiny model (hidden 4 x 24 = 96, 3 layers): unlike 1.3B.
TINY = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2],
    "num_attention_heads": 4,
    "attention_head_dim": 24,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 32,
    "freq_dim": 32,
    "ffn_dim": 64,
    "num_layers": 3,
}
HIDDEN_1_3B = 1536


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(workspace, an allowed mount beside it, a directory that is not allowed)."""
    dirs = tuple(tmp_path / name for name in ("ws", "mnt", "elsewhere"))
    for d in dirs:
        d.mkdir()
    return dirs  # type: ignore[return-value]


def _weights(folder: Path, config: dict[str, Any] | str | None = TINY) -> Path:
    (folder / "transformer").mkdir(parents=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "transformer" / "config.json").write_text(text, encoding="utf-8")
    return folder


def _calls(ws: Path, calls: list[tuple[str, dict[str, Any]]], allow: tuple[Path, ...] = ()) -> list[Any]:
    async def go() -> list[Any]:
        async with Client(build_server(ws, allow_roots=allow)) as client:
            return [await client.call_tool(tool, args) for tool, args in calls]

    return anyio.run(go)


def _text(result: Any) -> str:
    return str(result.content[0].text)


# --- refusals say which roots are allowed and how to add one ---------------------------------------------


def test_refusals_name_the_allowed_roots_and_how_to_add_one(place: tuple[Path, Path, Path]) -> None:
    ws, mnt, elsewhere = place
    (elsewhere / "run.log").write_text("x\n", encoding="utf-8")
    outside = str(elsewhere / "x")
    calls = [
        ("render_job", {"model": "wan2.1", "task": "t2v", "out_dir": "j", "dataset_dir": outside}),
        ("render_job", {"model": "wan2.1", "task": "t2v", "out_dir": "j", "weights_dir": outside}),
        ("render_job", {"model": "wan2.1", "task": "t2v", "out_dir": outside}),
        ("validate_configs", {"paths": [outside]}),
        ("diagnose_errors", {"paths": [str(elsewhere / "run.log")]}),
        ("extract_features", {"job_dir": outside}),
        ("check_environment", {"job": outside}),
    ]
    for allow in ((), (mnt,)):
        results = _calls(ws, calls, allow)
        for (tool, args), result in zip(calls, results, strict=True):
            text = _text(result)
            assert result.is_error, (tool, args, text)
            assert "outside" in text and f"the workspace {ws.resolve()}" in text, (tool, text)
            assert "mm-agent serve --allow-path DIR" in text, (tool, text)
            if allow:
                assert str(mnt.resolve()) in text, (tool, text)
            else:
                assert "the only allowed root" in text, (tool, text)
    assert not (ws / "j").exists()


def test_an_allowed_path_is_read_for_sizing_and_rendered(place: tuple[Path, Path, Path]) -> None:
    """Weights and data on a mount the operator allowed: the job renders, sized from the mounted config."""
    ws, mnt, _ = place
    weights = _weights(mnt / "wan")
    args = {
        "model": "wan2.1",
        "task": "t2v",
        "out_dir": "job",
        "weights_dir": str(weights),
        "dataset_dir": str(mnt / "videos"),
        "confirm": True,
    }
    refused, done = _calls(ws, [("render_job", args)])[0], _calls(ws, [("render_job", args)], (mnt,))[0]
    assert refused.is_error and "weights_dir" in _text(refused)
    assert not done.is_error, _text(done)
    predictor = json.loads((ws / "job" / "pretrain_model.json").read_text(encoding="utf-8"))["predictor"]
    assert (predictor["hidden_size"], predictor["num_layers"]) == (96, 3)


def test_serve_takes_allow_path_and_the_older_allow_root(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    args = build_parser().parse_args(["serve", "--allow-path", str(a), "--allow-root", str(b)])
    assert args.allow_path == [str(a), str(b)]
    args.workspace = str(tmp_path)
    with pytest.raises(MMAgentError) as err:  # neither exists: refused before the server starts
        serve_run(args)
    assert err.value.field == "--allow-path" and str(a) in err.value.message and err.value.fix


def test_serve_allow_path_over_stdio(place: tuple[Path, Path, Path]) -> None:
    """The flag reaches the server: the same call is refused without it and answered with it."""
    ws, mnt, _ = place
    _weights(mnt / "wan")
    args = {"model": "wan2.1", "task": "t2v", "out_dir": "job", "weights_dir": str(mnt / "wan")}

    async def go(extra: list[str]) -> Any:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "mm_agent", "serve", "--workspace", str(ws), *extra],
            cwd=str(REPO),
        )
        async with Client(params) as client:
            return await client.call_tool("render_job", args)

    refused = anyio.run(go, [])
    admitted = anyio.run(go, ["--allow-path", str(mnt)])
    assert refused.is_error and "--allow-path" in _text(refused)
    assert not admitted.is_error, _text(admitted)


# --- weights that cannot be read for sizing are an error, never a fallback to 1.3B -----------------------


def _fifo(folder: Path) -> Path:
    folder = _weights(folder, None)
    os.mkfifo(folder / "transformer" / "config.json")
    return folder


def _dangling(folder: Path) -> Path:
    folder = _weights(folder, None)
    (folder / "transformer" / "config.json").symlink_to(folder / "gone.json")
    return folder


def _vae(folder: Path) -> Path:
    folder = _weights(folder)
    (folder / "vae").mkdir()
    (folder / "vae" / "config.json").write_text(json.dumps({"scale_factor_spatial": "8"}), encoding="utf-8")
    return folder


def _file(folder: Path) -> Path:
    folder.write_text("not a folder\n", encoding="utf-8")
    return folder


def _partial(folder: Path) -> Path:
    (folder / ".cache").mkdir(parents=True)
    (folder / "model_index.json").write_text("{}", encoding="utf-8")
    return folder


missing_key = {k: v for k, v in TINY.items() if k != "num_layers"}
# name -> (make the folder, the file the error names (relative to it), the field, a word of the message)
BROKEN = {
    "no transformer config": (
        _partial,
        "transformer/config.json",
        "weights_dir",
        "no transformer/config.json",
    ),
    "missing key": (
        lambda f: _weights(f, missing_key),
        "transformer/config.json",
        "num_layers",
        "num_layers",
    ),
    "not json": (lambda f: _weights(f, "{not json"), "transformer/config.json", "weights_dir", "not JSON"),
    "json list": (lambda f: _weights(f, "[1, 2]"), "transformer/config.json", "weights_dir", "JSON object"),
    "config is a folder": (
        lambda f: (_weights(f, None) / "transformer" / "config.json").mkdir() or f,
        "transformer/config.json",
        "weights_dir",
        "a directory",
    ),
    "config is a fifo": (_fifo, "transformer/config.json", "weights_dir", "FIFO"),
    "dangling symlink": (_dangling, "transformer/config.json", "weights_dir", "config.json"),
    "weights_dir is a file": (_file, "", "weights_dir", "not a directory"),
    "vae stride not an int": (_vae, "vae/config.json", "scale_factor_spatial", "scale_factor_spatial"),
}


def _check(err: MMAgentError, folder: Path, rel: str, field: str, word: str) -> None:
    assert err.file == str(folder / rel if rel else folder), err.file
    assert err.field == field and word in err.message, (err.field, err.message)
    assert err.fix, err.message


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_unreadable_weights_are_an_error_in_the_core(tmp_path: Path, case: str) -> None:
    make, rel, field, word = BROKEN[case]
    folder = make(tmp_path / "w")
    request = RenderRequest(
        model="wan2.1", task="t2v", out_dir=str(tmp_path / "job"), weights_dir=str(folder)
    )
    with pytest.raises(MMAgentError) as err:
        render_job(request)
    _check(err.value, folder, rel, field, word)
    assert not (tmp_path / "job").exists()


def test_unreadable_weights_are_an_error_over_mcp(place: tuple[Path, Path, Path]) -> None:
    """Every broken folder in one client session: the answer is an error naming file, field and fix."""
    ws, _, _ = place
    calls, expected = [], []
    for i, case in enumerate(sorted(BROKEN)):
        make, rel, field, word = BROKEN[case]
        folder = make(ws / f"w{i}")
        calls.append(
            ("render_job", {"model": "wan2.1", "task": "t2v", "out_dir": f"j{i}", "weights_dir": f"w{i}"})
        )
        expected.append((case, str(folder / rel if rel else folder), field, word))
    for result, (case, file, field, word) in zip(_calls(ws, calls), expected, strict=True):
        text = _text(result)
        assert result.is_error, (case, text)
        assert file in text and field in text and word in text and "fix:" in text, (case, text)


def test_unreadable_weights_are_an_error_on_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = _partial(tmp_path / "w")
    code = main(["render", "wan2.1", "--task", "t2v", "--out", "job", "--weights-dir", "w", "--dry-run"])
    err = capsys.readouterr().err
    assert code != 0
    assert str(folder / "transformer" / "config.json") in err and "weights_dir" in err, err
    assert "fix:" in err and "huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers" in err, err


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root reads a mode-000 file; the FIFO and folder cases cover it"
)
def test_an_unreadable_config_is_an_error(tmp_path: Path) -> None:
    folder = _weights(tmp_path / "w")
    (folder / "transformer" / "config.json").chmod(0)
    request = RenderRequest(
        model="wan2.1", task="t2v", out_dir=str(tmp_path / "job"), weights_dir=str(folder)
    )
    with pytest.raises(MMAgentError) as err:
        render_job(request)
    assert err.value.file == str(folder / "transformer" / "config.json") and err.value.fix


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_weights_not_downloaded_yet_render_with_the_registry_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """The user downloads after rendering: a missing or empty folder is fine, and next_steps say how."""
    monkeypatch.chdir(tmp_path)
    if state == "empty":
        (tmp_path / "w").mkdir()
    assert main(["render", "wan2.1", "--task", "t2v", "--out", "job", "--weights-dir", "w", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    predictor = json.loads((tmp_path / "job" / "pretrain_model.json").read_text(encoding="utf-8"))[
        "predictor"
    ]
    assert predictor["hidden_size"] == HIDDEN_1_3B
    download = f"huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers --local-dir {tmp_path / 'w'}"
    assert download in result["next_steps"]

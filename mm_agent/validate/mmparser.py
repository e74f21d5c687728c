"""MindSpeed-MM's own verdict on a launch command: its real argument parser and argument validation.

Given a MindSpeed-MM checkout (plus MindSpeed and Megatron-LM, found next to it), a child process
(`mmparser_child.py`, run with this interpreter, never imported here) builds the parser MindSpeed-MM really
uses (Megatron `add_megatron_arguments`, the `--mm-*` args, MindSpeed-MM's and MindSpeed's `process_args`,
every MindSpeed feature's `register_args`) once, parses every argv of the batch with it and runs
MindSpeed-MM's `validate_args` (Megatron's, patched by MindSpeed-MM) on each. `torch_npu` and the other
Ascend modules are stubbed there, so it runs on any CPU machine with torch installed.

Which entries are judged is read from the checkout itself: an entry script that uses MindSpeed-MM's
`mm_extra_args_provider` goes through the Megatron parser (after MindSpeed-MM's YAML reader when it loads
`read_yaml_config.py` and the first argument is a YAML); an FSDP2-native entry (`parse_args(Arguments)` of
`mindspeed_mm.fsdp.params.argument`) goes through that YAML reader. Others are not judged.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from mm_agent.contained import run_contained
from mm_agent.errors import MMAgentError

CHILD = Path(__file__).with_name("mmparser_child.py")
MEGATRON_TAG = "core_v0.12.1"
DEFAULT_TIMEOUT_S = 300.0
# torchrun options that take no value (everything else takes one, as `--opt v` or `--opt=v`)
_TORCHRUN_BOOLEAN = {
    "--standalone",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "-m",
    "--module",
}

EntryKind = Literal["megatron", "fsdp"]


@dataclass(frozen=True)
class Trees:
    """A MindSpeed-MM checkout and the MindSpeed / Megatron-LM trees that go on sys.path before it."""

    mm_root: Path
    mindspeed: Path | None
    megatron: Path | None


def locate(mm_root: Path, mm_version: str | None = None) -> Trees:
    """MindSpeed-MM at `mm_root`; Megatron at `<mm_root>/megatron` (as the install copies it) or
    `../../Megatron-LM/core_v0.12.1` (the upstream layout); MindSpeed at `../../MindSpeed/<version>_core_r0.12.1`,
    `<mm_root>/../MindSpeed`, or whatever the interpreter has installed (None)."""
    mm_root = mm_root.expanduser().resolve()
    if not (mm_root / "mindspeed_mm" / "arguments.py").is_file():
        raise MMAgentError(
            f"{mm_root} is not a MindSpeed-MM checkout (no mindspeed_mm/arguments.py)",
            field="mm_root",
            fix="pass the root of a MindSpeed-MM source checkout (the folder holding pretrain_sora.py)",
        )
    version = mm_version or (mm_root.name[1:] if re.fullmatch(r"v\d+(\.\d+)+", mm_root.name) else None)
    megatron: Path | None = None
    for candidate in (
        mm_root,
        mm_root.parent.parent / "Megatron-LM" / MEGATRON_TAG,
        mm_root.parent / "Megatron-LM",
    ):
        if (candidate / "megatron" / "training" / "arguments.py").is_file():
            megatron = candidate
            break
    mindspeed: Path | None = None
    candidates = [mm_root.parent / "MindSpeed"]
    if version:
        candidates.insert(0, mm_root.parent.parent / "MindSpeed" / f"{version}_core_r0.12.1")
    for candidate in candidates:
        if (candidate / "mindspeed" / "arguments.py").is_file():
            mindspeed = candidate
            break
    return Trees(mm_root, mindspeed, megatron)


def code_dirs(trees: Trees) -> list[Path]:
    """The folders whose Python the parser child imports (first on its sys.path): trusting a checkout means
    trusting each of these."""
    return [p for p in (trees.mm_root, trees.megatron, trees.mindspeed) if p is not None]


class ParserNotStarted(MMAgentError):
    """The parser child could not be started: none of the checkout's code ran."""


class ParseJob(BaseModel):
    id: str
    entry: str = Field(description="the entry script, relative to the MindSpeed-MM root")
    argv: list[str] = Field(description="the entry script's arguments")
    world_size: int = 1
    cwd: str | None = Field(
        default=None, description="where the script runs it (default: the MindSpeed-MM root)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="variables the script exports to it")


class ParseVerdict(BaseModel):
    id: str
    judged: bool = Field(description="false when the entry is not one MindSpeed-MM's parser reads")
    ok: bool
    stage: str = Field(
        description="where it stopped: import, yaml, parse, validate, microbatches; done; or skipped"
    )
    error: str | None = None
    flag: str | None = Field(default=None, description="the flag the error names, when it names one")
    argv: list[str] | None = Field(default=None, description="the argv parsed (after a YAML reader)")


class ParserReport(BaseModel):
    mm_root: str
    parser_options: int = Field(description="option strings of the parser that was built")
    validator: str | None = Field(default=None, description="the validate_args that ran")
    verdicts: list[ParseVerdict]


def split_torchrun(argv: list[str]) -> tuple[int, str, list[str]]:
    """`torchrun [opts] entry.py args...` (argv without the program) -> (world size, entry, args)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        if "=" in word:
            key, _, value = word.partition("=")
            opts[key] = value
            i += 1
        elif word in _TORCHRUN_BOOLEAN:
            i += 1
        else:
            opts[word] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
    if i >= len(argv):
        raise MMAgentError(
            "the torchrun command names no entry script", field="argv", fix="pass the entry script"
        )
    nproc = _int(opts.get("--nproc_per_node", opts.get("--nproc-per-node", "1")))
    nnodes = _int(opts.get("--nnodes", "1").split(":")[-1])
    return nproc * nnodes, argv[i], argv[i + 1 :]


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 1


def entry_kind(mm_root: Path, entry: str) -> tuple[EntryKind | None, str | None]:
    """(kind, the YAML reader it runs first) of an entry script, read from the checkout: MindSpeed-MM's
    Megatron entries (`read_yaml_config` when it loads that), FSDP2-native ones (`parse_args` or
    `config_manager`)."""
    if os.path.isabs(entry) or ".." in Path(entry).parts:
        return None, None  # an entry outside the checkout is not MindSpeed-MM's
    path = mm_root / entry
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None
    if "mm_extra_args_provider" in text:
        return "megatron", "read_yaml_config" if "read_yaml_config" in text else None
    if "mindspeed_mm.fsdp.params.argument import" in text:
        if "ConfigManager(config_class=Arguments)" in text:
            return "fsdp", "config_manager"
        if "parse_args(Arguments)" in text:
            return "fsdp", "parse_args"
    return None, None


_ATTR = re.compile(r"\bargs\.([a-z_][a-z0-9_]*)")
_FLAG = re.compile(r"(--[a-z0-9][a-z0-9-]*)")


def flag_of(error: str | None, argv: list[str]) -> str | None:
    """The flag an error names: `--x` in argparse's message, else the `args.x` of the failed assertion."""
    if not error:
        return None
    found = _FLAG.search(error)
    if found:
        return found.group(1)
    for attr in _ATTR.findall(error):
        flag = "--" + attr.replace("_", "-")
        if flag in argv or not argv or attr not in ("rank", "world_size", "mm"):
            return flag
    return None


def judge(trees: Trees, jobs: list[ParseJob], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ParserReport:
    """Parse and validate every job's argv in one child process."""
    verdicts: dict[str, ParseVerdict] = {}
    batch: list[dict[str, object]] = []
    for job in jobs:
        kind, reader = entry_kind(trees.mm_root, job.entry)
        if kind is None:
            verdicts[job.id] = ParseVerdict(
                id=job.id,
                judged=False,
                ok=True,
                stage="skipped",
                error=f"{job.entry} does not read MindSpeed-MM's arguments (not in {trees.mm_root}, or its own CLI)",
            )
            continue
        batch.append(
            {
                "id": job.id,
                "entry": job.entry,
                "argv": job.argv,
                "world_size": job.world_size,
                "cwd": job.cwd or str(trees.mm_root),
                "kind": kind,
                "yaml_reader": reader == "read_yaml_config",
                "reader": reader,
                "env": job.env,
            }
        )
    report = ParserReport(mm_root=str(trees.mm_root), parser_options=0, verdicts=[])
    if batch:
        out = _run_child(trees, batch, timeout_s)
        report.parser_options = int(out.get("parser_options") or 0)
        report.validator = out.get("validator")
        by_job = {str(b["id"]): b for b in batch}
        for raw in out.get("results", []):
            argv = raw.get("argv") or list(by_job[raw["id"]]["argv"])  # type: ignore[call-overload]
            verdicts[raw["id"]] = ParseVerdict(
                id=raw["id"],
                judged=True,
                ok=bool(raw["ok"]),
                stage=raw["stage"],
                error=raw.get("error"),
                flag=None
                if raw["ok"]
                else "--global-batch-size"
                if raw["stage"] == "microbatches"
                else flag_of(raw.get("error"), argv),
                argv=argv,
            )
    report.verdicts = [verdicts[j.id] for j in jobs if j.id in verdicts]
    return report


def _run_child(trees: Trees, batch: list[dict[str, object]], timeout_s: float) -> dict[str, Any]:
    """Run the child contained (own process group, killed with all it started at the end or the timeout);
    the request goes in a private temporary file, the verdicts come back as JSON on stdout."""
    request = {
        "mm_root": str(trees.mm_root),
        "mindspeed": str(trees.mindspeed) if trees.mindspeed else None,
        "megatron": str(trees.megatron) if trees.megatron else None,
        "jobs": batch,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    with tempfile.TemporaryDirectory(prefix="mm-agent-parser-") as folder:
        path = Path(folder) / "request.json"
        path.write_text(json.dumps(request), encoding="utf-8")
        try:
            done = run_contained(
                [sys.executable, str(CHILD), str(path)], timeout_s=timeout_s, env=env, cwd=str(trees.mm_root)
            )
        except OSError as exc:
            raise ParserNotStarted(
                f"could not start MindSpeed-MM's parser process: {exc}",
                field="mm_root",
                fix="check that mm-agent's Python can run",
            ) from exc
    if done.timed_out:
        raise MMAgentError(
            f"MindSpeed-MM's parser did not answer within {timeout_s:.0f} s",
            field="mm_root",
            fix="check that the checkout's Python imports (torch, MindSpeed) work on this machine",
        )
    try:
        out = json.loads(done.stdout)
    except ValueError as exc:
        raise MMAgentError(
            f"MindSpeed-MM's parser process failed (exit {done.returncode}): {done.stderr[-1500:]}",
            field="mm_root",
            fix="install torch (the runtime extra) in mm-agent's environment, and pass a MindSpeed-MM checkout "
            "with MindSpeed and Megatron-LM next to it (or Megatron copied into it)",
        ) from exc
    if not isinstance(out, dict):
        raise MMAgentError("MindSpeed-MM's parser process answered no JSON object", field="mm_root")
    if out.get("error"):
        raise MMAgentError(
            str(out["error"]),
            field="mm_root",
            fix="pass a MindSpeed-MM checkout whose MindSpeed (../MindSpeed or installed) and Megatron-LM "
            "core_v0.12.1 (<mm_root>/megatron) are present",
        )
    return out

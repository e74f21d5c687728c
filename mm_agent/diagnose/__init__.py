"""Log diagnosis: the one root cause of a failed (or silently broken) run, with its evidence and fixes.

`diagnose_errors` reads files, directory trees, stdin or text as a stream (bounded memory at any size),
matches the failure catalog (`signatures/*.yaml`) on the lines its triggers hit, puts the findings in time
order across files and ranks, and picks the root cause over the symptoms it caused (`rootcause.py`).
`follow` does the same on growing logs and returns as soon as a fatal cause shows up.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.diagnose.catalog import CompiledSignature, get_catalog
from mm_agent.diagnose.follow import follow
from mm_agent.diagnose.reader import Source, collect, read_source
from mm_agent.diagnose.rootcause import build_report
from mm_agent.diagnose.scan import ScanContext
from mm_agent.diagnose.schema import DiagnosisReport, Evidence, Finding, Progress
from mm_agent.errors import MMAgentError
from mm_agent.fields import LOG_TEXT_CHARS, MAX_PATHS, Name, PathText

__all__ = [
    "DiagnoseRequest",
    "DiagnosisReport",
    "Evidence",
    "Finding",
    "Progress",
    "diagnose_errors",
    "diagnose_text",
    "follow",
]


class DiagnoseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: list[PathText] = Field(
        default_factory=list,
        max_length=MAX_PATHS,
        description="log files or folders (recursive, .gz too)",
    )
    text: str | None = Field(
        default=None,
        max_length=LOG_TEXT_CHARS,
        description="raw log text, for callers that hold the log itself",
    )
    run_id: Name | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,63}$",
        description="a run mm-agent started: its log",
    )
    max_evidence: int = Field(default=5, ge=1, le=100, description="evidence lines kept per finding")


def sources_of(req: DiagnoseRequest, root: Path | None) -> tuple[list[Source], list[str]]:
    """The request's inputs; at least one path or the text is required."""
    if not req.paths and req.text is None and req.run_id is None:
        raise MMAgentError(
            "nothing to diagnose",
            field="paths",
            fix="pass log files or directories, the log text, or the run id of a run mm-agent started",
        )
    sources, skipped = collect(req.paths, root.resolve() if root is not None else None)
    if req.run_id is not None:
        # The run's log lives in mm-agent's own state dir (outside any workspace): the run id, checked
        # against the runs mm-agent recorded, is what makes it readable over MCP.
        from mm_agent.runs import LOG, run_dir_for

        log = run_dir_for(req.run_id, root) / LOG  # with a workspace: only a run of that workspace
        if not log.is_file():
            raise MMAgentError(f"run {req.run_id} has no log yet", file=str(log), fix="wait for it to start")
        sources.append(Source(name=f"{req.run_id}/{LOG}", path=log))
    if req.text is not None:
        sources.append(Source(name="<text>", text=req.text.encode("utf-8", "replace")))
    return sources, skipped


def diagnose_errors(
    req: DiagnoseRequest, root: Path | None = None, *, catalog: Sequence[CompiledSignature] | None = None
) -> DiagnosisReport:
    """Diagnose logs; with `root` (the MCP workspace) every path must resolve inside it.

    `catalog` replaces the shipped signatures (tests, or a site's own catalog via `load_catalog(dir)`).
    """
    sources, skipped = sources_of(req, root)
    ctx = ScanContext(get_catalog() if catalog is None else catalog, req.max_evidence)
    ctx.skipped.extend(skipped)
    for index, source in enumerate(sources):
        read_source(ctx, source, index)
    return build_report(ctx)


def diagnose_text(text: str, name: str = "<text>") -> DiagnosisReport:
    """Diagnose captured output (e.g. a failed install step's stderr)."""
    ctx = ScanContext(get_catalog(), DiagnoseRequest().max_evidence)
    read_source(ctx, Source(name=name, text=text.encode("utf-8", "replace")), 0)
    return build_report(ctx)

"""`validate_configs`: parse every file of a MindSpeed-MM job and run per-file and cross-file rules.

Inputs are job directories (walked for *.sh, *.json, *.yaml/*.yml, data.txt, job.yaml) and/or files.
Scripts are read statically (variables, `$JOB_DIR` idiom, the torchrun flags) and the config files they
pass are validated too. The result is a `ValidationReport`; bad input becomes findings, never a traceback.
Only regular files are read (FIFOs and devices are findings, not reads that never end), and with a
workspace `root` every file is re-checked against it once open. With `mm_root` naming a MindSpeed-MM
checkout, its real argument parser also judges every launch (`rules_mmparser`, in a child process): that runs
the checkout's code, so only where `trust` allows it (the CLI: always; the server: its `--trust-mm-root`
folders), else the report says what would run and how to allow it. That checkout's (or, without one, the
checkout a job directory lies in) DiT code is also read, never run, by `rules_newmodel` (`newmodel.*`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mm_agent.cancel import Cancelled
from mm_agent.errors import MMAgentError
from mm_agent.names import shown, shown_path
from mm_agent.paths import confine, one_resolution, owning_root, where
from mm_agent.validate import (
    rules_ckpt,
    rules_common,
    rules_data,
    rules_dataset,
    rules_estimate,
    rules_generative,
    rules_launcher,
    rules_load,
    rules_lora,
    rules_mmparser,
    rules_multinode,
    rules_newmodel,
    rules_parallel,
    rules_ranktable,
    rules_vlm,
)
from mm_agent.validate.files import walk
from mm_agent.validate.findings import FileSummary, Finding, Sink, ValidateRequest, ValidationReport
from mm_agent.validate.job import Job, exists, is_dir
from mm_agent.validate.refs import build_launches, load_inputs

__all__ = ["FileSummary", "Finding", "ValidateRequest", "ValidationReport", "validate_configs"]


def _inputs(req: ValidateRequest, root: Path | None, sink: Sink, dirs: list[Path]) -> list[Path]:
    """The files to validate; the directories among the inputs are added to `dirs` (the job directories)."""
    if not req.paths:
        raise MMAgentError("no paths to validate", field="paths", fix="pass a job directory or config files")
    files: list[Path] = []
    for raw in req.paths:
        path = Path(raw).expanduser()
        if root is not None and not path.is_absolute():
            path = root / path
        try:
            path = path.resolve()
        except (OSError, ValueError, RuntimeError):
            sink.error(
                "input.missing", raw, "not a usable path", "pass an existing job directory or config file"
            )
            continue
        if root is not None and owning_root(path, root) is None:
            raise MMAgentError(
                f"{raw} is outside {where(root)}",
                field="paths",
                fix="pass paths inside the workspace (copy the job into it first)",
            )
        if is_dir(path):
            dirs.append(path)
            files.extend(walk(path))
        elif exists(path):
            files.append(path)
        else:
            sink.error(
                "input.missing",
                str(path),
                "no such file or directory",
                "pass an existing job directory or config file",
            )
    return files


def validate_configs(
    req: ValidateRequest, *, root: Path | None = None, trust: Sequence[Path] | None = None
) -> ValidationReport:
    """Validate a job; with `root`, nothing outside it is read (and inputs outside it are refused).
    `trust`: the folders whose checkouts' code mm_root may run (the server's `--trust-mm-root`); None means the
    caller is the operator (the CLI), whose named checkout runs."""
    with one_resolution():  # the workspace, resolved once for the whole validation (not per path checked)
        return _validate(req, root, trust)


def _validate(req: ValidateRequest, root: Path | None, trust: Sequence[Path] | None) -> ValidationReport:
    root = root.expanduser().resolve() if root is not None else None
    sink = Sink()
    mm_root = req.mm_root
    if mm_root and root is not None:
        # like every path of a request: inside the workspace (or an allowed root); its parser code is run
        mm_root = str(confine(mm_root, root, "mm_root"))
    job = Job(sink, root, mm_root)
    inputs = _inputs(req, root, sink, job.inputs)
    # an input that cannot be resolved (a symlink loop) is loaded anyway, to be reported with the fix
    load_inputs(
        job,
        [
            p
            for p in dict.fromkeys(inputs)
            if (real := job.resolved(p)) is None or not job.outside(real, str(p), None, None)
        ],
    )
    job.find_mm_root()
    build_launches(job)
    for rules in (
        rules_common,
        rules_ckpt,
        rules_parallel,
        rules_generative,
        rules_data,
        rules_dataset,
        rules_vlm,
        rules_multinode,
        rules_ranktable,
        rules_launcher,
        rules_lora,
        rules_load,
        rules_newmodel,
        rules_estimate,
    ):
        try:
            rules.check(job)
        except Cancelled:  # the call was abandoned: no more rules
            raise
        except Exception as exc:  # a validator bug must not hide the other rules' findings
            sink.warning(
                "validator.crash",
                str(inputs[0]) if inputs else "",
                f"{rules.__name__} stopped early: {type(exc).__name__}: {exc}",
                "report this mm-agent bug with the job files; the findings "
                "from the other rule groups are still valid",
            )
    ran_code_from = None
    if req.mm_root and job.mm_root is not None:
        try:
            ran_code_from = rules_mmparser.check(job, job.mm_root, req.paths, trust)
        except Exception as exc:  # as above: a bug here must not hide the other findings
            sink.warning(
                "validator.crash",
                str(job.mm_root),
                f"{rules_mmparser.__name__} stopped early: {type(exc).__name__}: {exc}",
                "report this mm-agent bug with the job files; the other findings are still valid",
            )
    findings = sink.sorted()
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    summaries = [FileSummary(path=shown_path(p), kind="shell") for p in job.scripts]
    summaries += [FileSummary(path=shown_path(p), kind=c.kind) for p, c in job.configs.items()]
    return ValidationReport(
        ok=errors == 0 and not (req.strict and warnings),
        findings=findings,
        files=sorted(summaries, key=lambda s: s.path),
        error_count=errors,
        warning_count=warnings,
        ran_code_from=shown(ran_code_from) if ran_code_from is not None else None,
    )

"""`convert_weights`: plan a weight conversion (dry run), or start it as a background run.

A dry run returns the plan: the layout it will write, the memory/disk estimate and the equivalent
mm-convert command. With `confirm` the plan is checked again (a conversion that does not fit is refused
before anything starts) and the conversion starts in a worker process (`mm_agent.convert.worker`), so the
caller gets a run id at once and follows it with `job_status`. Converters mm-agent implements run
natively (`plan.NATIVE`); the others run MindSpeed-MM's mm-convert (`upstream`). Nothing here imports
torch.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pydantic import ValidationError

from mm_agent.convert.plan import confine_request, is_native, plan_conversion, require_fit
from mm_agent.convert.predownload import download_fix, missing_download, plan_before_download, refuse_missing
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest
from mm_agent.convert.upstream import INSTALL_FIX, MM_CONVERT
from mm_agent.errors import MMAgentError
from mm_agent.runs import RunStatus, start_run

__all__ = ["ConvertPlan", "ConvertReport", "ConvertRequest", "convert_weights", "final_report", "is_native"]

RUN_KIND = "convert"
PLAN = "plan.json"  # the checked plan, next to request.json in the run dir


def resolve_request(req: ConvertRequest, root: Path | None) -> ConvertRequest:
    """Absolute paths (the worker runs elsewhere); with `root` every path must stay inside it (MCP)."""
    if root is not None:
        return confine_request(req, root)

    def one(raw: str) -> str:
        return str(Path(raw).expanduser().resolve())

    update = {"source": one(req.source), "target": one(req.target)}
    for name in ("hf_dir", "lora_path"):
        raw = getattr(req, name)
        if raw is not None:
            update[name] = one(raw)
    return req.model_copy(update=update)


def worker_argv() -> list[str]:
    return [sys.executable, "-m", "mm_agent.convert.worker"]


def convert_weights(req: ConvertRequest, root: Path | None = None) -> ConvertReport:
    """Dry run (`req.confirm` False): the plan. Confirmed: start the conversion and return its run id."""
    req = resolve_request(req, root)
    if missing_download(req):  # planned before the download: from the registry, the download named first
        if req.confirm:
            refuse_missing(req)
        plan = plan_before_download(req)
        first = plan.download or download_fix(req)
        return ConvertReport(
            status="dry_run",
            plan=plan,
            message=f"dry run: the weights are not downloaded yet, so this plan is the registry's; first: {first}; "
            "then this dry run again (exact layout and estimate); convert with confirm=true (CLI: --yes)",
        )
    plan = plan_conversion(req)
    if not req.confirm:
        return ConvertReport(
            status="dry_run",
            plan=plan,
            message="dry run: nothing was written; convert with confirm=true (CLI: --yes)",
        )
    require_fit(plan)
    if not plan.native and shutil.which(MM_CONVERT) is None:
        raise MMAgentError(
            f"{req.converter}.{req.method} runs MindSpeed-MM's {MM_CONVERT}, which is not on PATH",
            field="converter",
            fix=INSTALL_FIX,
        )
    info = start_run(RUN_KIND, worker_argv(), req, root, inputs={PLAN: plan}, workspace=root)
    return ConvertReport(
        status="started",
        run_id=info.run_id,
        plan=plan,
        message=f"conversion started as run {info.run_id} (PID {info.pid}, log {info.log}); follow it with "
        f"job_status / `mm-agent status {info.run_id}`; stop it with `mm-agent stop {info.run_id} --yes`",
    )


def final_report(status: RunStatus, plan: ConvertPlan) -> ConvertReport:
    """The ConvertReport of a finished run; a killed worker (no report) becomes a failed one."""
    if status.report is not None:
        try:
            return ConvertReport.model_validate(status.report)
        except ValidationError as exc:
            why = f"its report does not parse ({exc.error_count()} errors)"
    else:
        why = f"the worker (PID {status.pid}) stopped without a report (killed?)"
    return ConvertReport(
        status="failed",
        run_id=status.run_id,
        plan=plan,
        message=f"run {status.run_id}: {why}; the conversion did not finish; log: {status.log}",
    )

"""The `install_deps` tool: plan the install of a model's stack and, when confirmed, run it.

`build_plan` turns registry data into verified argv steps (plus conflicts and a bash script); with
`confirm=True` `execute_plan` runs them step by step, logged, stopping at the first failure with its diagnosis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from mm_agent.install.execute import InstallRun, ProgressCallback, execute_plan
from mm_agent.install.plan import InstallPlan, InstallRequest, build_plan


class InstallResult(BaseModel):
    status: Literal["dry_run", "succeeded", "failed"]
    plan: InstallPlan
    run: InstallRun | None = None


def install_deps(
    req: InstallRequest, *, root: Path | None = None, on_progress: ProgressCallback | None = None
) -> InstallResult:
    """Plan (and with `req.confirm` run) the install; `root` confines every path (the MCP workspace)."""
    plan = build_plan(req, root=root)
    if not req.confirm:
        return InstallResult(status="dry_run", plan=plan)
    run = execute_plan(plan, req.steps, base=(root or Path.cwd()).resolve(), on_progress=on_progress)
    return InstallResult(status=run.status, plan=plan, run=run)

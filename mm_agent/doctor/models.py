"""Request and report of `check_environment` (CLI `mm-agent doctor`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.fields import MAX_ITEMS, Name, PathText

Status = Literal["ok", "warn", "fail", "skip"]
STATUS_ORDER: dict[str, int] = {"fail": 0, "warn": 1, "ok": 2, "skip": 3}


class DoctorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Name | None = Field(default=None, description="enables its deps/RAM/disk checks")
    task: Name | None = None
    size: Name | None = None
    mm_version: Name | None = Field(default=None, description="default: the registry's")
    mm_root: PathText | None = Field(default=None, description="default: job, $MM_ROOT, ./MindSpeed-MM, cwd")
    job: PathText | None = Field(default=None, description="rendered job: sets model, version, ports")
    master_port: int | None = Field(
        default=None, ge=1, le=65535, description="default: job, $MASTER_PORT, 6000"
    )
    python: PathText | None = Field(
        default=None,
        description="the training env's CPython (<venv>/bin/python)",
    )
    checks: Annotated[list[Name], Field(max_length=MAX_ITEMS)] | None = Field(
        default=None, description="run only these check ids"
    )
    timeout_s: float = Field(default=2.5, gt=0, le=60, description="per check")


class CheckResult(BaseModel):
    id: str
    title: str
    status: Status
    summary: str
    evidence: list[str] = Field(default_factory=list)
    fix: str | None = Field(default=None, description="'To fix: ...' text; set for warn and fail")
    duration_ms: int = 0


class MachineSummary(BaseModel):
    hostname: str
    platform: str
    arch: str
    cpus: int
    python: str = Field(description="version of the checked interpreter")
    python_executable: str
    python_source: str = Field(default="", description="why that one is the training env")
    agent_python: str = Field(default="", description="the interpreter mm-agent runs in")
    mm_version: str
    model: str | None = None
    mm_root: str | None = None
    job: str | None = None
    npus: int | None = Field(default=None, description="NPUs from `npu-smi info`; None without npu-smi")


class DoctorReport(BaseModel):
    ok: bool = Field(description="true when no check failed")
    counts: dict[str, int] = Field(description="checks per status: ok, warn, fail, skip")
    machine: MachineSummary
    checks: list[CheckResult]
    duration_ms: int

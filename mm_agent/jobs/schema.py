"""Typed inputs and outputs of job management, shared by the MCP tools, the CLI (`--json`) and the demo.

A job run is a run directory like a conversion's (`mm_agent.runs`): request.json says what was asked
(`JobRequest`), stage.json which processes the stage is made of (`StageRecord`, written by the supervisor),
progress.json what the log says so far (`JobProgress`) and report.json how it ended (`JobReport`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mm_agent.diagnose.schema import Category, Fix
from mm_agent.fields import PathText, one_line
from mm_agent.runs import RUN_ID_PATTERN, RunProgress

STAGE_FILE, STOP_FILE = "stage.json", "stop.json"  # in the run dir, next to mm_agent.runs' files
Stage = Literal["extract", "train", "sample", "evaluate"]
STAGES: tuple[Stage, ...] = ("extract", "train", "sample", "evaluate")
Runtime = Literal["mindspeed-mm", "bundled"]
JobState = Literal["running", "succeeded", "failed", "stopped", "killed"]
EndState = Literal["succeeded", "failed", "stopped"]
StoppedBy = Literal["watchdog", "user"]
MAX_ENV = 32  # extra variables per launch; the allowlist has fewer names than that outside HCCL_*/NCCL_*
ENV_NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"
ENV_VALUE_CHARS = 1024


EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, Field(max_length=ENV_VALUE_CHARS), AfterValidator(one_line)]
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN, max_length=64)]


class LaunchRequest(BaseModel):
    """What the MCP tools `extract_features` / `launch_training` take (the stage is the tool's)."""

    model_config = ConfigDict(extra="forbid")

    job_dir: PathText = Field(description="rendered job directory (holds job.yaml)")
    confirm: bool = Field(default=False, description="false: dry run (argv, env, port; nothing starts)")
    nproc_per_node: int | None = Field(
        default=None, ge=1, le=64, description="processes per node (default: the job's npus_per_node)"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="device/communication variables only (HCCL_*, NCCL_*, *_VISIBLE_DEVICES)",
    )
    stop_grace_s: float = Field(
        default=10.0, gt=0, le=300, description="on stop/watchdog: seconds between SIGTERM and SIGKILL"
    )


class StageRequest(LaunchRequest):
    """`start_stage` input: a launch of one stage of a rendered job."""

    stage: Stage


class JobRequest(BaseModel):
    """request.json of a job run: everything the supervisor needs, fixed at launch."""

    job_dir: str
    stage: Stage
    runtime: Runtime
    script: str = Field(description="absolute path of the stage script")
    argv: list[str] = Field(description="what the supervisor runs: bash <script>")
    env: dict[str, str] = Field(description="variables set on top of the launcher's environment")
    master_port: int | None
    hccl_if_base_port: int | None
    nproc_per_node: int | None
    stop_grace_s: float
    spec: dict[str, Any] = Field(description="job.yaml as loaded")
    save_path: str | None = Field(
        default=None, description="train: where it writes checkpoints (no other training may write there)"
    )


class StageLaunch(BaseModel):
    """`start_stage` result: the plan (dry run) or the started run."""

    status: Literal["dry_run", "started"]
    run_id: str | None = None
    job_dir: str
    stage: Stage
    runtime: Runtime
    script: str
    argv: list[str] = Field(description="the command the supervisor runs, in its own process group")
    env: dict[str, str] = Field(description="environment set on top of mm-agent's own")
    master_port: int | None = Field(description="free port chosen for torchrun's store (None: script's own)")
    hccl_if_base_port: int | None = Field(default=None, description="NPU hosts: this job's HCCL port base")
    nproc_per_node: int | None
    checked: list[str] = Field(default_factory=list, description="inputs found in place before launch")
    save_path: str | None = Field(
        default=None, description="train: where it writes checkpoints (recorded there as this job's)"
    )
    supervisor_pid: int | None = None
    pgid: int | None = Field(default=None, description="process group of the stage, once started")
    log: str | None = None
    message: str


class ProcessId(BaseModel):
    """A process as recorded: PID plus start time, so a recycled PID is never mistaken for it."""

    pid: int
    create_time: float


class StageRecord(BaseModel):
    """stage.json: the processes of a started stage (written by the supervisor, refreshed as they change)."""

    pgid: int = Field(description="the stage's process group (= session) id, its bash's PID")
    leader: ProcessId
    started: str
    processes: list[ProcessId] = Field(
        default_factory=list, description="every descendant seen, incl. torchrun workers in own sessions"
    )


class JobProgress(BaseModel):
    """progress.json of a job run: the latest facts parsed from its log."""

    phase: str = Field(default="starting", description="starting | extracting | training | sampling | done")
    iteration: int | None = None
    total: int | None = None
    last_loss: float | None = Field(default=None, description="last logged loss (None when it was nan/inf)")
    first_loss: float | None = None
    step_time_ms: float | None = None
    eta_s: float | None = Field(default=None, description="seconds left at the logged pace")
    extract_done: int | None = Field(default=None, description="extraction: samples finished")
    extract_total: int | None = None
    samples_per_s: float | None = None
    checkpoint: str | None = Field(default=None, description="last checkpoint saved")
    outputs: list[str] = Field(default_factory=list, description="sample: files written")
    message: str = Field(default="", description="last notable log line")
    updated: str | None = None


class RootCause(BaseModel):
    """The diagnosis of a failed run, compact: what broke and how to fix it."""

    category: Category
    rule_id: str
    title: str
    cause: str
    fixes: list[Fix]
    evidence: list[str] = Field(default_factory=list, description="first matching log lines")


class JobReport(BaseModel):
    """report.json of a job run, written once, atomically, when the stage is over."""

    status: EndState
    exit_code: int | None = Field(description="bash's exit status; negative: killed by that signal")
    stopped_by: StoppedBy | None = None
    message: str
    progress: JobProgress
    root_cause: RootCause | None = None
    leftover_killed: list[int] = Field(
        default_factory=list, description="stage processes still alive after it ended, then stopped"
    )
    finished: str
    duration_s: float


class JobStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: RunId = Field(description="id from extract_features/launch_training/convert")
    log_lines: int = Field(default=20, ge=0, le=500, description="last lines of the log to include")


class JobStatus(BaseModel):
    """One run (a job stage or a conversion) as `job_status` reports it."""

    run_id: str
    kind: str = Field(description="extract | train | sample | convert")
    state: JobState = Field(
        description="killed: the supervisor/worker is gone without a report (signal, OOM killer, reboot)"
    )
    stage: Stage | None = None
    job_dir: str | None = None
    runtime: Runtime | None = None
    iteration: int | None = Field(default=None, description="last training iteration logged")
    total: int | None = Field(default=None, description="total training iterations")
    last_loss: float | None = None
    step_time_ms: float | None = None
    eta_s: float | None = Field(default=None, description="seconds left at the logged pace")
    extract_done: int | None = Field(default=None, description="extraction: samples finished")
    extract_total: int | None = None
    progress: RunProgress = Field(description="done/total/message (conversions; jobs mirror the above)")
    message: str = ""
    exit_code: int | None = None
    root_cause: RootCause | None = None
    report: dict[str, Any] | None = Field(default=None, description="the final report, when done")
    master_port: int | None = None
    supervisor_pid: int
    pgid: int | None = None
    pids: list[int] = Field(default_factory=list, description="processes of the run still alive")
    orphans: list[int] = Field(
        default_factory=list,
        description="stage processes still running although the supervisor is gone (state killed): they "
        "keep the job's lock until stop_job stops them",
    )
    started: str
    finished: str | None = None
    run_dir: str
    log: str
    log_tail: list[str] = Field(default_factory=list)
    stop_hint: str | None = None


class JobList(BaseModel):
    runs_dir: str
    jobs: list[JobStatus] = Field(description="newest first")


class TailRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: RunId
    lines: int = Field(default=40, ge=1, le=500, description="last lines of the log (at most 500)")


class LogTail(BaseModel):
    run_id: str
    log: str
    lines: list[str]
    size_bytes: int = Field(description="size of the log when read (the lines end there)")


class StopJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: RunId
    confirm: bool = Field(default=False, description="false: dry run (say what would be signalled)")
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="wait after SIGTERM before SIGKILL")


class StopTarget(BaseModel):
    """What the one stop tool takes: a run (its processes) or a process, as `mm-agent stop RUN_ID|PID` does."""

    model_config = ConfigDict(extra="forbid")

    run_id: RunId | None = Field(default=None, description="a run (extract, train, sample, convert)")
    pid: int | None = Field(default=None, ge=1, description="or a process mm-agent started (mm-agent ps)")
    confirm: bool = False
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="wait after SIGTERM before SIGKILL")

    @model_validator(mode="after")
    def _one_target(self) -> StopTarget:
        if (self.run_id is None) == (self.pid is None):
            raise ValueError("give exactly one of run_id (a run) or pid (a process mm-agent started)")
        return self


class StopJobResult(BaseModel):
    run_id: str
    status: Literal["dry_run", "stopped", "not_running"]
    targets: list[int] = Field(default_factory=list, description="PIDs signalled (or that would be)")
    commands: list[str] = Field(default_factory=list, description="their command lines")
    killed: list[int] = Field(default_factory=list, description="PIDs that needed SIGKILL")
    state: JobState | None = Field(default=None, description="the run's state afterwards")
    message: str

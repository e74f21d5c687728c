"""Whose run a live process is: the run (and the workspace that started it) among mm-agent's recorded runs.

Every mm-agent server and CLI of a user shares one state directory (`runs.runs_dir`), so a process mm-agent
started may belong to a run of another workspace. The stale-process check must not blame the workspace it
serves for it, nor offer to stop it; it names whose it is. A process belongs to a run when it, or one of its
ancestors, is one the run recorded and still the same process (PID and start time): the run's worker (job
supervisor) from run.json, its stage's leader and every descendant the supervisor wrote into stage.json
(torchrun's workers run in sessions of their own, so a parent chain alone may not lead to the supervisor).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import psutil
from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.jobs.schema import STAGE_FILE, StageRecord
from mm_agent.procs import CREATE_TIME_TOLERANCE_S
from mm_agent.runs import META, RunMeta, check_owner, read_json, runs_dir


@dataclass(frozen=True)
class RunOwner:
    meta: RunMeta

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    def whose(self) -> str:
        """Who started the run: a server's workspace, or the CLI (in which folder)."""
        if self.meta.workspace is not None:
            return f"workspace {self.meta.workspace}"
        return "the CLI" + (f", in {self.meta.cwd}" if self.meta.cwd else "")

    def serves(self, root: Path) -> bool:
        """Whether the server on workspace `root` answers for this run (`runs.check_owner`)."""
        try:
            check_owner(self.meta, root)
        except MMAgentError:
            return False
        return True


def run_processes() -> dict[int, tuple[float | None, RunOwner]]:
    """PID -> (recorded start time, run) for every process a run recorded (live or not: matched at use)."""
    base = runs_dir()
    table: dict[int, tuple[float | None, RunOwner]] = {}
    if not base.is_dir():
        return table
    for run_dir in base.iterdir():
        try:
            meta = RunMeta.model_validate(read_json(run_dir / META))
        except ValidationError:
            continue  # not a run (or half written)
        owner = RunOwner(meta)
        table.setdefault(meta.pid, (meta.create_time, owner))
        raw = read_json(run_dir / STAGE_FILE)
        if raw is None:
            continue
        with contextlib.suppress(ValidationError):
            stage = StageRecord.model_validate(raw)
            for recorded in (stage.leader, *stage.processes):
                table.setdefault(recorded.pid, (recorded.create_time, owner))
    return table


def owner_of(pid: int, table: dict[int, tuple[float | None, RunOwner]]) -> RunOwner | None:
    """The run `pid` (or its nearest recorded ancestor) belongs to; None for a process no run recorded."""
    try:
        proc = psutil.Process(pid)
        chain = [proc, *proc.parents()]
    except psutil.Error:
        return None
    for member in chain:
        hit = table.get(member.pid)
        if hit is None:
            continue
        started, owner = hit
        try:
            same = started is None or abs(member.create_time() - started) <= CREATE_TIME_TOLERANCE_S
        except psutil.Error:
            same = False
        if same:
            return owner
    return None

"""`python -m mm_agent.jobs.supervise RUN_DIR`: run one job stage and stand watch over it.

The stage (`bash <script>` with the launcher's env) runs in a new session, so its process group can be
signalled as a whole without touching anything else. Its output goes straight to run.log (a supervisor
that dies does not take the job with it); the supervisor follows that file:
  * progress.json: iteration/loss/ETA or extraction counts, replaced atomically at most every 0.5 s;
  * the watchdog: the log diagnoser (`diagnose.follow.Follower`) on the same file; the first primary
    fatal signature (an HCCL bind error, an OOM, a missing file) fails the run with that root cause and
    stops the stage at once, instead of leaving the other ranks to hang in a collective for 30 minutes;
  * stage.json: every process of the stage. torchrun starts its workers in sessions of their own, so a
    group signal alone misses them; the supervisor is a child subreaper (Linux), so workers orphaned by
    a dying torchrun are re-parented to it and still found, and their (PID, start time) are recorded so
    `stop_job` can verify and stop them even when the supervisor is gone;
  * stop.json, written by `stop_job`: the run ends as "stopped", not "failed".
When the stage's bash exits, leftover processes are stopped too (a worker that outlives a failed job
holds the NPU), and report.json is written atomically, last.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import FrameType

import psutil

from mm_agent import procs
from mm_agent.diagnose.follow import Follower
from mm_agent.diagnose.schema import DiagnosisReport
from mm_agent.jobs.progress import ProgressParser
from mm_agent.jobs.schema import (
    STAGE_FILE,
    STOP_FILE,
    EndState,
    JobProgress,
    JobReport,
    JobRequest,
    ProcessId,
    RootCause,
    StageRecord,
    StoppedBy,
)
from mm_agent.runs import LOG, PROGRESS, REPORT, REQUEST, utc_now, write_json_atomic

POLL_S = 0.25
PROCESS_SCAN_EVERY = 4  # polls between process-table walks (stage.json, orphan reaping)
PROGRESS_EVERY_S = 0.5
READ_CHUNK = 1 << 20
MAX_EVIDENCE = 3
_PR_SET_CHILD_SUBREAPER = 36


def root_cause(report: DiagnosisReport) -> RootCause | None:
    finding = report.root_cause
    if finding is None:
        return None
    return RootCause(
        category=finding.category,
        rule_id=finding.rule_id,
        title=finding.title,
        cause=finding.cause,
        fixes=finding.fixes,
        evidence=[e.text for e in finding.evidence[:MAX_EVIDENCE]],
    )


def _become_subreaper() -> None:
    """Orphaned descendants (workers of a killed torchrun) are re-parented to us, not to init (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class LogReader:
    """Reads what was appended to the log since the last call and hands over whole lines."""

    def __init__(self, path: Path, parser: ProgressParser) -> None:
        self.path = path
        self.parser = parser
        self.offset = 0
        self.partial = b""

    def poll(self, final: bool = False) -> bool:
        changed = False
        with contextlib.suppress(OSError), self.path.open("rb") as fh:
            fh.seek(self.offset)
            while data := fh.read(READ_CHUNK):
                self.offset += len(data)
                lines = (self.partial + data).replace(b"\r", b"\n").split(b"\n")
                self.partial = lines.pop()
                for raw in lines:
                    changed |= self.parser.line(raw.decode("utf-8", "replace"))
        if final and self.partial:
            changed |= self.parser.line(self.partial.decode("utf-8", "replace"))
            self.partial = b""
        return changed


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.req = JobRequest.model_validate_json((run_dir / REQUEST).read_text(encoding="utf-8"))
        self.log = run_dir / LOG
        self.parser = ProgressParser(self.req.stage)
        self.reader = LogReader(self.log, self.parser)
        self.me = psutil.Process()
        self.stopped_by: StoppedBy | None = None
        self.cause: RootCause | None = None
        self.terminated = False  # SIGTERM/SIGINT to the supervisor itself
        self.record: StageRecord | None = None
        self.last_progress = 0.0

    # -- signals and files ------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.terminated = True  # handled in the loop: stop the stage, then report

    def _note(self, text: str) -> None:
        with self.log.open("a", encoding="utf-8") as fh:
            fh.write(f"[mm-agent] {text}\n")

    def _write_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_progress >= PROGRESS_EVERY_S:
            self.parser.progress.updated = utc_now()
            write_json_atomic(self.run_dir / PROGRESS, self.parser.progress)
            self.last_progress = now

    def _descendants(self) -> list[psutil.Process]:
        try:
            return [p for p in self.me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    def _refresh_record(self) -> None:
        assert self.record is not None
        seen = {p.pid: p.create_time for p in self.record.processes}
        for proc in self._descendants():
            with contextlib.suppress(psutil.Error):
                seen.setdefault(proc.pid, proc.create_time())
        if len(seen) != len(self.record.processes):
            self.record.processes = [ProcessId(pid=k, create_time=v) for k, v in sorted(seen.items())]
            write_json_atomic(self.run_dir / STAGE_FILE, self.record)

    def _reap_orphans(self, leader: int) -> None:
        """Orphans re-parented to us are our children: collect them when they exit (never the leader,
        whose exit status Popen must get)."""
        with contextlib.suppress(psutil.Error):
            for child in self.me.children():
                if child.pid != leader and child.status() == psutil.STATUS_ZOMBIE:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(child.pid, os.WNOHANG)

    def _stop_stage(self, why: str) -> list[int]:
        assert self.record is not None
        self._note(f"{why}: stopping the stage (SIGTERM, SIGKILL after {self.req.stop_grace_s:g} s)")
        result = procs.stop_group(
            self.record.pgid, self.record.leader.create_time, self._descendants(), self.req.stop_grace_s
        )
        return result.killed

    # -- the run ----------------------------------------------------------------------------------------

    def run(self) -> int:
        _become_subreaper()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        start = time.monotonic()
        self._write_progress(force=True)
        env = {**os.environ, **self.req.env}
        shown = " ".join(f"{k}={v}" for k, v in sorted(self.req.env.items()) if k != "PYTHONUNBUFFERED")
        self._note(f"{self.req.stage}: bash {self.req.script} ({shown or 'no env overrides'})")
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                self.req.argv,
                cwd=self.req.job_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        leader = psutil.Process(proc.pid)
        self.record = StageRecord(
            pgid=proc.pid,
            leader=ProcessId(pid=proc.pid, create_time=leader.create_time()),
            started=utc_now(),
            processes=[],
        )
        write_json_atomic(self.run_dir / STAGE_FILE, self.record)
        try:
            report = self._watch(proc, start)
        except Exception:  # a supervisor bug must not leave the stage running unwatched
            self._note(f"supervisor error:\n{traceback.format_exc()}")
            killed = self._stop_stage("supervisor error")
            report = JobReport(
                status="failed",
                exit_code=proc.poll(),
                message=f"the mm-agent supervisor failed (traceback in {self.log}); the stage was stopped",
                progress=self.parser.progress,
                leftover_killed=killed,
                finished=utc_now(),
                duration_s=round(time.monotonic() - start, 2),
            )
        self._write_progress(force=True)
        write_json_atomic(self.run_dir / REPORT, report)
        self._note(f"{report.status}: {report.message}")
        return 0

    def _watch(self, proc: subprocess.Popen[bytes], start: float) -> JobReport:
        follower = Follower([str(self.log)], None, None, MAX_EVIDENCE)
        polls = 0
        while proc.poll() is None:
            if self.reader.poll():
                self._write_progress()
            follower.poll()
            # A requested stop wins over the watchdog: the signals it sends reach the log as death
            # signals, which must not turn a stop into a failure.
            if self.stopped_by is None and (self.terminated or (self.run_dir / STOP_FILE).exists()):
                self.stopped_by = "user"
                self._stop_stage("stop requested")
            elif self.stopped_by is None and follower.ctx.seen("primary", "fatal"):
                self.cause = root_cause(follower.report("watchdog: stopped at the first fatal root cause"))
                self.stopped_by = "watchdog"
                title = self.cause.title if self.cause else "a fatal error"
                self._stop_stage(f"watchdog: {title}")
            if polls % PROCESS_SCAN_EVERY == 0:  # a process-table walk: not every poll
                self._refresh_record()
                self._reap_orphans(proc.pid)
            polls += 1
            time.sleep(POLL_S)
        exit_code = proc.returncode
        leftovers = [p for p in self._descendants() if p.pid != proc.pid]
        killed: list[int] = []
        if leftovers:
            self._note(
                f"{len(leftovers)} stage process(es) outlived the script: {[p.pid for p in leftovers]}"
            )
            killed = self._stop_stage("cleanup")
        if self.stopped_by is None and (self.terminated or (self.run_dir / STOP_FILE).exists()):
            self.stopped_by = "user"
        self.reader.poll(final=True)
        follower.poll()
        return self._report(exit_code, follower, killed, time.monotonic() - start)

    def _report(self, exit_code: int, follower: Follower, killed: list[int], seconds: float) -> JobReport:
        p = self.parser.progress
        status: EndState
        if self.stopped_by == "watchdog":
            status = "failed"
            message = (
                f"watchdog stopped the job: {self.cause.title if self.cause else 'fatal error in the log'}"
            )
        elif self.stopped_by == "user":
            status, message = "stopped", "stopped on request (mm-agent stop)"
        elif exit_code == 0:
            status, message = "succeeded", _success(self.req.stage, p)
            p.phase = "done"
        else:
            status = "failed"
            self.cause = root_cause(follower.report(f"stage exited with {exit_code}"))
            what = self.cause.title if self.cause else "no known failure signature in the log; read its tail"
            message = f"the {self.req.stage} script exited with {_exit(exit_code)}: {what}"
        return JobReport(
            status=status,
            exit_code=exit_code,
            stopped_by=self.stopped_by,
            message=message,
            progress=p,
            root_cause=self.cause,
            leftover_killed=killed,
            finished=utc_now(),
            duration_s=round(seconds, 2),
        )


def _exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _success(stage: str, p: JobProgress) -> str:
    if stage == "train" and p.iteration is not None:
        loss = f", loss {p.last_loss:.4g}" if p.last_loss is not None else ""
        return f"training finished at iteration {p.iteration}/{p.total}{loss}"
    if stage == "extract" and p.extract_done is not None:
        return f"feature extraction finished: {p.extract_done}/{p.extract_total} samples"
    if stage == "sample" and p.outputs:
        return f"{len(p.outputs)} sample(s) written: {', '.join(p.outputs[:3])}"
    return f"the {stage} script exited with code 0"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mm_agent.jobs.supervise RUN_DIR", file=sys.stderr)
        return 2
    return Supervisor(Path(args[0])).run()


if __name__ == "__main__":
    sys.exit(main())

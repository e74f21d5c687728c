"""`python -m mm_agent.convert.worker RUN_DIR`: one conversion, in its own process, reporting as it goes.

The MCP server and the CLI never import torch; this process does. It reads `request.json` (and the
`plan.json` the caller already checked), converts natively with the engine or runs mm-convert, keeps
`progress.json` current (replaced atomically, at most every 0.2 s) and ends by writing `report.json`. Any
failure becomes a report with status "failed" and the error text with its fix; the traceback of an
unexpected error goes to the run log, never into the report. A worker killed by a signal writes no
report, which is how `run_status` tells "killed" from "failed".
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType

from mm_agent.convert import PLAN
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest
from mm_agent.errors import MMAgentError
from mm_agent.runs import LOG, PROGRESS, REPORT, REQUEST, utc_now, write_json_atomic

MIN_INTERVAL_S = 0.2


class ProgressFile:
    """The engine's progress callback. Calls only record the state (a per-tensor callback stays cheap); a
    thread writes progress.json when it changed, at most every MIN_INTERVAL_S, so the file never lags
    behind a long step by more than that."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._state = (0, 0, "")
        self._dirty = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()

    def __call__(self, done: int, total: int, message: str) -> None:
        with self._lock:
            self._state = (done, total, message)
            self._dirty = True

    def _run(self) -> None:
        while not self._stop.wait(MIN_INTERVAL_S):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            done, total, message = self._state
            self._dirty = False
            write_json_atomic(
                self.path, {"done": done, "total": total, "message": message, "updated": utc_now()}
            )

    def finish(self, status: str) -> None:
        """Last word: the report's status (a finished run shows all steps done unless it failed)."""
        with self._lock:
            done, total, _ = self._state
            self._state = (done if status == "failed" else max(done, total), total, status)
            self._dirty = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()


def _plan(run_dir: Path, req: ConvertRequest) -> ConvertPlan:
    """The plan the caller checked; a bare one (enough for a failure report) if it is missing."""
    path = run_dir / PLAN
    if path.is_file():
        return ConvertPlan.model_validate_json(path.read_text(encoding="utf-8"))
    return ConvertPlan(
        native=False,
        converter=req.converter,
        method=req.method,
        source=req.source,
        target=req.target,
        mm_convert_argv=[],
        notes=[f"{PLAN} was missing from the run dir"],
    )


def _convert(req: ConvertRequest, plan: ConvertPlan, run_dir: Path, progress: ProgressFile) -> ConvertReport:
    from mm_agent.convert.plan import is_native

    if is_native(req):
        progress(0, 0, "loading torch")
        from mm_agent.convert.engine import execute

        return execute(req, progress)
    from mm_agent.convert.upstream import plan_upstream, run_upstream

    if not plan.mm_convert_argv:
        plan = plan_upstream(req)
    return run_upstream(req, plan, run_dir / LOG, progress)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (`mm-agent stop`) unwinds like an exception so the engine's cleanup runs; still no report."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mm_agent.convert.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    signal.signal(signal.SIGTERM, _on_sigterm)
    req = ConvertRequest.model_validate_json((run_dir / REQUEST).read_text(encoding="utf-8"))
    plan = _plan(run_dir, req)
    progress = ProgressFile(run_dir / PROGRESS)
    progress(0, 0, "starting")
    progress.flush()
    print(f"mm-agent convert {req.converter} {req.method}: {req.source} -> {req.target}", flush=True)
    try:
        report = _convert(req, plan, run_dir, progress)
    except MMAgentError as exc:
        print(f"error: {exc.render()}", flush=True)
        report = ConvertReport(status="failed", plan=plan, message=exc.render())
    except Exception as exc:  # the report must exist whatever broke; the log keeps the traceback
        traceback.print_exc()
        report = ConvertReport(
            status="failed",
            plan=plan,
            message=f"{type(exc).__name__}: {exc}\nfix: this is unexpected; the traceback is in {run_dir / LOG} "
            "(report it with that log if the inputs look right)",
        )
    report.run_id = run_dir.name
    progress.finish(report.status)
    progress.close()
    write_json_atomic(run_dir / REPORT, report)
    print(f"{report.status}: {report.message}", flush=True)
    return 1 if report.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())

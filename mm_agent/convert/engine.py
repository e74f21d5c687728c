"""`execute`: run one native conversion in this process and return its report.

Called by the conversion worker (`python -m mm_agent.convert.worker`), never by the MCP server: the
converter modules import torch when they run. The plan is recomputed here (the source may have changed
since the dry run) and refused when the estimate does not fit; peak anonymous memory is sampled while the
converter runs so the report shows what streaming actually cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from mm_agent.convert.plan import converter_module, is_native, plan_conversion, require_fit
from mm_agent.convert.schema import ConvertReport, ConvertRequest
from mm_agent.errors import MMAgentError, os_error

Progress = Callable[[int, int, str], None]


def execute(req: ConvertRequest, progress: Progress | None = None) -> ConvertReport:
    """Convert natively: plan (validating), check resources, run the converter method, optionally verify."""
    if not is_native(req):
        raise MMAgentError(
            f"{req.converter}.{req.method} has no native implementation",
            field="method",
            fix="run it through convert_weights, which uses MindSpeed-MM's mm-convert for it",
        )
    plan = plan_conversion(req)
    require_fit(plan)
    if req.verify:  # refuse before converting rather than convert and then not verify
        from mm_agent.convert import verify

        verify.require_fit(req)
    method = getattr(converter_module(req.converter), req.method)
    started = time.monotonic()
    with AnonPeak() as peak:
        try:
            report: ConvertReport = method(req, plan, progress or _quiet)
        except OSError as exc:  # a full disk, a vanished or unreadable file: in words, with the fix
            raise os_error(exc, file=str(exc.filename) if exc.filename else req.target) from exc
    report = report.model_copy(
        update={"seconds": round(time.monotonic() - started, 3), "peak_rss_bytes": peak.bytes}
    )
    if req.verify and report.status in ("converted", "unchanged"):
        from mm_agent.convert.verify import verify_conversion

        report = report.model_copy(update={"verify": verify_conversion(req, report)})
    return report


def _quiet(done: int, total: int, message: str) -> None:
    """Default progress sink."""


def rss_anon() -> int | None:
    """This process's anonymous resident memory (Linux RssAnon); page cache and file mappings excluded."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class AnonPeak:
    """Samples `rss_anon` every 20 ms in a thread while the block runs; `bytes` is the maximum seen."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.bytes: int | None = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        now = rss_anon()
        if now is not None:
            self.bytes = max(self.bytes or 0, now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

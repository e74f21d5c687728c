"""Training progress from Megatron iteration lines, without parsing every one of them.

A 1 GB log holds millions of ` iteration N/T | ... | loss: x |` lines (reference §5.6). Per block the
tracker looks at a handful of them, found with `bytes.find`/`rfind` at evenly spaced offsets: the last one
gives iteration/total, loss and step time, the spread gives a loss trend over the whole run. Checkpoint
saves are counted with `bytes.count`; non-zero `number of nan iterations` lines are rare, so the scanner
hands them over as hit lines (`NAN_TRIGGER` is part of its prefilter).
"""

from __future__ import annotations

import math
import re

from mm_agent.diagnose.schema import LossTrend, Progress

_MARK = b" iteration "
_ITER = re.compile(rb" iteration +(\d+)/ *(\d+) *\|")
_LOSS = re.compile(rb"\bloss: *([-+0-9.eE]+|nan|inf|-inf)\b", re.IGNORECASE)
_STEP = re.compile(rb"elapsed time per iteration \(ms\): *([0-9.]+)")
_NAN = re.compile(r"number of nan iterations: *(\d+)")
_SAVED = b"successfully saved checkpoint"
NAN_TRIGGER = "number of nan iterations: *[1-9]"

MAX_TRIES = 8  # " iteration " inside other lines tried per spot before giving up
SPOTS = 4  # evenly spaced samples per block, plus the block's last iteration line
MAX_SAMPLES = 512
FLAT_BAND = 0.05  # relative change of the loss below which the trend is "flat"


def _float(raw: bytes) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


class ProgressTracker:
    """Accumulates the progress summary over every block of every input, in input order."""

    def __init__(self) -> None:
        self.iteration: int | None = None
        self.total: int | None = None
        self.last_loss: float | None = None
        self.first_loss: float | None = None
        self.step_ms: float | None = None
        self.nan_iterations = 0
        self.saved = 0
        self.losses: list[float] = []
        self._seen = -1  # start of the iteration line parsed last in this block

    def _line(self, buf: bytes, at: int, end: int) -> int:
        """Parse the iteration line around offset `at`; its start offset, or -1 when it is not one."""
        start = buf.rfind(b"\n", 0, at) + 1
        stop = buf.find(b"\n", at, end)
        line = buf[start : stop if stop >= 0 else end][:4096]
        m = _ITER.search(line)
        if not m:
            return -1
        self.iteration, self.total = int(m.group(1)), int(m.group(2))
        loss = _LOSS.search(line)
        value = _float(loss.group(1)) if loss else None
        if value is not None:
            self.last_loss = value
            if math.isfinite(value):
                if self.first_loss is None:
                    self.first_loss = value
                self.losses.append(value)
        step = _STEP.search(line)
        if step:
            self.step_ms = _float(step.group(1))
        return start

    def _sample(self, buf: bytes, at: int, start: int, end: int, backwards: bool) -> int:
        """Parse the nearest real iteration line from `at` on (or back from it); its start, or -1."""
        for _ in range(MAX_TRIES):
            at = buf.rfind(_MARK, start, at) if backwards else buf.find(_MARK, at, end)
            if at < 0:
                return -1
            line_start = buf.rfind(b"\n", 0, at) + 1
            if line_start == self._seen:
                return line_start
            found = self._line(buf, at, end)
            if found >= 0:
                self._seen = found
                return found
            at = at if backwards else at + len(_MARK)
        return -1

    def block(self, buf: bytes, start: int, end: int) -> None:
        """Sample the iteration lines of `buf[start:end]` (whole lines only)."""
        self.saved += buf.count(_SAVED, start, end)
        self._seen = -1
        size = end - start
        for spot in range(SPOTS):
            self._sample(buf, start + size * spot // SPOTS, start, end, backwards=False)
        self._sample(buf, end, start, end, backwards=True)
        if len(self.losses) > MAX_SAMPLES:
            self.losses = self.losses[::2]

    def nan_line(self, line: str) -> None:
        """A hit line from the prefilter's `NAN_TRIGGER`: add its nan-iteration count."""
        m = _NAN.search(line)
        if m:
            self.nan_iterations += int(m.group(1))

    def trend(self) -> LossTrend:
        if len(self.losses) < 2:
            return "unknown"
        k = max(1, len(self.losses) // 3)
        head = sum(self.losses[:k]) / k
        tail = sum(self.losses[-k:]) / k
        change = (tail - head) / max(abs(head), 1e-12)
        if change < -FLAT_BAND:
            return "decreasing"
        if change > FLAT_BAND:
            return "increasing"
        return "flat"

    def summary(self) -> Progress:
        return Progress(
            iteration=self.iteration,
            total_iterations=self.total,
            first_loss=self.first_loss,
            last_loss=self.last_loss,
            loss_trend=self.trend(),
            step_time_ms=self.step_ms,
            nan_iterations=self.nan_iterations,
            checkpoints_saved=self.saved,
        )

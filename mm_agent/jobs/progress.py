"""Job progress from the lines a stage prints (contract C2, the lines MindSpeed-MM itself prints).

Training: the Megatron iteration line (` iteration N/ T | ... elapsed time per iteration (ms): X | ...
loss: L | ...`) gives iteration/total, step time, loss and so the ETA; checkpoint saves and
`training finished` mark the rest. Extraction: `Starting feature extraction. Total samples: N` and the
per-sample `feature extraction progress: D/T samples | R samples/s | ETA S s`. Sampling: `saved sample
to PATH`. Lines are parsed one at a time as the supervisor reads the log; only a few regexes run and only
on lines that contain their marker, so a chatty log costs little.
"""

from __future__ import annotations

import math
import re

from mm_agent.jobs.schema import JobProgress, Stage

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_LOSS = re.compile(r"\|\s*(?:lm )?loss:\s*([-+0-9.eE]+|nan|-?inf)\b", re.IGNORECASE)
_STEP = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_EXTRACT = re.compile(
    r"feature extraction progress:\s*(\d+)\s*/\s*(\d+)\s*samples"
    r"(?:\s*\|\s*([0-9.]+)\s*samples/s)?(?:\s*\|\s*ETA\s*([0-9.]+)\s*s)?"
)
_EXTRACT_TOTAL = re.compile(r"Starting feature extraction\. Total samples:\s*(\d+)")
_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+)\s+to\s+(\S+)")
_SAMPLE = re.compile(r"saved sample to (\S.*)$")
_NOTABLE = (
    "building ",
    "loading ",
    "successfully loaded checkpoint",
    "saving checkpoint",
    "training finished",
    "Starting feature extraction",
    "Feature extraction completed",
    "Feature extraction failed",
    "error:",
)
MESSAGE_CHARS = 240
MAX_OUTPUTS = 100


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class ProgressParser:
    """Feed log lines; `progress` holds what they said so far."""

    def __init__(self, stage: Stage) -> None:
        self.progress = JobProgress()
        self.stage = stage

    def line(self, text: str) -> bool:
        """Parse one line; whether the progress changed."""
        p = self.progress
        if "iteration" in text and (m := _ITER.search(text)):
            p.phase = "training"
            p.iteration, p.total = int(m.group(1)), int(m.group(2))
            loss = _LOSS.search(text)
            if loss:
                p.last_loss = _float(loss.group(1))
                if p.first_loss is None and p.last_loss is not None:
                    p.first_loss = p.last_loss
            step = _STEP.search(text)
            if step:
                p.step_time_ms = _float(step.group(1))
            if p.step_time_ms is not None:
                p.eta_s = round(max(0, p.total - p.iteration) * p.step_time_ms / 1000, 2)
            return True
        if "feature extraction" in text.lower():
            if m := _EXTRACT.search(text):
                p.phase = "extracting"
                p.extract_done, p.extract_total = int(m.group(1)), int(m.group(2))
                p.samples_per_s = _float(m.group(3)) if m.group(3) else p.samples_per_s
                p.eta_s = _float(m.group(4)) if m.group(4) else p.eta_s
                return True
            if m := _EXTRACT_TOTAL.search(text):
                p.phase = "extracting"
                p.extract_total, p.extract_done = int(m.group(1)), p.extract_done or 0
        if "saved" in text:
            if m := _SAVED.search(text):
                p.checkpoint = m.group(2)
            elif self.stage == "sample" and (m := _SAMPLE.search(text)):
                p.phase = "sampling"
                if len(p.outputs) < MAX_OUTPUTS:
                    p.outputs.append(m.group(1).strip())
        if any(marker in text for marker in _NOTABLE) or "saved sample" in text:
            p.message = text.strip()[:MESSAGE_CHARS]
            if "training finished" in text or "Feature extraction completed" in text:
                p.eta_s = 0.0
            return True
        return False

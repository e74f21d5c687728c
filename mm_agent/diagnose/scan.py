"""Streaming scan: one RE2 union of every catalog trigger over whole blocks, Python regexes on hit lines only.

Blocks of bytes are searched as they come (the partial last line is carried to the next block), so memory
stays bounded whatever the log size. Only for a line the union hits is the line cut out, decoded with
replacement, and matched against the signatures whose triggers fire on it (`prefilter.py`). `\\r` ends a
line for matching (progress bars), `\\n` alone counts lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mm_agent.diagnose.catalog import CompiledSignature, match_line
from mm_agent.diagnose.prefilter import Prefilter
from mm_agent.diagnose.progress import ProgressTracker
from mm_agent.diagnose.ranks import rank_of_line
from mm_agent.diagnose.schema import Evidence
from mm_agent.diagnose.stamps import Stamp, find_stamp, full_year

LINE_CAP = 64 * 1024  # bytes of one line kept for matching (a window around the hit in longer lines)
MAX_CARRY = 16 * 1024 * 1024  # a line longer than this is matched in pieces
LOOKBACK = 16 * 1024  # bytes searched back for the timestamp of a hit line that has none
EVIDENCE_CHARS = 500
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_NAN_MARK = b"nan iterations"
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass
class Hit:
    """One evidence line of a rule, with its place in time (or in file order when no time is known)."""

    key: tuple[int, datetime, int, int]
    stamp: Stamp | None
    evidence: Evidence
    groups: dict[str, str]
    details: list[Evidence] = field(default_factory=list)  # the detail lines right after it (`fix: ...`)


@dataclass
class RuleHits:
    """Everything kept about one signature: a count, the ranks, and the earliest few lines (bounded)."""

    entry: CompiledSignature
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    hits: list[Hit] = field(default_factory=list)

    def offer(self, hit: Hit, keep: int) -> None:
        self.hits.append(hit)
        self.hits.sort(key=lambda h: h.key)
        del self.hits[keep:]


@dataclass
class _Open:
    """A hit whose detail lines may still follow (`file:`/`field:`/`fix:` after `error:`)."""

    entry: CompiledSignature
    hit: Hit
    rank: int | None
    next_line: int
    counted: bool


def order_key(stamp: Stamp | None, file_index: int, line: int) -> tuple[int, datetime, int, int]:
    """Time order where the log says the time, file order otherwise (after every timed line)."""
    if stamp is None:
        return (1, datetime.min, file_index, line)
    return (0, stamp.at, file_index, line)


class ScanContext:
    """State shared by every input of one diagnosis: catalog, findings so far, progress, counters."""

    def __init__(self, catalog: Sequence[CompiledSignature], max_evidence: int):
        self.prefilter = Prefilter(catalog)
        self.max_evidence = max_evidence
        self.rules: dict[str, RuleHits] = {}
        # (claimed rule, group, value) -> the rule whose line named that value first (its symptom's owner)
        self.claimed: dict[tuple[str, str, str], CompiledSignature] = {}
        self.progress = ProgressTracker()
        self.files: list[str] = []
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self.lines = 0
        self.bytes = 0
        self.ref_year: int | None = None

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 50:
            self.notes.append(text)

    def seen(self, role: str, effect: str) -> bool:
        return any(r.entry.sig.role == role and r.entry.sig.effect == effect for r in self.rules.values())


class FileScan:
    """Incremental scan of one input: `feed()` bytes as they arrive, `finish()` at the end."""

    def __init__(self, ctx: ScanContext, name: str, index: int, path_rank: int | None, year: int):
        self.ctx = ctx
        self.name = name
        self.index = index
        self.path_rank = path_rank
        self.year = year  # for year-less timestamps until some log line states one
        self.carry = b""
        self.lines = 0  # newlines before `carry`
        self.tail = b""  # end of the previous block, for timestamp look-back
        self.last_stamp: Stamp | None = None
        self.taken: dict[str, int] = {}
        self.long_line_noted = False
        self.open: _Open | None = None

    def feed(self, data: bytes) -> None:
        """Scan the whole lines in `data`; the partial last line waits for the next call (or `finish`)."""
        self.ctx.bytes += len(data)
        start = 0
        if self.carry:  # complete the carried line on its own, so the big block is never copied
            nl = data.find(b"\n")
            if nl < 0 and len(self.carry) + len(data) < MAX_CARRY:
                self.carry += data
                return
            head = self.carry + (data if nl < 0 else data[: nl + 1])
            self.carry = b""
            if nl < 0:
                self._long_line(self.lines + 1)
            self._block(head, 0, len(head))
            if nl < 0:
                return
            start = nl + 1
        cut = data.rfind(b"\n", start) + 1
        if cut <= start:
            if len(data) - start < MAX_CARRY:
                self.carry = data[start:]
                return
            cut = len(data)
            self._long_line(self.lines + 1)
        self._block(data, start, cut)
        self.carry = data[cut:]

    def finish(self) -> None:
        if self.carry:
            self._block(self.carry, 0, len(self.carry))
            self.ctx.lines += 1  # the last line has no newline
            self.carry = b""
        self.open = None

    def _long_line(self, line: int) -> None:
        if not self.long_line_noted:
            self.long_line_noted = True
            self.ctx.note(
                f"{self.name}:{line}: a line longer than {LINE_CAP // 1024} KiB was matched in a window around each hit"
            )

    def _block(self, buf: bytes, start: int, end: int) -> None:
        """Scan `buf[start:end]` (whole lines); bytes before `start` may only serve as timestamp look-back."""
        if buf.find(b"\x1b", start, end) >= 0:  # colour codes would split trigger words
            buf = _ANSI.sub(b"", buf[start:end])
            start, end = 0, len(buf)
        self.ctx.progress.block(buf, start, end)
        search = self.ctx.prefilter.search
        newlines = 0
        counted = pos = start
        while pos < end:
            m = search(buf, pos, end)
            if m is None:
                break
            at = m.start()
            line_start = max(start, buf.rfind(b"\n", start, at) + 1)
            line_start = max(line_start, buf.rfind(b"\r", line_start, at) + 1)
            line_end = buf.find(b"\n", at, end)
            line_end = end if line_end < 0 else line_end
            cr = buf.find(b"\r", at, line_end)
            line_end = line_end if cr < 0 else cr
            newlines += buf.count(b"\n", counted, line_start)
            counted = line_start
            self._hit(buf, line_start, line_end, at, self.lines + newlines + 1)
            pos = line_end + 1
        newlines += buf.count(b"\n", counted, end)
        self.lines += newlines
        self.ctx.lines += newlines
        self.tail = buf[max(start, end - LOOKBACK) : end]

    def _hit(self, buf: bytes, line_start: int, line_end: int, at: int, line: int) -> None:
        lo, hi = line_start, line_end
        if hi - lo > LINE_CAP:
            lo = max(line_start, at - LINE_CAP // 2)
            hi = min(line_end, lo + LINE_CAP)
            self._long_line(line)
        raw = buf[lo:hi]
        if _NAN_MARK in raw:
            self.ctx.progress.nan_line(raw.decode("utf-8", "backslashreplace"))
        candidates = self.ctx.prefilter.candidates(raw)
        if not candidates:
            return
        text = raw.decode("utf-8", "backslashreplace")  # bytes that are not UTF-8 as \xNN, as names are shown
        if self.open is not None and self._detail(self.open, text, line):
            return
        for entry, m in match_line(text, candidates, lambda: self._before(buf, line_start)):
            self._record(entry, m, text, line, buf, line_start, raw)

    def _before(self, buf: bytes, line_start: int) -> list[str]:
        """The lines of this file before a hit line (up to LOOKBACK bytes), oldest first, for the rules that
        need to know what the log said just before (a SIGKILL while the checkpoint loads)."""
        lo = line_start - LOOKBACK
        window = buf[max(0, lo) : line_start]
        if lo < 0 and self.tail:
            window = self.tail[lo:] + window
        lines = _LINE_END.split(window.decode("utf-8", "backslashreplace"))
        return lines[1:] if len(window) >= LOOKBACK else lines  # the first one may be cut

    def _detail(self, open_: _Open, text: str, line: int) -> bool:
        """Whether `line` is a detail line of the open hit (then its groups join the hit's)."""
        groups = open_.entry.detail(text) if line == open_.next_line else None
        if groups is None:
            self.open = None  # the lines right after the hit are over
            return False
        hit = open_.hit
        hit.groups.update({k: v for k, v in groups.items() if k not in hit.groups})
        if len(hit.details) < len(open_.entry.details):
            hit.details.append(Evidence(file=self.name, line=line, text=text[:EVIDENCE_CHARS].strip()))
        open_.next_line = line + 1
        if not open_.counted and set(open_.entry.sig.requires) <= hit.groups.keys():
            open_.counted = True
            self._count(open_.entry, open_.rank, hit)
        return True

    def _count(self, entry: CompiledSignature, rank: int | None, hit: Hit | None) -> None:
        rule = self.ctx.rules.get(entry.sig.id)
        if rule is None:
            rule = self.ctx.rules[entry.sig.id] = RuleHits(entry)
        rule.count += 1
        if rank is not None:
            rule.ranks.add(rank)
        if hit is not None:
            rule.offer(hit, self.ctx.max_evidence)

    def _record(
        self,
        entry: CompiledSignature,
        m: re.Match[str],
        text: str,
        line: int,
        buf: bytes,
        line_start: int,
        raw: bytes,
    ) -> None:
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        owner = next(
            (
                self.ctx.claimed[key]
                for name, value in groups.items()
                if (key := (entry.sig.id, name, value)) in self.ctx.claimed
            ),
            None,
        )
        if owner is not None:  # a symptom of an earlier line of another rule (the PID torchrun killed)
            entry = owner
        for claim in entry.sig.claims:
            if claim.group in groups:
                self.ctx.claimed.setdefault((claim.rule, claim.group, groups[claim.group]), entry)
        rule_id = entry.sig.id
        rank = rank_of_line(text, self.path_rank)
        taken = self.taken.get(rule_id, 0)
        if taken >= self.ctx.max_evidence and not entry.sig.requires:
            self._count(entry, rank, None)
            return
        stamp = self._stamp(buf, line_start, raw)
        start = max(0, m.start() - EVIDENCE_CHARS // 3) if len(text) > EVIDENCE_CHARS else 0
        evidence = Evidence(file=self.name, line=line, text=text[start : start + EVIDENCE_CHARS].strip())
        hit = Hit(order_key(stamp, self.index, line), stamp, evidence, groups)
        counted = set(entry.sig.requires) <= groups.keys()
        if counted:
            keep = taken < self.ctx.max_evidence
            if keep:
                self.taken[rule_id] = taken + 1
            self._count(entry, rank, hit if keep else None)
        if entry.sig.details:
            self.open = _Open(entry, hit, rank, line + 1, counted)

    def _stamp(self, buf: bytes, line_start: int, raw: bytes) -> Stamp | None:
        """The hit line's own timestamp, else the latest one shortly before it in this file; for a line
        before the file's first timestamp, the first one shortly after it (it happened no later)."""
        year = self.ctx.ref_year or self.year
        stamp = find_stamp(raw[:1024], year)
        if stamp is None:
            lo = line_start - LOOKBACK
            window = buf[max(0, lo) : line_start]
            if lo < 0 and self.tail:
                window = self.tail[lo:] + window
            stamp = find_stamp(window, year, last=True)
        if stamp is None:
            return self.last_stamp or find_stamp(buf[line_start : line_start + LOOKBACK], year)
        if self.ctx.ref_year is None:
            self.ctx.ref_year = full_year(stamp)
        self.last_stamp = stamp
        return stamp

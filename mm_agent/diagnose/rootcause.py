"""From per-rule hits to the report: pick the one root cause and order the rest by time.

The rule (catalog_plan.md): the earliest primary fatal finding wins over everything it causes; without
one, the earliest primary silent finding (random init, unconverted keys, nan loss: training went on but
is wrong); without one, the earliest secondary symptom, preferring one with a known category over a
generic wrapper (`unknown`: ChildFailedError, ERR0xxxx) that says only that something failed. Warnings
are listed but never the root cause, so a log with only warnings is healthy (`category: none`). A primary
finding whose `yields_to` rules were also seen counts as their symptom: a bare SIGKILL is the cause only
while the kernel's OOM-killer record is not among the inputs, whatever order the two were logged in; a
`command not found` only while no CRLF line endings were seen. Lines a rule `claims` (the `exitcode: -9`
of a PID torchrun itself SIGKILLed while tearing the workers down) were already counted as that rule's by
the scanner, a warning that is never the root cause. Noise (lines healthy runs print too) is listed and
never the root cause either. A finding whose rule `yields_to_earlier` a failure logged before it (a Ctrl-C
or scancel after the loss went NaN) is that failure's consequence, a symptom like the others.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from mm_agent.diagnose.scan import RuleHits, ScanContext
from mm_agent.diagnose.schema import DiagnosisReport, Finding, Fix
from mm_agent.redact import redact_model

_NAMED = re.compile(r"\{(\w+)\}")
GROUP_CHARS = 500  # a whole `fix:` line of the bundled runtime (long paths) fits, as in evidence


def fill(text: str, groups: dict[str, str], *, quote: bool = False) -> str:
    """Put `{name}` regex groups into catalog text; unknown names stay as written. With `quote` (a fix's
    command, which users paste into a shell) each group is one shell word: text taken from a log must never
    run as code (`No matching distribution found for x;touch${IFS}X`)."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in groups:
            return m.group(0)
        value = groups[m.group(1)][:GROUP_CHARS]
        return shlex.quote(value) if quote else value

    return _NAMED.sub(one, text)


def _after_failure(rule: RuleHits, rules: list[RuleHits], seen: set[str]) -> bool:
    """Whether a failure the rule `yields_to_earlier` was logged before its first line: a primary finding
    (a symptom such as a dead peer's closed connection may be logged before the kill that caused it) of one
    of those effects and of a category other than the rule's own (a second stop is no failure before the
    stop), itself not the symptom of something seen."""
    sig = rule.entry.sig
    if not sig.yields_to_earlier:
        return False
    first = rule.hits[0].key
    return any(
        other is not rule
        and other.entry.sig.role == "primary"
        and other.entry.sig.effect in sig.yields_to_earlier
        and other.entry.sig.category not in ("unknown", sig.category)
        and seen.isdisjoint(other.entry.sig.yields_to)
        and other.hits[0].key < first
        for other in rules
    )


def _tier(rule: RuleHits, rules: list[RuleHits], seen: set[str]) -> int | None:
    """0 primary fatal, 1 primary silent, 2 symptom, 3 generic wrapper; None: never the root cause."""
    sig = rule.entry.sig
    if sig.effect in ("warning", "noise"):
        return None
    if sig.role == "primary" and seen.isdisjoint(sig.yields_to) and not _after_failure(rule, rules, seen):
        return 0 if sig.effect == "fatal" else 1
    return 3 if sig.category == "unknown" else 2


def pick_root(rules: Iterable[RuleHits]) -> RuleHits | None:
    rules = list(rules)
    seen = {rule.entry.sig.id for rule in rules}
    ranked = [
        (tier, rule.hits[0].key, rule) for rule in rules if (tier := _tier(rule, rules, seen)) is not None
    ]
    return min(ranked, key=lambda t: (t[0], t[1]))[2] if ranked else None


def to_finding(rule: RuleHits) -> Finding:
    sig = rule.entry.sig
    first = rule.hits[0]
    groups = first.groups
    return Finding(
        category=sig.category,
        rule_id=sig.id,
        title=fill(sig.title, groups),
        role=sig.role,
        effect=sig.effect,
        stage=sig.stage,
        ranks=sorted(rule.ranks),
        count=rule.count,
        first_seen=first.stamp.iso() if first.stamp else None,
        # the first hit's detail lines (`file:`/`field:`/`fix:` after `error:`) right after it
        evidence=[first.evidence, *first.details, *(h.evidence for h in rule.hits[1:])],
        cause=fill(sig.cause, groups),
        fixes=[
            Fix(
                action=f.action,
                text=fill(f.text, groups),
                command=fill(f.command, groups, quote=True) if f.command else None,
            )
            for f in sig.fixes
        ],
        env_vars=list(sig.env_vars),
        docs=list(sig.docs),
    )


def build_report(ctx: ScanContext) -> DiagnosisReport:
    rules = sorted(ctx.rules.values(), key=lambda r: r.hits[0].key)
    root = pick_root(rules)
    ordered = ([root] if root else []) + [r for r in rules if r is not root]
    findings = [to_finding(r) for r in ordered]
    report = DiagnosisReport(
        category=findings[0].category if root else "none",
        root_cause=findings[0] if root else None,
        findings=findings,
        progress=ctx.progress.summary(),
        files=ctx.files,
        skipped=ctx.skipped,
        notes=ctx.notes,
        lines=ctx.lines,
        bytes=ctx.bytes,
    )
    # evidence quotes log lines, and titles, causes and fixes quote regex groups of them: no secret leaves
    return redact_model(report)

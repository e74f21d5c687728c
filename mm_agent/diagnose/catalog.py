"""Load the failure catalog: one validated YAML file per signature, every regex compiled at load.

A bad file fails with the file, the rule id and the field (node-problem-detector's `ValidateRules`, but
naming the rule). Triggers must also compile under RE2 when it is installed, since the scanner's
prefilter runs them there.

Which signatures explain a line (`match_line`) goes by precedence, most telling first: a noise signature
(a line healthy runs print too) takes the line from every other one, so a notice that happens to contain
"Name or service not known" never becomes a missing dependency; then the rules whose context holds (a
SIGKILL while the checkpoint loads is the host OOM killer's); then the rules for an error the program caught
and went on from (a data set's "Data x.mp4: the error is [Errno 2] No such file …" is a skipped sample, not a
missing video that stopped the run); then the specific rules; the generic catch-alls only when nothing else
matched.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mm_agent.diagnose.schema import Signature
from mm_agent.errors import MMAgentError
from mm_agent.registry import read_yaml, validation_error

SIGNATURES_DIR = Path(__file__).with_name("signatures")


@dataclass(frozen=True)
class CompiledSignature:
    """A signature plus its compiled regexes (kept out of the pydantic model so that stays plain data)."""

    sig: Signature
    triggers: tuple[re.Pattern[str], ...]
    patterns: tuple[re.Pattern[str], ...]
    details: tuple[re.Pattern[str], ...] = ()
    during: tuple[re.Pattern[str], ...] = ()  # the rule's context (`Context.during` / `Context.after`)
    after: tuple[re.Pattern[str], ...] = ()

    def in_context(self, before: Sequence[str]) -> bool:
        """Whether the lines logged before a hit (oldest first) put this rule in its context: the latest of
        the last `context.lines` non-blank ones that matches `during` or `after` matches `during`."""
        context = self.sig.context
        if context is None:
            return True
        recent = [line for line in before if line.strip()][-context.lines :]
        for line in reversed(recent):
            if any(p.search(line) for p in self.during):
                return True
            if any(p.search(line) for p in self.after):
                return False
        return False

    def detail(self, line: str) -> dict[str, str] | None:
        """The groups of the first detail pattern that matches `line` (a line right after a hit)."""
        for pattern in self.details:
            m = pattern.search(line)
            if m:
                return {k: v for k, v in m.groupdict().items() if v is not None}
        return None

    def match(self, line: str) -> re.Match[str] | None:
        """The first pattern match, if a trigger fires first (the same two steps the scanner takes)."""
        if not any(t.search(line) for t in self.triggers):
            return None
        for pattern in self.patterns:
            m = pattern.search(line)
            if m:
                return m
        return None


def _compile(path: Path, rule: str, field: str, source: str) -> re.Pattern[str]:
    try:
        return re.compile(source)
    except re.error as exc:
        raise MMAgentError(
            f"rule {rule}: regex {source!r} does not compile: {exc}",
            file=str(path),
            field=field,
            fix="fix the regular expression (Python `re` syntax)",
        ) from exc


def _check_re2(path: Path, rule: str, index: int, source: str) -> None:
    try:
        import re2
    except ImportError:
        return
    try:
        re2.compile(source)
    except Exception as exc:  # re2 raises its own error type
        raise MMAgentError(
            f"rule {rule}: trigger {source!r} is not RE2-compatible: {exc}",
            file=str(path),
            field=f"triggers.{index}",
            fix="triggers must avoid lookaround and backreferences (RE2/ERE subset)",
        ) from exc


def _check_groups(path: Path, sig: Signature) -> None:
    """`requires` names groups of the details or patterns; `claims` a group of this rule's own patterns."""
    named = set().union(*(re.findall(r"\(\?P<(\w+)>", s) for s in [*sig.patterns, *sig.details]))
    for i, group in enumerate(sig.requires):
        if group not in named:
            raise MMAgentError(
                f"rule {sig.id}: requires group {group!r}, which no pattern or detail captures",
                file=str(path),
                field=f"requires.{i}",
                fix="name a (?P<name>...) group of the patterns or details, or drop the entry",
            )
    own = set().union(*(re.findall(r"\(\?P<(\w+)>", s) for s in sig.patterns))
    for i, claim in enumerate(sig.claims):
        if claim.group not in own:
            raise MMAgentError(
                f"rule {sig.id}: claims lines by group {claim.group!r}, which its patterns do not capture",
                file=str(path),
                field=f"claims.{i}.group",
                fix="capture that group in a pattern of this rule (e.g. (?P<pid>\\d+))",
            )


def load_signature(path: Path) -> CompiledSignature:
    try:
        sig = Signature.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise validation_error(path, exc, schema="mm_agent/diagnose/schema.py") from exc
    if sig.id != path.stem:
        raise MMAgentError(
            f"id {sig.id!r} differs from the file name",
            file=str(path),
            field="id",
            fix=f"rename the file to {sig.id}.yaml or set id: {path.stem}",
        )
    for i, source in enumerate(sig.triggers):
        _check_re2(path, sig.id, i, source)
    _check_groups(path, sig)
    return CompiledSignature(
        sig=sig,
        triggers=tuple(_compile(path, sig.id, f"triggers.{i}", s) for i, s in enumerate(sig.triggers)),
        patterns=tuple(_compile(path, sig.id, f"patterns.{i}", s) for i, s in enumerate(sig.patterns)),
        details=tuple(_compile(path, sig.id, f"details.{i}", s) for i, s in enumerate(sig.details)),
        during=tuple(
            _compile(path, sig.id, f"context.during.{i}", s)
            for i, s in enumerate(sig.context.during if sig.context else [])
        ),
        after=tuple(
            _compile(path, sig.id, f"context.after.{i}", s)
            for i, s in enumerate(sig.context.after if sig.context else [])
        ),
    )


def load_catalog(directory: Path | None = None) -> tuple[CompiledSignature, ...]:
    """Every signature file in `directory` (default: the shipped catalog), sorted by id."""
    folder = directory or SIGNATURES_DIR
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise MMAgentError("no signature files found", file=str(folder), fix="reinstall mm-agent")
    catalog = tuple(load_signature(p) for p in files)
    ids = {entry.sig.id for entry in catalog}
    for path, entry in zip(files, catalog, strict=True):
        for i, claim in enumerate(entry.sig.claims):
            if claim.rule not in ids:
                raise MMAgentError(
                    f"rule {entry.sig.id}: claims lines of {claim.rule!r}, which is not in the catalog",
                    file=str(path),
                    field=f"claims.{i}.rule",
                    fix="name the id of a signature file in the same folder, or drop the entry",
                )
        for i, other in enumerate(entry.sig.yields_to):
            if other not in ids:
                raise MMAgentError(
                    f"rule {entry.sig.id}: yields_to names {other!r}, which is not in the catalog",
                    file=str(path),
                    field=f"yields_to.{i}",
                    fix="name the id of a signature file in the same folder, or drop the entry",
                )
    return catalog


@functools.cache
def get_catalog() -> tuple[CompiledSignature, ...]:
    """The shipped catalog, loaded once per process."""
    return load_catalog()


Matches = list[tuple[CompiledSignature, re.Match[str]]]


def match_line(
    line: str,
    catalog: Sequence[CompiledSignature] | None = None,
    before: Callable[[], Sequence[str]] | None = None,
) -> Matches:
    """Signatures that explain `line`, by precedence (module docstring): the noise ones that match, else
    the rules whose context holds, else the handled-error ones, else every specific one, else the generic
    ones.

    `before` gives the lines logged before this one (oldest first), asked only when a rule with a context
    matches; without it those rules never apply.
    """
    noise: Matches = []
    placed: Matches = []
    handled: Matches = []
    specific: Matches = []
    generic: Matches = []
    window: Sequence[str] | None = None
    for entry in catalog if catalog is not None else get_catalog():
        m = entry.match(line)
        if not m:
            continue
        if entry.sig.effect == "noise":
            noise.append((entry, m))
        elif entry.sig.context is not None:
            if before is not None:
                window = before() if window is None else window
                if entry.in_context(window):
                    placed.append((entry, m))
        elif entry.sig.handled:
            handled.append((entry, m))
        else:
            (generic if entry.sig.generic else specific).append((entry, m))
    return noise or placed or handled or specific or generic

"""The cheap first pass: which lines can match any signature at all, and which signatures to try on them.

One union of every catalog trigger is searched over whole blocks of bytes; google-re2 runs it as a DFA at
about grep's speed (Python `re` alternation is an order of magnitude slower). For a hit line a RE2 Set
names the signatures whose own triggers fire, so only their Python patterns run. Without google-re2 the
same union runs under Python `re` and every signature is tried on a hit line: correct, only slower.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mm_agent.diagnose.catalog import CompiledSignature
from mm_agent.diagnose.progress import NAN_TRIGGER

try:
    import re2
except ImportError:  # pragma: no cover - google-re2 is a dependency; this keeps odd installs working
    re2 = None

_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


def _scoped(trigger: str) -> str:
    """`(?i)foo` -> `(?i:foo)` so leading flags stay the trigger's own inside the union, and named groups
    become plain ones (two triggers may use the same name; the union only needs to find the line)."""
    trigger = _NAMED_GROUP.sub("(?:", trigger)
    m = _FLAGS.match(trigger)
    return f"(?{m.group(1)}:{trigger[m.end() :]})" if m else trigger


class Prefilter:
    """The block-level union of all triggers, and the per-line lookup of which signatures may apply."""

    def __init__(self, catalog: Sequence[CompiledSignature]):
        self.catalog = tuple(catalog)
        pairs = [(_scoped(t), i) for i, entry in enumerate(self.catalog) for t in entry.sig.triggers]
        union = "|".join(f"(?:{t})" for t, _ in pairs)
        union = f"{union}|{NAN_TRIGGER}" if union else NAN_TRIGGER
        self._owners = [i for _, i in pairs]  # trigger number -> catalog index
        self._set: Any = None
        if re2 is not None:
            options = re2.Options()
            options.max_mem = 256 << 20  # room for the DFA of a few hundred alternatives
            self.search: Any = re2.compile(union.encode(), options).search
            self._set = re2.Set.SearchSet(options)
            for trigger, _ in pairs:
                self._set.Add(trigger)
            self._set.Compile()
        else:
            self.search = re.compile(union.encode()).search

    def candidates(self, line: bytes) -> tuple[CompiledSignature, ...]:
        """Signatures with a trigger on this line (all of them when RE2 is missing: match() re-checks)."""
        if self._set is None:
            return self.catalog
        hits = self._set.Match(line)
        if not hits:
            return ()
        return tuple(self.catalog[i] for i in sorted({self._owners[h] for h in hits}))

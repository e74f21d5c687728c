"""Render an `InstallPlan` as a bash script (templates/install/install.sh.j2).

The script runs exactly the plan's argv lists; it re-checks every step's verification first (finished steps
are skipped, so re-running is safe), refuses up front when root-only steps are not done and it is not root,
and stops at the first failing step.

The request's paths (env_path, mm_root, src_dir) enter the script only as single-quoted assignments at its
top (`VIRTUAL_ENV='...'`, `MM_ROOT='...'`, `SRC_DIR='...'`); every word, check and message that contains
one of them says `"$NAME"` there instead. bash never expands the contents of a single-quoted assignment
or of a quoted variable, so no character in a path (`$(...)`, backquotes, quotes) can run anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mm_agent import __version__
from mm_agent.install.checks import REQUIREMENTS_SNIPPET
from mm_agent.templating import jinja_environment, templates_dir

if TYPE_CHECKING:
    from mm_agent.install.plan import InstallPlan

TEMPLATE = "install/install.sh.j2"
# A path is replaced only where it stands whole: not preceded by a path character, not followed by a name
# character (a `/` may follow: `"$MM_ROOT"/.git`).
_BEFORE = r"(?<![\w.~/-])"
_AFTER = r"(?![\w.~-])"


class ShellWords:
    """Turns the plan's texts into bash words in which each request path is a `"$NAME"` reference."""

    def __init__(self, plan: InstallPlan) -> None:
        named = {"VIRTUAL_ENV": plan.env_path, "MM_ROOT": plan.mm_root, "SRC_DIR": plan.src_dir}
        # The filesystem root holds nothing a shell reads, and would match every slash of every URL.
        self._names = {value: name for name, value in named.items() if value != "/"}
        alternatives = "|".join(re.escape(v) for v in sorted(self._names, key=len, reverse=True))
        # With no path to replace, a pattern that never matches (an empty alternation would match everywhere).
        self._pattern = re.compile(rf"{_BEFORE}(?:{alternatives}){_AFTER}" if self._names else r"(?!)")
        used = {self._names[m.group()] for text in _texts(plan.steps) for m in self._pattern.finditer(text)}
        # VIRTUAL_ENV is always set (the script puts its bin on PATH), so it is not listed here.
        self.assignments = [(name, value) for name, value in named.items() if name in used - {"VIRTUAL_ENV"}]

    def __call__(self, text: str) -> str:
        """`text` as one bash word: literal pieces through `shlex.quote`, the paths as `"$NAME"`."""
        pieces: list[str] = []
        last = 0
        for match in self._pattern.finditer(text):
            if match.start() > last:
                pieces.append(shlex.quote(text[last : match.start()]))
            pieces.append(f'"${self._names[match.group()]}"')
            last = match.end()
        if last < len(text) or not pieces:
            pieces.append(shlex.quote(text[last:]))
        return "".join(pieces)


def _texts(value: Any) -> Iterator[str]:
    """Every string inside the plan's steps (argv words, paths, checks, instructions)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
    elif hasattr(value, "model_dump"):
        yield from _texts(value.model_dump())


def render_script(plan: InstallPlan, selected: list[str] | None = None) -> str:
    """Bash text for `plan`; `selected` step ids become the default selection (arguments override it)."""
    template = jinja_environment(str(templates_dir()), ("{##", "##}")).get_template(TEMPLATE)
    return template.render(
        plan=plan,
        selected=selected or [],
        version=__version__,
        req_snippet=REQUIREMENTS_SNIPPET,
        w=ShellWords(plan),
    )

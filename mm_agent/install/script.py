"""Render an `InstallPlan` as a bash script (templates/install/install.sh.j2).

The script runs exactly the plan's argv lists, each word through the `q` filter (`shlex.quote`); it re-checks
every step's verification first (finished steps are skipped, so re-running is safe), refuses up front when
root-only steps are not done and it is not root, and stops at the first failing step.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import TYPE_CHECKING

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from mm_agent import __version__
from mm_agent.install.checks import REQUIREMENTS_SNIPPET
from mm_agent.render import templates_dir

if TYPE_CHECKING:
    from mm_agent.install.plan import InstallPlan

TEMPLATE = "install/install.sh.j2"


@lru_cache(maxsize=2)
def _environment(root: str) -> Environment:
    env = Environment(
        loader=FileSystemLoader(root),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        comment_start_string="{##",  # bash's ${#array[@]} would open a Jinja comment
        comment_end_string="##}",
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def render_script(plan: InstallPlan, selected: list[str] | None = None) -> str:
    """Bash text for `plan`; `selected` step ids become the default selection (arguments override it)."""
    template = _environment(str(templates_dir())).get_template(TEMPLATE)
    return template.render(
        plan=plan, selected=selected or [], version=__version__, req_snippet=REQUIREMENTS_SNIPPET
    )

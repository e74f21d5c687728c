"""Render an `InstallPlan` as a bash script (templates/install/install.sh.j2).

The script runs exactly the plan's argv lists, each word through the `q` filter (`shlex.quote`); it re-checks
every step's verification first (finished steps are skipped, so re-running is safe), refuses up front when
root-only steps are not done and it is not root, and stops at the first failing step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mm_agent import __version__
from mm_agent.install.checks import REQUIREMENTS_SNIPPET
from mm_agent.render import jinja_environment, templates_dir

if TYPE_CHECKING:
    from mm_agent.install.plan import InstallPlan

TEMPLATE = "install/install.sh.j2"


def render_script(plan: InstallPlan, selected: list[str] | None = None) -> str:
    """Bash text for `plan`; `selected` step ids become the default selection (arguments override it)."""
    template = jinja_environment(str(templates_dir()), ("{##", "##}")).get_template(TEMPLATE)
    return template.render(
        plan=plan, selected=selected or [], version=__version__, req_snippet=REQUIREMENTS_SNIPPET
    )

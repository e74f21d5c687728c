"""The one Jinja setup for every file mm-agent renders: job scripts and configs, install.sh, Agent Skills.

Its own module so that render, install and skills all build on it without importing each other.
"""

from __future__ import annotations

import json
import os
import shlex
from functools import lru_cache
from pathlib import Path

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from mm_agent.errors import MMAgentError


def templates_dir() -> Path:
    """Source checkout layout: <repo>/templates next to mm_agent/ (override with MM_AGENT_TEMPLATES)."""
    override = os.environ.get("MM_AGENT_TEMPLATES")
    path = Path(override) if override else Path(__file__).resolve().parent.parent / "templates"
    if not path.is_dir():
        raise MMAgentError(
            f"template folder not found at {path}",
            fix="install mm-agent from its checkout (pip install -e .)",
        )
    return path


@lru_cache(maxsize=4)
def jinja_environment(root: str, comments: tuple[str, str] = ("{#", "#}")) -> Environment:
    """The one Jinja setup for every rendered file: strict undefined, `q` = shlex.quote. Templates full of
    bash `${#array[@]}` pass other comment delimiters, since `{#` would open a Jinja comment."""
    env = Environment(
        loader=FileSystemLoader(root),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        comment_start_string=comments[0],
        comment_end_string=comments[1],
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.filters["dirname"] = lambda v: str(Path(str(v)).parent)
    env.filters["toyaml"] = lambda v: yaml.safe_dump(v, sort_keys=False, allow_unicode=True).rstrip("\n")
    return env

"""The one Jinja setup for every file mm-agent renders: job scripts and configs, install.sh, Agent Skills.

Its own module so that render, install and skills all build on it without importing each other.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from functools import lru_cache
from pathlib import Path

import yaml
from jinja2 import BytecodeCache, Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined

from mm_agent.errors import MMAgentError
from mm_agent.procs import state_dir


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


def _bytecode_cache() -> BytecodeCache | None:
    """Compiled templates kept in the state directory, so a CLI call or a fresh server does not compile the
    ~20 templates of a job again (a quarter of a second): Jinja checks each entry against its template's
    source and Python version, and writes through a temporary name. None until mm-agent has a state
    directory (it never makes one just for this), when the folder cannot be made, or when others could
    write to it."""
    state = state_dir()
    if not state.is_dir():  # a dry run on a fresh machine leaves nothing behind: no state, no cache
        return None
    folder = state / "jinja"
    try:
        folder.mkdir(exist_ok=True, mode=0o700)
        st = folder.lstat()
    except OSError:
        return None
    # Its files are loaded as code: only a folder of this user's that no one else can write.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return FileSystemBytecodeCache(str(folder))


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
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.filters["dirname"] = lambda v: str(Path(str(v)).parent)
    env.filters["toyaml"] = lambda v: yaml.safe_dump(v, sort_keys=False, allow_unicode=True).rstrip("\n")
    return env

"""Which interpreter is the training environment of a MindSpeed-MM run, told apart from the one mm-agent runs in.

mm-agent often lives in a venv of its own (with torch 2.13 for its bundled runtime); MindSpeed-MM needs another
(torch 2.7.1, torch_npu, its pins). Judging mm-agent's venv as MindSpeed-MM's sent users to `pip install
torch==2.7.1` into it, which breaks mm-agent and fixes nothing. So the environment to judge is, in order:

1. the interpreter the user names (`--python`, MCP `python`);
2. the one the job's scripts run: they call `torchrun` from PATH, and its first line (`#!<env>/bin/python`, as
   pip writes console scripts) names its environment;
3. an activated environment (`$VIRTUAL_ENV`, `$CONDA_PREFIX`);
4. the MindSpeed-MM checkout's own venv (`<mm_root>/.venv`, `<mm_root>/venv`);
5. mm-agent's own interpreter, judged only when MindSpeed-MM is installed in it (mm-agent installed into the
   training env); otherwise nothing is judged and the report says how to name the training env.

Candidates 2-4 that are mm-agent's own environment are passed over (and named in the evidence). A bundled job
is not decided here: its scripts run `$PYTHON`, normally mm-agent's own interpreter (`Context`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mm_agent.doctor.probes import ProbeError

SHEBANG_MAX = 1024  # a console script's first lines name one path
# pip's console script when its interpreter's path is too long (or spaced) for `#!`: `#!/bin/sh`, then this line
SH_EXEC = re.compile(r"""^'''exec' "([^"]+)\"""")
CHECKOUT_VENVS = (".venv", "venv")
# Distributions that make an environment a MindSpeed-MM one (torch_npu alone does not: mm-agent's `npu` extra
# installs it for the bundled runtime).
MM_DISTS = ("mindspeed_mm", "mindspeed")


class NoTrainingEnv(ProbeError):
    """No training environment is judged (none found, or found where the doctor may not run it): the interpreter
    checks say so (`summary`, `fix`, `evidence`) instead of judging mm-agent's own environment."""

    def __init__(self, summary: str, fix: str, evidence: list[str]) -> None:
        super().__init__(summary)
        self.summary, self.fix, self.evidence = summary, fix, evidence


@dataclass
class Candidate:
    python: str
    source: str


@dataclass
class Search:
    """What the search found: the candidates in order and why others were passed over."""

    found: list[Candidate] = field(default_factory=list)
    passed_over: list[str] = field(default_factory=list)


def is_agent_env(python: str) -> bool:
    """Whether `python` runs mm-agent's own environment: the same file as mm-agent's interpreter, or one in the
    same prefix (a venv's `bin/python` and `bin/python3` are both the venv's; its base interpreter is not)."""
    path = Path(os.path.abspath(python))
    if path == Path(os.path.abspath(sys.executable)):
        return True
    try:
        return path.parent.parent.resolve() == Path(sys.prefix).resolve()
    except OSError:
        return False


def agent_python() -> str:
    """The interpreter mm-agent itself runs in."""
    return sys.executable


def shebang_interpreter(script: Path, path: str | None) -> str | None:
    """The interpreter a console script's first line names (`#!/abs/python`, or `#!/usr/bin/env python3` looked
    up on PATH); None when it names none. Only a regular file is opened (non-blocking), and only its first
    bytes are read."""
    try:
        if not stat.S_ISREG(os.stat(script).st_mode):
            return None
        fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            head = os.read(fd, SHEBANG_MAX)
        finally:
            os.close(fd)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head[2:].decode("utf-8", "replace").splitlines()
    words = lines[0].split() if lines else []
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[-1], path=path) if path else None
    if os.path.basename(words[0]) == "sh" and len(lines) > 1:  # pip's form for a long or spaced path
        exec_line = SH_EXEC.match(lines[1])
        return exec_line.group(1) if exec_line else None
    return words[0]


def search(env: dict[str, str], checkout: Path | None) -> Search:
    """Candidates 2-4 of the module docstring, mm-agent's own environment passed over."""
    out = Search()

    def offer(python: str, source: str) -> None:
        if not os.path.exists(python):
            out.passed_over.append(f"{source}: {python} does not exist")
        elif is_agent_env(python):
            out.passed_over.append(f"{source}: {python} is mm-agent's own environment, not a training one")
        else:
            out.found.append(Candidate(python, source))

    path = env.get("PATH")
    torchrun = shutil.which("torchrun", path=path) if path else None
    if torchrun and os.path.isabs(torchrun):
        python = shebang_interpreter(Path(torchrun), path)
        if python:
            offer(python, f"the interpreter of `torchrun` on PATH ({torchrun}), which the job's scripts run")
        else:
            out.passed_over.append(f"`torchrun` on PATH ({torchrun}) names no interpreter on its first line")
    for var, what in (("VIRTUAL_ENV", "the activated venv"), ("CONDA_PREFIX", "the activated conda env")):
        prefix = env.get(var)
        if prefix and os.path.isabs(prefix) and os.path.exists(os.path.join(prefix, "bin", "python")):
            offer(os.path.join(prefix, "bin", "python"), f"${var} ({what})")
    for name in CHECKOUT_VENVS if checkout is not None else ():
        venv_python = os.path.join(str(checkout), name, "bin", "python")
        if os.path.exists(venv_python):
            offer(venv_python, f"the MindSpeed-MM checkout's {name}")
    return out

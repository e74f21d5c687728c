"""Verification commands for install steps: small argv lists whose exit status (and stdout) say 'done'.

Package checks run *inside the target environment* with its own interpreter and read installed metadata
instead of importing the package: `import torch_npu` fails without CANN (reference environment.md §5), and
metadata is what pip resolved anyway. The snippet is a fixed constant; only validated requirement strings
from the registry are passed to it, as separate argv words.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field

# Exit 0 when every requirement in argv is installed and satisfied (git pins: installed from that commit, read
# from pip's direct_url.json, or for an editable install of a local checkout from that checkout's HEAD, which
# is how the READMEs' `git clone; git checkout <sha>; pip install -e .` and `-e git+...` lines install).
REQUIREMENTS_SNIPPET = """\
import importlib.metadata as md, json, subprocess, sys, urllib.parse
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
def commit(info):
    found = info.get("vcs_info", {}).get("commit_id", "")
    url = info.get("url", "")
    if not found and info.get("dir_info", {}).get("editable") and url.startswith("file://"):
        try:
            head = subprocess.run(["git", "-C", urllib.parse.unquote(url[7:]), "rev-parse", "HEAD"],
                                  capture_output=True, text=True)
        except OSError:
            return ""
        found = head.stdout.strip()
    return found
bad = []
for text in sys.argv[1:]:
    req = Requirement(text)
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:
        bad.append(req.name + " is not installed")
        continue
    print(req.name, dist.version)
    if req.url:
        ref = req.url.rsplit("@", 1)[-1]
        found = commit(json.loads(dist.read_text("direct_url.json") or "{}"))
        if not (found and found.startswith(ref)):
            bad.append(req.name + " is not installed from " + req.url)
    elif not req.specifier.contains(dist.version, prereleases=True):
        bad.append(req.name + " " + dist.version + " does not satisfy " + str(req.specifier))
sys.exit("; ".join(bad) or None)
"""

PYTHON_VERSION_SNIPPET = "import sys; print('%d.%d' % sys.version_info[:2])"


class Check(BaseModel):
    """One verification command; it passes when it exits 0 and its stdout starts with `expect`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: list[str] = Field(min_length=1)
    expect: str | None = Field(default=None, description="required start of the stripped stdout")


def requirements_check(python: str, requirements: list[str]) -> Check:
    return Check(argv=[python, "-c", REQUIREMENTS_SNIPPET, *requirements])


def show(check: Check) -> str:
    """The check as a shell line, with the long requirements snippet abbreviated."""
    words = ["<requirements check>" if w == REQUIREMENTS_SNIPPET else shlex.quote(w) for w in check.argv]
    line = " ".join(words)
    return f"{line}  (output starts with {check.expect})" if check.expect is not None else line


def passes(check: Check, returncode: int, stdout: str) -> bool:
    return returncode == 0 and (check.expect is None or stdout.strip().startswith(check.expect))

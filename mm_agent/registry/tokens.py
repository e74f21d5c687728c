"""String types for data that ends up on a command line.

Install steps are argv lists (and `shlex.quote`d in rendered scripts), so a data string can never become
shell code; these types add the second guard: a typo or a hostile edit in a data file cannot turn a package
name into a flag (`--index-url=...`), a URL into a different scheme, or a relative path into `../../etc`.
Each type is a pydantic `Annotated[str, ...]`, so the file and field are named when a value is rejected.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator

_URL = re.compile(r"^https://[A-Za-z0-9.-]+(?::\d+)?(?:/[A-Za-z0-9._~%/+-]*)?$")
_GIT_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
_SYSTEM_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9.+_-]*(?:\{python\}[a-z0-9.+_-]*)?$")
_REL_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_ABS_PATH = re.compile(r"^/[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_CMAKE_DEFINE = re.compile(r"^-D[A-Z][A-Z0-9_]*=[A-Za-z0-9_.]+$")
_REQUIREMENT_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-\[\],<>=!~ @:/+]*$")


def _url(value: str) -> str:
    if not _URL.match(value):
        raise ValueError(f"{value!r} is not a plain https URL (no query, credentials or spaces)")
    return value


def _git_ref(value: str) -> str:
    if not _GIT_REF.match(value) or ".." in value:
        raise ValueError(f"{value!r} is not a git branch, tag or commit name")
    return value


def _system_package(value: str) -> str:
    if not _SYSTEM_PACKAGE.match(value):
        raise ValueError(f"{value!r} is not a distro package name")
    return value


def _rel_path(value: str) -> str:
    if not _REL_PATH.match(value) or ".." in value.split("/"):
        raise ValueError(f"{value!r} must be a relative path inside the checkout (no '..', no leading '/')")
    return value


def _abs_path(value: str) -> str:
    if not _ABS_PATH.match(value) or ".." in value.split("/"):
        raise ValueError(f"{value!r} must be a plain absolute path")
    return value


def _cmake_define(value: str) -> str:
    if not _CMAKE_DEFINE.match(value):
        raise ValueError(f"{value!r} is not a -DNAME=VALUE cmake definition")
    return value


def _requirement(value: str) -> str:
    """A PEP 508 requirement: a name with a version specifier, or a `name @ git+https://...@ref` pin."""
    if not _REQUIREMENT_CHARS.match(value):
        raise ValueError(f"{value!r} has characters a pip requirement does not need")
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a PEP 508 requirement: {exc}") from None
    if req.marker is not None:
        raise ValueError(f"{value!r}: environment markers are not supported here")
    if req.url is not None:
        if not req.url.startswith("git+https://"):
            raise ValueError(f"{value!r}: direct references must be git+https:// URLs")
        repo, _, ref = req.url[len("git+") :].rpartition("@")
        if not repo or not _URL.match(repo) or not _GIT_REF.match(ref) or urlsplit(repo).query:
            raise ValueError(f"{value!r}: expected git+https://host/path.git@<commit or tag>")
    return value


HttpsUrl = Annotated[str, AfterValidator(_url)]
GitRef = Annotated[str, AfterValidator(_git_ref)]
SystemPackage = Annotated[str, AfterValidator(_system_package)]
RelPath = Annotated[str, AfterValidator(_rel_path)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
CmakeDefine = Annotated[str, AfterValidator(_cmake_define)]
PipRequirement = Annotated[str, AfterValidator(_requirement)]

"""Git state of a checkout read from its `.git` files (HEAD, loose refs, packed-refs) instead of running git:
fast, works without git installed, and cannot hang on a lock. Also: which commit an installed package
came from (pip's direct_url.json: a VCS install's commit, or an editable install's checkout HEAD).

Every file is read through `paths.read_file`: a FIFO or device planted as `.git/HEAD` is refused before it
is opened (it would block the check forever), and with a workspace `root` a `.git` that leads outside it
(`gitdir:`, `commondir`, symlinks) is not read, so no outside file's first line can surface as a "commit".
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from mm_agent.doctor.probes import EnvProbe
from mm_agent.errors import MMAgentError
from mm_agent.paths import inside, read_file

_MAX_GIT_FILE = 4 * 1024 * 1024  # packed-refs of a large repository; HEAD and loose refs are one line


def _read(path: Path, root: Path | None) -> str | None:
    """The text of a git metadata file; None when it is missing, not a regular file, too large or (with
    `root`) outside the workspace."""
    try:
        return read_file(path, root, field="mm_root", limit=_MAX_GIT_FILE).decode("utf-8", "replace")
    except MMAgentError:
        return None


def _git_dir(repo: Path, root: Path | None) -> Path | None:
    git = repo / ".git"
    if git.is_file():  # worktree or submodule: "gitdir: <path>"
        text = (_read(git, root) or "").strip()
        if text.startswith("gitdir:"):
            git = (repo / text[len("gitdir:") :].strip()).resolve()
    return git if git.is_dir() else None


def _packed_refs(common: Path, root: Path | None) -> dict[str, str]:
    """ref -> commit from packed-refs; annotated tags map to the commit they point at."""
    refs: dict[str, str] = {}
    last = None
    for line in (_read(common / "packed-refs", root) or "").splitlines():
        if line.startswith("^") and last:
            refs[last] = line[1:].strip()
        elif line and not line.startswith("#"):
            sha, _, ref = line.partition(" ")
            refs[ref.strip()] = sha
            last = ref.strip()
    return refs


def git_head(repo: Path, root: Path | None = None) -> tuple[str | None, str | None, list[str]]:
    """(commit, branch, tags at HEAD) of a checkout, read from its .git folder (confined to `root`)."""
    git = _git_dir(repo, root)
    if git is None:
        return None, None, []
    common = git
    commondir = _read(git / "commondir", root)
    if commondir is not None:
        common = (git / commondir.strip()).resolve()
    packed = _packed_refs(common, root)
    head = (_read(git / "HEAD", root) or "").strip()
    if not head:
        return None, None, []
    branch = None
    commit: str | None = head
    if head.startswith("ref:"):
        ref = head[4:].strip()
        branch = ref.removeprefix("refs/heads/")
        loose = common / ref
        text = _read(loose, root)
        commit = text.strip() if text is not None else packed.get(ref)
    tags = sorted(
        r.removeprefix("refs/tags/")
        for r, sha in packed.items()
        if r.startswith("refs/tags/") and sha == commit
    )
    tag_dir = common / "refs" / "tags"
    if tag_dir.is_dir() and commit:
        tags += sorted(p.name for p in tag_dir.iterdir() if (_read(p, root) or "").strip() == commit)
    return commit, branch, tags


def unread(src: Path, root: Path | None) -> str:
    """A note for the evidence when `src` lies outside the workspace, so its git files were not read."""
    return "" if root is None or inside(src, root) else " (outside the workspace: its git files are not read)"


def editable_dir(direct_url: dict[str, object]) -> Path | None:
    url = str(direct_url.get("url", ""))
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    return None


def installed_commit(env: EnvProbe, dist: str, root: Path | None = None) -> tuple[str | None, str]:
    """(commit, how it was found) of an installed distribution: a VCS install's commit_id, or the HEAD of
    an editable install's checkout (read confined to `root`); None when it was installed from an index."""
    direct = env.direct_url.get(dist, {})
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("commit_id"):
        return str(vcs["commit_id"]), f"installed from {direct.get('url')}"
    src = editable_dir(direct)
    if src is not None:
        commit, branch, _ = git_head(src, root)
        return commit, f"editable install from {src}" + (f" ({branch})" if branch else "") + unread(src, root)
    return None, "installed from a package index (no commit recorded)"

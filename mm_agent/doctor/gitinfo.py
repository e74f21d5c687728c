"""Git state of a checkout read from its `.git` files (HEAD, loose refs, packed-refs) instead of running git:
fast, works without git installed, and cannot hang on a lock. Also: which commit an installed package
came from (pip's direct_url.json: a VCS install's commit, or an editable install's checkout HEAD).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from mm_agent.doctor.probes import EnvProbe


def _git_dir(repo: Path) -> Path | None:
    git = repo / ".git"
    if git.is_file():  # worktree or submodule: "gitdir: <path>"
        text = git.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            git = (repo / text[len("gitdir:") :].strip()).resolve()
    return git if git.is_dir() else None


def _packed_refs(common: Path) -> dict[str, str]:
    """ref -> commit from packed-refs; annotated tags map to the commit they point at."""
    refs: dict[str, str] = {}
    path = common / "packed-refs"
    if not path.is_file():
        return refs
    last = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("^") and last:
            refs[last] = line[1:].strip()
        elif line and not line.startswith("#"):
            sha, _, ref = line.partition(" ")
            refs[ref.strip()] = sha
            last = ref.strip()
    return refs


def git_head(repo: Path) -> tuple[str | None, str | None, list[str]]:
    """(commit, branch, tags at HEAD) of a checkout, read from its .git folder."""
    git = _git_dir(repo)
    if git is None:
        return None, None, []
    common = git
    if (git / "commondir").is_file():
        common = (git / (git / "commondir").read_text(encoding="utf-8").strip()).resolve()
    packed = _packed_refs(common)
    head = (git / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    branch = None
    commit: str | None = head
    if head.startswith("ref:"):
        ref = head[4:].strip()
        branch = ref.removeprefix("refs/heads/")
        loose = common / ref
        commit = loose.read_text(encoding="utf-8").strip() if loose.is_file() else packed.get(ref)
    tags = sorted(
        r.removeprefix("refs/tags/")
        for r, sha in packed.items()
        if r.startswith("refs/tags/") and sha == commit
    )
    tag_dir = common / "refs" / "tags"
    if tag_dir.is_dir() and commit:
        tags += sorted(
            p.name
            for p in tag_dir.iterdir()
            if p.is_file() and p.read_text(encoding="utf-8").strip() == commit
        )
    return commit, branch, tags


def editable_dir(direct_url: dict[str, object]) -> Path | None:
    url = str(direct_url.get("url", ""))
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    return None


def installed_commit(env: EnvProbe, dist: str) -> tuple[str | None, str]:
    """(commit, how it was found) of an installed distribution: a VCS install's commit_id, or the HEAD of
    an editable install's checkout; None when it was installed from an index."""
    direct = env.direct_url.get(dist, {})
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("commit_id"):
        return str(vcs["commit_id"]), f"installed from {direct.get('url')}"
    src = editable_dir(direct)
    if src is not None:
        commit, branch, _ = git_head(src)
        return commit, f"editable install from {src}" + (f" ({branch})" if branch else "")
    return None, "installed from a package index (no commit recorded)"

"""Checks of the MindSpeed-MM side: the checkout, the Megatron tree copied into it, MindSpeed at its pinned
commit, no other Megatron shadowing the checkout's, and `mm-convert` on PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

from mm_agent.doctor.checks_python import env_fix, probe_or_fail
from mm_agent.doctor.context import Context
from mm_agent.doctor.gitinfo import editable_dir, git_head, unread
from mm_agent.doctor.registry import MM_ONLY, Outcome, check, fail, ok, skip, warn
from mm_agent.install.schema import Repos, load_install_knowledge
from mm_agent.paths import read_file


def _checkout(ctx: Context, root: Path) -> str:
    """`git -C ROOT checkout vX`, ROOT one shell word (the fix is pasted)."""
    return shlex.join(["git", "-C", str(root), "checkout", f"v{ctx.version.id}"])


def _repos(ctx: Context) -> Repos:
    """Repository URLs from the install data (the same ones `install_deps` clones)."""
    return load_install_knowledge(ctx.registry).repos


_PACKAGE_INFO = re.compile(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d+)", re.MULTILINE)
_MAX_PACKAGE_INFO = 64 * 1024  # megatron/core/package_info.py is a few hundred bytes


def _mm_root_or_fail(ctx: Context) -> Path | Outcome:
    root = ctx.checkout()
    if root is None:
        return fail(
            "no MindSpeed-MM checkout found",
            "pass --mm-root DIR (or export MM_ROOT=DIR); to get one: "
            f"`{shlex.join(['git', 'clone', _repos(ctx).mindspeed_mm])} && cd MindSpeed-MM && "
            f"{shlex.join(['git', 'checkout', 'v' + ctx.version.id])}`",
            ["looked at --mm-root, the job's mm_root, $MM_ROOT, ./MindSpeed-MM and the current directory"],
        )
    if not root.is_dir():
        return fail(
            f"MindSpeed-MM checkout {root} does not exist (from {ctx.mm_root_source})",
            f"`{shlex.join(['git', 'clone', _repos(ctx).mindspeed_mm, str(root)])} && {_checkout(ctx, root)}`, "
            "or point --mm-root/MM_ROOT at your checkout",
        )
    return root


@check("mm_checkout", "MindSpeed-MM checkout found", MM_ONLY)
def mm_checkout(ctx: Context) -> Outcome:
    root = _mm_root_or_fail(ctx)
    if isinstance(root, Outcome):
        return root
    evidence = [f"{root} (from {ctx.mm_root_source})"]
    if not (root / "mindspeed_mm").is_dir():
        return fail(
            f"{root} is not a MindSpeed-MM checkout (no mindspeed_mm/ package)",
            "point --mm-root/MM_ROOT at the MindSpeed-MM repository root",
            evidence,
        )
    commit, branch, tags = git_head(root, ctx.root)
    if commit:
        evidence.append(
            f"git HEAD {commit[:12]}"
            + (f" ({branch})" if branch else "")
            + (f", tags {', '.join(tags)}" if tags else "")
        )
    wanted_entry = ctx.task.entry_script.path if ctx.task else None
    missing = [e for e in ctx.version.root_entry_points if not (root / e).is_file()]
    if wanted_entry and wanted_entry in missing:
        return fail(
            f"{wanted_entry} (the {ctx.model.id if ctx.model else ''} entry script) is missing from the checkout",
            f"check out MindSpeed-MM v{ctx.version.id}: `{_checkout(ctx, root)}`",
            evidence,
        )
    version_tags = [t.lstrip("v") for t in tags if re.fullmatch(r"v?\d+(\.\d+)+", t)]
    if version_tags and ctx.version.id not in version_tags:
        return warn(
            f"checkout is at {', '.join(tags)}, but the checks assume MindSpeed-MM {ctx.version.id}",
            f"pass --mm-version {version_tags[0]}, or `{_checkout(ctx, root)}`",
            evidence,
        )
    if missing:
        return warn(
            f"{len(missing)} entry script(s) of MM {ctx.version.id} are missing ({', '.join(missing[:3])}...)",
            f"is this MindSpeed-MM {ctx.version.id}? `{_checkout(ctx, root)}`",
            evidence,
        )
    return ok(f"{root}", evidence)


@check("megatron_tree", "megatron/ copied into the checkout at the pinned core version", MM_ONLY)
def megatron_tree(ctx: Context) -> Outcome:
    root = _mm_root_or_fail(ctx)
    if isinstance(root, Outcome):
        return skip("no MindSpeed-MM checkout (see mm_checkout)")
    tag = ctx.version.megatron
    want = tag.removeprefix("core_v").removeprefix("core_r")
    copy_fix = (
        f"`{shlex.join(['git', 'clone', _repos(ctx).megatron])} && cd Megatron-LM && "
        f"{shlex.join(['git', 'checkout', tag])} && {shlex.join(['cp', '-r', 'megatron', str(root) + '/'])}` "
        "(or `bash scripts/install.sh --megatron` in the checkout)"
    )
    remove = shlex.join(["rm", "-rf", str(root / "megatron")])
    info = root / "megatron" / "core" / "package_info.py"
    if not (root / "megatron").is_dir():
        return fail(f"{root}/megatron is missing: `No module named 'megatron'`", copy_fix)
    if not info.is_file():
        return fail(
            f"{info} is missing: the megatron/ copy is incomplete",
            f"replace it: `{remove}`, then {copy_fix}",
        )
    text = read_file(info, ctx.root, field="mm_root", limit=_MAX_PACKAGE_INFO).decode("utf-8", "replace")
    parts = dict(_PACKAGE_INFO.findall(text))
    have = ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    evidence = [f"{info}: {have}", f"MM {ctx.version.id} pins Megatron {tag}"]
    if have != want:
        return fail(
            f"megatron/ is {have}, MindSpeed-MM {ctx.version.id} needs {want} ({tag})",
            f"`{remove}`, then {copy_fix}",
            evidence,
        )
    return ok(f"megatron core {have}", evidence)


@check("mindspeed", "MindSpeed installed at the pinned commit", MM_ONLY)
def mindspeed(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    overlay = ctx.overlay()
    pinned = overlay.mindspeed_commit if overlay else None
    branch_want = ctx.version.mindspeed_branch
    ref = pinned or branch_want or "the commit your model's README names"
    install_fix = (
        f"`{shlex.join(['git', 'clone', _repos(ctx).mindspeed])} && cd MindSpeed && "
        f"{shlex.join(['git', 'checkout', ref]) if pinned or branch_want else 'git checkout <commit>'} && "
        "pip install -e .`" + ("" if pinned or branch_want else f" ({ref})")
    )
    install_fix = env_fix(ctx, install_fix)
    version = env.dists.get("mindspeed")
    if version is None:
        return fail("MindSpeed is not installed: `No module named 'mindspeed'`", install_fix)
    if env.modules.get("mindspeed") is None:
        return fail(
            f"mindspeed {version} has metadata but cannot be found on sys.path (broken install)", install_fix
        )
    evidence = [f"mindspeed {version}"]
    if pinned:
        evidence.append(f"{ctx.model.id if ctx.model else ''} pins MindSpeed {pinned}")
    elif branch_want:
        evidence.append(f"MM {ctx.version.id} uses MindSpeed branch {branch_want}")
    direct = env.direct_url.get("mindspeed", {})
    vcs = direct.get("vcs_info")
    commit = branch = None
    src = editable_dir(direct)
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id")
        evidence.append(f"installed from {direct.get('url')} @ {commit}")
    elif src is not None:
        commit, branch, _ = git_head(src, ctx.root)
        evidence.append(
            f"editable install from {src}"
            + (f", HEAD {commit[:12]}" if commit else "")
            + (f" ({branch})" if branch else "")
            + unread(src, ctx.root)
        )
    if pinned:
        if commit is None:
            return warn(
                f"cannot tell which MindSpeed commit is installed (needs {pinned[:12]})",
                f"install MindSpeed from a git checkout: {install_fix}",
                evidence,
            )
        if not commit.startswith(pinned) and not pinned.startswith(commit):
            where = (
                f"`{shlex.join(['cd', str(src)])} && {shlex.join(['git', 'checkout', pinned])}`"
                if src
                else install_fix
            )
            return fail(
                f"MindSpeed is at {commit[:12]}, {ctx.model.id if ctx.model else 'the model'} needs {pinned[:12]}",
                where,
                evidence,
            )
        return ok(f"MindSpeed at the pinned commit {pinned[:12]}", evidence)
    if branch_want and branch and branch != branch_want:
        return warn(
            f"MindSpeed checkout is on branch {branch}, MM {ctx.version.id} uses {branch_want}",
            f"`{shlex.join(['cd', str(src)])} && {shlex.join(['git', 'checkout', branch_want])}`",
            evidence,
        )
    return ok(f"mindspeed {version}", evidence)


@check("megatron_path", "PYTHONPATH and the Megatron tree agree", MM_ONLY)
def megatron_path(ctx: Context) -> Outcome:
    root = ctx.checkout()
    if root is None or not (root / "megatron").is_dir():
        return skip("no megatron/ in a MindSpeed-MM checkout to compare with (see megatron_tree)")
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    expected = (root / "megatron").resolve()
    evidence = [f"checkout's tree: {expected}"]
    pythonpath = [p for p in ctx.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    shadows = [
        str(Path(p) / "megatron")
        for p in pythonpath
        if (Path(p) / "megatron").is_dir() and (Path(p) / "megatron").resolve() != expected
    ]
    if shadows:
        return fail(
            f"PYTHONPATH has another megatron/ ({', '.join(shadows)}) that shadows the checkout's",
            f"remove those entries from PYTHONPATH; MindSpeed-MM must import {expected}",
            [*evidence, f"PYTHONPATH={ctx.env.get('PYTHONPATH', '')}"],
        )
    spec = env.modules.get("megatron")
    outside = Path(spec.locations[0]).resolve() if spec and spec.locations else None
    core = env.dists.get("megatron_core")
    if core:
        evidence.append(f"pip package megatron-core {core} is installed too")
    if outside is not None and outside != expected:
        evidence.append(f"outside the checkout `import megatron` resolves to {outside}")
        return warn(
            "tools run outside the checkout (mm-convert, feature extraction) import a different megatron",
            env_fix(
                ctx,
                f"pip uninstall megatron-core (MindSpeed-MM uses its own {ctx.version.megatron} copy), or run "
                f"tools from {root}",
            ),
            evidence,
        )
    return ok("no other megatron shadows the checkout's", evidence)


@check("mm_convert", "mm-convert on PATH", MM_ONLY)
def mm_convert(ctx: Context) -> Outcome:
    found = shutil.which("mm-convert", path=ctx.env.get("PATH"))
    if found:
        return ok(found)
    beside = Path(ctx.python).parent / "mm-convert"
    if beside.is_file():
        return warn(
            f"mm-convert exists at {beside} but that folder is not on PATH",
            f'activate the training env (or `export PATH={shlex.quote(str(beside.parent))}:"$PATH"`)',
        )
    root = ctx.mm_root or Path("MindSpeed-MM")
    return fail(
        "mm-convert not found: `mm-convert: command not found`",
        f"`{shlex.join(['cd', str(root)])} && pip install -e .` (installs MindSpeed-MM and its mm-convert "
        "entry point)",
    )

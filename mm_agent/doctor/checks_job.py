"""Checks of a rendered job's own files (with --job): shell scripts with CRLF line endings, which bash
rejects with `syntax error near unexpected token` or `$'\\r': command not found`.

Scripts are read through `paths.read_file`: a `*.sh` that is a FIFO, or (with a workspace) a symlink
leading outside it, is reported instead of read.
"""

from __future__ import annotations

import shlex

from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import Outcome, check, fail, ok, skip
from mm_agent.errors import MMAgentError
from mm_agent.paths import read_file

MAX_SCRIPT = 4 * 1024 * 1024  # rendered scripts are a few KB
STRIP_CR = "s/\\r$//"  # sed's program that drops a CR before each newline


@check("crlf_scripts", "Job scripts have Unix line endings")
def crlf_scripts(ctx: Context) -> Outcome:
    if ctx.job_dir is None:
        return skip("no job given (--job)")
    job_dir = ctx.at_use(ctx.job_dir, "job")
    scripts = sorted(job_dir.rglob("*.sh"))
    bad, unread, crlf = [], [], []
    for path in scripts:
        try:
            data = read_file(path, ctx.root, field="job", limit=MAX_SCRIPT)
        except MMAgentError as exc:
            unread.append(f"{path.relative_to(job_dir)}: not read ({exc.message})")
            continue
        pos = data.find(b"\r\n")
        if pos >= 0:
            line = data.count(b"\n", 0, pos) + 1
            bad.append(f"{path.relative_to(job_dir)} (first CRLF on line {line})")
            crlf.append(f"./{path.relative_to(job_dir)}")  # (a name starting with `-` is no option)
    if bad:
        cd = shlex.join(["cd", str(job_dir)])
        dos2unix, sed = shlex.join(["dos2unix", *crlf]), shlex.join(["sed", "-i", STRIP_CR, *crlf])
        return fail(
            f"{len(bad)} script(s) have Windows (CRLF) line endings",
            f"`{cd} && {dos2unix}` (or `{cd} && {sed}`)",
            [*bad, *unread],
        )
    if unread:
        return fail(
            f"{len(unread)} of {len(scripts)} script(s) cannot be read as plain files",
            f"re-render the job into {job_dir} (its scripts must be regular files inside the workspace)",
            unread,
        )
    return ok(f"{len(scripts)} script(s) checked", [str(p.relative_to(job_dir)) for p in scripts])

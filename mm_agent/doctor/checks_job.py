"""Checks of a rendered job's own files (with --job): shell scripts with CRLF line endings, which bash
rejects with `syntax error near unexpected token` or `$'\\r': command not found`.
"""

from __future__ import annotations

from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import Outcome, check, fail, ok, skip


@check("crlf_scripts", "Job scripts have Unix line endings")
def crlf_scripts(ctx: Context) -> Outcome:
    if ctx.job_dir is None:
        return skip("no job given (--job)")
    scripts = sorted(ctx.job_dir.rglob("*.sh"))
    bad = []
    for path in scripts:
        data = path.read_bytes()
        pos = data.find(b"\r\n")
        if pos >= 0:
            line = data.count(b"\n", 0, pos) + 1
            bad.append(f"{path.relative_to(ctx.job_dir)} (first CRLF on line {line})")
    if bad:
        names = " ".join(b.split(" ")[0] for b in bad)
        return fail(
            f"{len(bad)} script(s) have Windows (CRLF) line endings",
            f"cd {ctx.job_dir} && dos2unix {names} (or sed -i 's/\\r$//' {names})",
            bad,
        )
    return ok(f"{len(scripts)} script(s) checked", [str(p.relative_to(ctx.job_dir)) for p in scripts])

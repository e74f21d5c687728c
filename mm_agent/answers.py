"""What an assistant reads from each tool: a short text summary and a compact structured answer.

Every character a tool returns lands in a context window, so the MCP face does not send the core's full result
model by default. `answer(result, detail)` gives (text, data): `text` is a few lines a person would write,
`data` the result with empty fields dropped and its bulk (pipeline commands, install verify commands and
script, file contents, info findings, passing checks, long log tails) left for `detail=true`. Nothing is said
twice: the prose the text states (a run's message, a diagnosis' cause) is not repeated in the data, and the
lists the data holds (next steps, findings) are only counted or begun in the text. With `detail=true` data
is the whole model, every field included. The CLI's `--json` keeps printing the whole model.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

BRIEF_FINDINGS = 12  # validation / diagnosis findings shown without detail
BRIEF_EVIDENCE = 2  # evidence lines per diagnosis finding
BRIEF_CHARS = 240  # one evidence or log line, cut
BRIEF_TAIL = 8  # log lines in job_status without detail
BRIEF_PER_RULE = 3  # validation findings of one rule shown without detail
DETAIL_HINT = "detail=true for everything"


def compact(value: Any) -> Any:
    """JSON data without None, empty lists/dicts and empty strings (keys an assistant would skip anyway)."""
    if isinstance(value, dict):
        out = {k: compact(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {}, "")}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def _cut(text: str, limit: int = BRIEF_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dump(result: BaseModel, **kwargs: Any) -> dict[str, Any]:
    data: dict[str, Any] = compact(result.model_dump(mode="json", **kwargs))
    return data


# ---- per result type -----------------------------------------------------------------------------------
def _route(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r, exclude={"candidates"})
    data["question"] = r.question  # the contract: always present, null when none
    for asked in ("rehearse", "new_model"):  # said only when asked
        if not getattr(r.parsed, asked, False):
            data.get("parsed", {}).pop(asked, None)
    if r.candidates:  # the best one in full but its stages' commands; the others one line each
        first = r.candidates[0]
        top: dict[str, Any] = compact(first.model_dump(mode="json", exclude={"pipeline", "explanation"}))
        top["pipeline"] = [
            {"stage": s.stage, "applies": s.applies, "summary": s.summary} for s in first.pipeline
        ]
        keep = {"model_id", "task", "backend", "size", "npus_per_node", "nnodes", "entry_script", "score"}
        data["candidates"] = [top] + [
            compact(c.model_dump(mode="json", include=keep)) for c in r.candidates[1:]
        ]
    lines = []
    if r.question:
        lines.append(f"Question: {r.question}")
    new = getattr(r, "new_model", None)
    if new is not None:  # "add my own model": MindSpeed-MM's new-model flow, scaffolded
        lines.append(
            f"Your own model: {new.tool} name=<id> base={new.base} (dry run; confirm=true writes the DiT, model, "
            f"dataset, entry, configs and registration), CLI `{new.command}`. Then rehearse it here with "
            f"`{new.demo}` (CLI), validate_configs on its configs, and launch on NPUs; steps: {new.doc}."
        )
    for i, c in enumerate(r.candidates[:5]):
        where = f"{getattr(c, 'npus_per_node', None) or '?'} NPUs x {getattr(c, 'nnodes', None) or 1} node(s)"
        head = "Best" if i == 0 and not r.question else f"{i + 1}."
        # which LoRA: said, not implied
        of = f" of the {c.adapts} model" if getattr(c, "adapts", None) else ""
        lines.append(
            f"{head}: {c.model_id} {c.task}{of} ({c.backend}, size {c.size}, {where}) via {c.entry_script}"
        )
    if r.candidates and not r.question:
        lines.append(f"Why: {r.candidates[0].explanation}")  # (only here: the data leaves it out)
        best = r.candidates[0]
        launch = f" launcher={best.launcher}" if getattr(best, "launcher", None) else ""
        if getattr(best, "adapts", None):  # the LoRA job render_job must be asked for
            launch = f" adapts={best.adapts}{launch}"
        if getattr(best, "fit", None):
            lines.append(f"Memory: {best.fit}")
        if getattr(best, "demo", None):  # asked to try it on this machine first
            lines.append(
                f"Next: rehearse it here with `{best.demo}` (CLI), then render_job{launch} (dry run)."
            )
        else:
            lines.append(f"Next: install_deps model={best.model_id}, then render_job{launch} (dry run).")
    if len(r.candidates) > 5:
        lines.append(f"... {len(r.candidates) - 5} more candidates in the data.")
    if not detail and r.candidates:
        lines.append(f"{DETAIL_HINT} (each pipeline stage's commands).")
    return "\n".join(lines) or "No candidate.", data


def _install(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    p = r.plan
    data = _dump(r)
    if not detail:
        plan = data.get("plan", {})
        plan.pop("script", None)
        # the commands with the plan's own folders named once ($ENV = plan.env_path, $MM_ROOT = plan.mm_root)
        short = (
            [(str(p.env_path), "$ENV"), (str(p.mm_root), "$MM_ROOT")] if getattr(p, "env_path", None) else []
        )

        def line(argv: list[str]) -> str:
            text = shlex.join(argv)
            for long, name in short:
                text = text.replace(long, name)
            return text

        plan["steps"] = [
            {"id": s.id, "title": s.title, "run": [line(c.argv) for c in s.commands]} for s in p.steps
        ]
        if "run" in data:
            data["run"] = {k: v for k, v in data["run"].items() if k not in ("steps",)} | {
                "steps": [
                    {k: v for k, v in s.items() if k in ("id", "status", "seconds", "error", "log")}
                    for s in data["run"].get("steps", [])
                ]
            }
    where = f"{p.env} at {p.env_path}" if getattr(p, "env_path", None) else p.env
    text = (
        f"{r.status}: {len(p.steps)} install steps for {p.model} on MindSpeed-MM {p.mm_version} ({p.arch}, "
        f"Python {p.python}, {where}); MindSpeed-MM checkout at {p.mm_root}."
    )
    for c in getattr(p, "conflicts", None) or []:  # named here, with the advice (so the data drops it)
        text += f"\nConflict: {c.package} ({', '.join(c.models)}): {_cut(c.advice, 200)}"
        if not detail:
            for d in data.get("plan", {}).get("conflicts", []):
                d.pop("advice", None)
    if r.status == "dry_run":
        text += "\nconfirm=true runs the steps (skipping those already done)"
        text += "." if detail else f"; {DETAIL_HINT} (verify commands, the bash script)."
    return text, data


_KEY_VARS = re.compile(
    r"^(TP|PP|VP|CP|MBS|GRAD_ACC_STEP|NPUS_PER_NODE|NNODES|LOAD_PATH|SAVE_PATH)=(.*)$", re.M
)


def _render(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    from mm_agent.render import training_script  # (render pulls in the templates: only for its answer)

    data = _dump(r)
    if not detail:
        values: dict[str, str] = {}
        train = training_script(f.path for f in r.files)  # the values a user confirms are training's alone
        for f in r.files:
            if f.path == train and f.content:
                for name, value in _KEY_VARS.findall(f.content):
                    values.setdefault(name, value.strip())
        if r.status == "dry_run":  # what would be written; once written, the folder holds them
            data["files"] = [f.path for f in r.files]
        else:
            data.pop("files", None)
        if values:
            data["key_values"] = values
    verb = {
        "dry_run": "would write",
        "written": "wrote",
        "unchanged": "left unchanged",
        "replaced": "replaced",
    }
    of = f" of the {r.adapts} model" if getattr(r, "adapts", None) else ""  # which LoRA it is
    text = (
        f"{verb[r.status]} {len(r.files)} files for {r.model} {r.task}{of} ({r.backend}, {r.size}, "
        f"MindSpeed-MM {r.mm_version}, runtime {r.runtime}) in {r.job_dir}."
    )
    if r.fit and not r.fit.startswith("fits "):  # a plain fit stays in the data
        text += f"\nmemory: {r.fit}"
    for line in getattr(r, "load_check", []):  # what the training will load (mm_agent/loadcheck.py)
        text += f"\nload {line}"
    if r.status == "dry_run":
        text += "\nconfirm=true writes them"
        text += "." if detail else "; file texts: detail=true, or read mm-agent://jobs/<path> once written."
    if r.next_steps:
        text += f"\nnext_steps: {len(r.next_steps)} commands in order, first: {r.next_steps[0]}"
    return text, data


def _validate(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    infos = sum(f.severity == "info" for f in r.findings)
    if not detail:
        shown: list[dict[str, Any]] = []
        per_rule: dict[str, int] = {}
        for f in r.findings:
            if f.severity == "info":
                continue
            per_rule[f.rule] = per_rule.get(f.rule, 0) + 1
            if per_rule[f.rule] <= BRIEF_PER_RULE and len(shown) < BRIEF_FINDINGS:
                d = compact(f.model_dump(mode="json"))
                shown.append(d | {"message": _cut(f.message, 200), "fix": _cut(f.fix, 200)})
        data["findings"] = shown
        data.pop("files", None)
        data["info_count"] = infos
    verdict = "ok" if r.ok else "NOT ok"
    text = f"{verdict}: {r.error_count} error(s), {r.warning_count} warning(s), {infos} info over {len(r.files)} files."
    for f in [f for f in r.findings if f.severity == "error"][:3]:
        where = Path(f.file).name + (f":{f.line}" if f.line else "")  # the folder is the job's: name only
        # the fix whole (a command cut in the middle cannot be run); the data then leaves both out
        text += f"\n- {f.rule} ({where}): {_cut(f.message, 160)} Fix: {f.fix}"
        if not detail:
            for d in data["findings"]:
                if d.get("rule") == f.rule and d.get("file") == f.file and d.get("line") == f.line:
                    d.pop("fix", None)
                    d.pop("message", None)
    for f in r.findings:  # whether a checkout's code ran (mm_root) is always said, never cut
        if f.rule == "mmparser.code_ran":
            text += f"\n{f.message}."
        elif f.rule == "mmparser.not_run":
            text += f"\n{f.message}; {f.fix}."
    if not detail and len(r.findings) > len(data["findings"]):
        counts = ", ".join(f"{rule} {n}" for rule, n in per_rule.items())
        text += f"\nBy rule: {counts}; at most {BRIEF_PER_RULE} each shown; {DETAIL_HINT}."
    return text, data


def _root_cause(f: Any) -> dict[str, Any]:
    """The root-cause finding, brief: what it is, where it was seen (`file:line: text`), how to fix it. Its
    category is the report's own; the cause is in the text."""
    d: dict[str, Any] = compact(
        f.model_dump(mode="json", include={"rule_id", "title", "ranks", "first_seen", "fixes", "env_vars"})
    )
    d["evidence"] = [  # a line that only says the title again: where it is
        f"{e.file}:{e.line}" + ("" if f.title in e.text else f": {_cut(e.text)}")
        for e in f.evidence[:BRIEF_EVIDENCE]
    ]
    if f.count > 1:
        d["count"] = f.count
    return d


def _diagnose(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if not detail:
        if r.root_cause is not None:
            data["root_cause"] = _root_cause(r.root_cause)
        rest = [f for f in r.findings if f != r.root_cause]
        data["other_findings"] = [
            compact(
                {
                    "rule_id": f.rule_id,  # (its title: in the text)
                    "role": f.role,
                    "count": f.count,
                    "ranks": f.ranks[:8],
                }
            )
            for f in rest[:BRIEF_FINDINGS]
        ]
        data.pop("findings", None)
        if isinstance(data.get("progress"), dict) and not any(
            v for k, v in data["progress"].items() if k != "loss_trend" or v != "unknown"
        ):
            data.pop("progress")  # nothing learnt about progress
        data["files"] = r.files[:5]
        if len(r.files) > 5:
            data["files_more"] = len(r.files) - 5
    if r.root_cause is None:
        text = f"No failure found ({r.lines} lines in {len(r.files)} file(s))."
    else:
        rc = r.root_cause
        # the category once: most rule ids begin with it (disk_full, host_oom_killed)
        tag = rc.rule_id if rc.category in rc.rule_id else f"{rc.category}, {rc.rule_id}"
        text = f"Root cause: {rc.title} ({tag})"
        if rc.ranks:
            text += f" on rank(s) {', '.join(map(str, rc.ranks[:8]))}"
        text += f".\nCause: {_cut(rc.cause, 400)}"
        if rc.fixes:
            text += f"\nFix: {_cut(getattr(rc.fixes[0], 'text', str(rc.fixes[0])), 300)}"
    others = len(r.findings) - (1 if r.root_cause is not None else 0)
    if others > 0:
        rest = [f for f in r.findings if f != r.root_cause]  # named here, not "see the data"
        titles = "; ".join(_cut(f.title, 160) for f in rest[:BRIEF_FINDINGS])
        titles += f"; {len(rest) - BRIEF_FINDINGS} more" if len(rest) > BRIEF_FINDINGS else ""
        text += f"\nAlso: {titles}" + ("" if detail else f" ({DETAIL_HINT})") + "."
    return text, data


def _doctor(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if not detail:
        data["checks"] = [
            {"id": c.id, "status": c.status, "summary": _cut(c.summary, 160), "fix": _cut(c.fix or "", 200)}
            for c in r.checks
            if c.status in ("fail", "warn")
        ]
        data["passed"] = [c.id for c in r.checks if c.status == "ok"]
        data["skipped"] = [c.id for c in r.checks if c.status == "skip"]
        first = next((c for c in data["checks"] if c["status"] == "fail"), None)
        if first is not None:
            first.pop("fix", None)  # (the text gives it, whole)
    counts = ", ".join(f"{n} {k}" for k, n in r.counts.items() if n)
    text = f"{'ok' if r.ok else 'NOT ok'}: {counts}."
    m = r.machine  # which env the interpreter checks judged: not necessarily the one mm-agent runs in
    judged = f"{m.python_executable} ({m.python_source})" if m.python_executable else m.python_source
    text += f"\nTraining env judged: {_cut(judged, 200)}."
    failed = [c for c in r.checks if c.status == "fail"]
    if failed:
        text += f"\nFailing: {', '.join(c.id for c in failed)}."
        text += f"\nFirst: {failed[0].id}: {_cut(failed[0].summary, 160)}"
        if failed[0].fix:  # whole: the one step a text-only host needs now
            text += f"\nFix: {failed[0].fix}"
    if not detail:
        text += f"\n{DETAIL_HINT} (evidence)."
    return text, data


def _status(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if not detail:
        data.pop("message", None)  # (the text says it)
        if r.kind != "convert":  # a job's progress mirrors iteration/extract_done; a conversion has only it
            data.pop("progress", None)
        if r.state != "running":  # the process handles and the run folder matter only while it runs
            for key in ("supervisor_pid", "pgid", "run_dir", "master_port"):
                data.pop(key, None)
        # with a root cause its evidence backs it up; the tail (tail_logs has it) only without one
        if r.root_cause is None:
            data["log_tail"] = [_cut(line) for line in condense(r.log_tail)[-BRIEF_TAIL:]]
        else:
            data.pop("log_tail", None)
        data.pop("report", None)
        if isinstance(data.get("root_cause"), dict):
            rc = data["root_cause"]
            rc.pop("cause", None)  # diagnose_errors explains; the fix is here
            rc.pop("category", None)  # (as a diagnosis' own category, in diagnose_errors)
            rc["evidence"] = [  # the line that says the title again left out
                _cut(str(e), 160) for e in rc.get("evidence", [])[:3] if r.root_cause.title not in e
            ]
    text = f"run {r.run_id} ({r.kind}{', ' + r.stage if r.stage else ''}): {r.state}. {_cut(r.message, 300)}"
    if r.iteration is not None:
        text += f"\niteration {r.iteration}/{r.total or '?'}, loss {r.last_loss}, ETA {r.eta_s} s"
    if r.root_cause is not None:
        rc = r.root_cause
        if rc.title not in r.message:
            text += f"\nRoot cause: {rc.title}"
        if rc.fixes:
            text += f"\nFix: {_cut(rc.fixes[0].text, 300)}"
        if not detail:
            text += "\nWhy it happened: diagnose_errors run_id; the log: tail_logs."
    return text, data


_ITERATION = re.compile(r"\biteration\s+\d+\s*/\s*\d+")
_TRACEBACK = "Traceback (most recent call last):"
_SITE = re.compile(
    r'(?<=File ")[^"]*/(?=(?:site|dist)-packages/)'
)  # an installed package's frame: its folder


def condense(lines: list[str]) -> list[str]:
    """A log tail as an assistant needs it: of a run of Megatron iteration lines only the first and the last,
    with a marker saying how many were left out (losses are in job_status); of a Python traceback only its
    first line, its last frame and the exception, with the number of frames left out, and an installed
    package's frame without the folder the package lies in (`…/site-packages/torch/...`)."""
    out: list[str] = []
    run: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _ITERATION.search(line):
            run.append(line)
            i += 1
            continue
        if len(run) > 2:
            out.extend([run[0], f"... {len(run) - 2} iteration lines ...", run[-1]])
        else:
            out.extend(run)
        run = []
        header = line.startswith(_TRACEBACK)
        if header or line.startswith((" ", "\t")):  # a traceback, or one whose head was cut off
            start = i + 1 if header else i
            end = start
            while end < len(lines) and lines[end].startswith((" ", "\t")):
                end += 1
            body = lines[start:end]
            frames = [k for k, b in enumerate(body) if b.lstrip().startswith("File ")]
            left = len(frames) - 1 + (1 if frames and frames[0] > 0 else 0)  # a cut-off frame counts too
            if frames and left:  # what comes before the last frame, summed up
                body = [f"  ... {left} frame(s) ...", *body[frames[-1] :]]
            body = [_SITE.sub("…/", b) for b in body]
            out += [line, *body] if header else body
            i = end
            continue
        out.append(line)
        i += 1
    if len(run) > 2:
        out.extend([run[0], f"... {len(run) - 2} iteration lines ...", run[-1]])
    else:
        out.extend(run)
    return out


def _tail(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    lines = r.lines if detail else [_cut(line) for line in condense(r.lines)]
    data["lines"] = lines
    if not detail:
        # the text names the log and carries the lines: said once (detail=true gives them as data too)
        data.pop("log", None)
        data.pop("lines", None)
    # the lines themselves, in the text: a host that passes only text would otherwise get nothing to read
    head = f"{len(lines)} line(s) of {r.log} ({r.size_bytes} bytes):"
    return "\n".join([head, *lines]) if lines else f"{head} the log is empty.", data


def _models(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if not detail:
        # one line per model: "id (family): task/backend, ...; sizes"; unavailable ones marked
        data["models"] = [
            f"{m.id} ({m.family}): "
            + ", ".join(f"{t.task}/{t.backend}" for t in m.tasks)
            + (f"; sizes {', '.join(m.sizes)}" if m.sizes != ["default"] else "")
            + ("" if m.available_in_version else f"; not in {r.mm_version}")
            for m in r.models
        ]
    return f"{r.count} models at MindSpeed-MM {r.mm_version}, one line each; {DETAIL_HINT}.", data


def _launch(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if r.run_id:  # started: what matters now is its id and log (the command is what a dry run showed)
        text = f"started {r.stage} run {r.run_id} for {r.job_dir} ({r.runtime}); log {r.log}."
        text += "\nFollow it with job_status, read it with tail_logs, stop it with stop_job."
        if not detail:
            data = {k: v for k, v in data.items() if k in ("status", "run_id", "stage", "job_dir", "log")}
        return text, data
    text = f"{r.status}: {r.stage} of {r.job_dir} ({r.runtime}). {_cut(r.message, 600)}"
    if not detail:
        data.pop("message", None)  # (the text says it)
    return text, data


def _convert(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    if not detail:
        plan = data.get("plan", {})
        files = plan.get("files") or plan.get("rank_files")
        if isinstance(files, list) and len(files) > 8:
            key = "files" if "files" in plan else "rank_files"
            plan[key] = files[:8]
            plan[f"{key}_more"] = len(files) - 8
        if isinstance(data.get("files"), list) and len(data["files"]) > 8:
            data["files_more"] = len(data["files"]) - 8
            data["files"] = data["files"][:8]
    text = f"{r.status}: {_cut(r.message, 400)}"
    for warning in r.warnings:  # NaN/Inf weights: converted, but say it where it is read
        text += f"\nwarning: {_cut(warning, 400)}"
    if r.run_id:
        text += f"\nrun_id {r.run_id}: follow with job_status."
    return text, data


BRIEF_REJECTED = 10  # rejected dataset items listed without detail (stats.reasons counts them all)
_LIMIT_KEYS = ("source", "num_frames", "max_height", "max_width", "max_hxw", "text_len", "global_batch_size")


def _dataset(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    data["written"] = r.written  # the contract: always present, null on a dry run
    if not detail:
        # a reason and fix said once: the next item rejected for the same one names the first (16 clips of
        # one small sample size were 16 copies of the same 360 characters)
        shown: list[dict[str, Any]] = []
        first: dict[tuple[str, str], str] = {}
        for rej in r.rejected[:BRIEF_REJECTED]:
            key = (rej.reason, rej.fix)
            shown.append({"path": rej.path, "same_as": first[key]} if key in first else rej.model_dump())
            first.setdefault(key, rej.path)
        data["rejected"] = shown
        if len(r.rejected) > BRIEF_REJECTED:
            data["rejected_more"] = len(r.rejected) - BRIEF_REJECTED
        data["limits"] = {k: v for k, v in data.get("limits", {}).items() if k in _LIMIT_KEYS}
        data["warnings"] = [_cut(w, 300) for w in r.warnings]
    if r.written:
        where = f"wrote {r.written}"
    elif not r.accepted:  # (with confirm=true too: nothing accepted, nothing written)
        where = "nothing written: no item accepted"
    else:
        where = f"dry run, would write {r.index}"
    text = f"{r.kind}: {r.accepted} accepted, {len(r.rejected)} rejected of {r.stats.found} ({where})."
    if r.stats.reasons:
        top = sorted(r.stats.reasons.items(), key=lambda kv: -kv[1])[:4]
        text += "\nRejected by reason: " + ", ".join(f"{k} {n}" for k, n in top) + " (each with its fix)."
    if r.rejected and not r.accepted:  # nothing to train on: the fix is the next step, in the text itself
        text += f"\nFix ({r.rejected[0].path}): {_cut(r.rejected[0].fix, 300)}"
    if r.warnings:
        text += f"\n{len(r.warnings)} warning(s), first: {_cut(r.warnings[0], 200)}"
    if r.next_steps:
        text += f"\nNext: {r.next_steps[0]}"
    return text, data


def _estimate(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    """The verdict and the biggest parts in the text; the contract keys and the top levers in the data."""
    keep = {"fits", "per_device_gb", "device_gb", "breakdown", "step_seconds", "run_hours", "epoch_hours"}
    data = _dump(r, include=keep | {"model", "size", "task", "device", "npus", "seq_tokens"})
    data["levers"] = [{"change": lv.change, "per_device_gb": lv.per_device_gb} for lv in r.levers[:3]]
    data["step_seconds"] = r.step_seconds  # the contract: always present, null when unknown
    verdict = "fits" if r.fits else "does NOT fit"
    parts = ", ".join(f"{k} {v:g}" for k, v in sorted(r.breakdown.items(), key=lambda kv: -kv[1])[:3])
    lines = [
        f"{r.model} {r.size} {r.task} on {r.npus} x {r.device}: {r.per_device_gb:g} of {r.device_gb:g} GB per "
        f"device, {verdict} (largest: {parts} GB); {r.seq_tokens:,} tokens/sample.",
    ]
    if r.step_seconds is not None:
        lines.append(f"Step {r.step_seconds:g} s for a global batch of {r.global_batch}.")
    if r.levers:
        best = r.levers[0]
        lines.append(f"Best lever: {best.change} -> {best.per_device_gb:g} GB ({len(r.levers)} in the data).")
    if not detail:
        lines.append(f"{DETAIL_HINT} (layout, parameter source, every lever).")
    return "\n".join(lines), data


def _scaffold(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    """What would be (or was) written, where, and the next command; each file as one line in the data (the
    texts are in the files, or in the whole model with detail=true)."""
    data = _dump(r)
    if not detail:
        data["files"] = [f"{f.action} {f.path}" for f in r.files]
        data["copy_commands"] = [shlex.join(argv) for argv in r.copy_commands]
    verb = {"dry_run": "would write", "written": "wrote", "unchanged": "left unchanged"}[r.status]
    where = "into the MindSpeed-MM checkout" if r.mode == "checkout" else "in the overlay folder"
    text = (
        f"{verb} {len(r.files)} files for {r.name} ({r.cls}, from {r.base}, MindSpeed-MM {r.mm_version}) "
        f"{where} {r.root}; registry entry {r.registry_file}."
    )
    if r.copy_commands:
        text += (
            f"\ncopy_commands: {len(r.copy_commands)} commands copy it into a checkout; register_lines go into "
            "predict_model.py."
        )
    if r.status == "dry_run":
        text += "\nconfirm=true writes them" + (
            "." if detail else f"; {DETAIL_HINT} (file roles, departures from the guide)."
        )
    if r.next_steps:
        text += f"\nnext_steps: {len(r.next_steps)} in order, first: {r.next_steps[0]}"
    return text, data


def _generic(r: Any, detail: bool) -> tuple[str, dict[str, Any]]:
    data = _dump(r)
    message = getattr(r, "message", None) or getattr(r, "status", None) or type(r).__name__
    return str(message), data


_SHAPERS: dict[str, Callable[[Any, bool], tuple[str, dict[str, Any]]]] = {
    "RouteResult": _route,
    "InstallResult": _install,
    "RenderResult": _render,
    "ValidationReport": _validate,
    "DiagnosisReport": _diagnose,
    "DoctorReport": _doctor,
    "JobStatus": _status,
    "LogTail": _tail,
    "ModelList": _models,
    "StageLaunch": _launch,
    "ConvertReport": _convert,
    "DatasetResult": _dataset,
    "EstimateResult": _estimate,
    "ScaffoldResult": _scaffold,
}


def answer(result: BaseModel, detail: bool = False) -> tuple[str, dict[str, Any]]:
    """(text summary, structured data) of a core result for an assistant; `detail` = the whole model."""
    shaper = _SHAPERS.get(type(result).__name__, _generic)
    text, data = shaper(result, detail)
    if detail:
        data = result.model_dump(mode="json")  # the whole model, as the core returns it
    return text, data

"""Every place MindSpeed-MM's own code raises an error or reports one, read with `ast` (nothing is imported).

A *site* is one of:

- `raise X(...)` / `raise X` where X names an exception class (a CapWords name ending in Error, Exception,
  Warning, Exit or Interrupt): the message is the first positional argument (or `msg=` / `message=`).
  `raise`, `raise e` and `raise make_error(...)` pass on an error built elsewhere and are not sites;
- `assert cond, "message"` (an AssertionError with that message; without a message, one with none);
- `ensure_valid(cond, "message")`: MindSpeed-MM's own check helper (mindspeed_mm/utils/utils.py) raises
  IsNotValidError with that message (calls without one print "Expression is not valid", which the
  mm_validate_args_failed signature knows, and are not sites);
- an error-level log call, `<logger>.error/critical/exception/fatal(...)` on a receiver named logger, log,
  logging, LOG, ... (also `self.logger`): what a run writes when it fails without a traceback;
- `print(...)` / `print_rank_0(...)` whose literal text starts with an error mark (`Error: ...`,
  `[ERROR] ...`): MindSpeed-MM reports several failures this way (a config file it could not parse).

Deliberately not sites: `warnings.warn`, `logger.warning`/`info` and prints starting with "Warning" (the run
goes on; the few that matter are catalogued as `warning`/`silent` signatures on their own), and other
prints (progress output).

A message is kept as a template: its literal text with `{}` for each hole (f-string fields, `.format()`
fields, `%` conversions; `{{`/`}}` are literal braces), adjacent and `+`-joined literals merged, and a
variable assigned a string earlier in the same function replaced by that string (with its `+=` parts). A
message with no literal text at all (`raise ValueError(msg)` with msg built elsewhere, `raise RuntimeError(e)`)
has an empty template and `dynamic` set to its source expression; no message at all gives both empty.
"""

from __future__ import annotations

import ast
import re
import string
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

from mm_agent.diagnose.catalog import CompiledSignature, match_line
from mm_agent.diagnose.upstream import UpstreamMessages

LOG_ERROR_METHODS = frozenset({"error", "critical", "exception", "fatal"})
# Receivers of a log call: names and attribute tails that are loggers (`logger`, `self.logger`, `logging`).
_LOGGER_NAME = re.compile(r"(?i)^(logger|logging|log|_logger|_log|LOG|LOGGER|mm_logger)$")

HOLE = "{}"
_PERCENT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfiexg]")
# A print that reports a failure: its literal text starts with an error mark ("Error: ...", "[ERROR] ...").
_ERROR_MARK = re.compile(r"(?i)^\W{0,3}error\b")


@dataclass(frozen=True)
class Site:
    """One raise/ensure_valid/error-log call in a source file."""

    file: str  # path inside the tree, POSIX, e.g. mindspeed_mm/data/data_utils/utils.py
    line: int
    kind: str  # "raise" | "assert" | "ensure_valid" | "log" | "print"
    exception: str  # exception class; "IsNotValidError" for ensure_valid; "logger.error"/"print" otherwise
    template: str  # literal text with {} holes; "" when nothing literal is known
    holes: tuple[str, ...] = ()  # the source of each hole's expression, in order
    dynamic: str = ""  # the source of the message expression when it has no literal text
    source: str = field(default="", compare=False)  # the statement's source text (for citations)

    @property
    def key(self) -> tuple[str, str, str]:
        """What identifies a message across versions (line numbers move between releases)."""
        return (self.file, self.exception, self.template or self.dynamic)


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _looks_like_exception_class(name: str) -> bool:
    return (
        bool(name)
        and name[0].isupper()
        and (name.endswith(("Error", "Exception", "Warning", "Exit", "Interrupt")) or name in {"Exception"})
    )


class _Source:
    """A file's text with its line offsets, so cutting out a node's source is cheap
    (`ast.get_source_segment` splits the whole file on every call)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)

    def segment(self, node: ast.AST) -> str:
        start, end = getattr(node, "lineno", 0), getattr(node, "end_lineno", None)
        if not start or end is None:
            return ast.unparse(node) if isinstance(node, ast.expr) else ""
        lines = self.lines[start - 1 : end]
        if not lines:
            return ""
        first_col, last_col = getattr(node, "col_offset", 0), getattr(node, "end_col_offset", None)
        # col offsets are UTF-8 byte offsets
        if len(lines) == 1:
            return lines[0].encode()[first_col:last_col].decode(errors="replace")
        head = lines[0].encode()[first_col:].decode(errors="replace")
        tail = lines[-1].encode()[:last_col].decode(errors="replace")
        return head + "".join(lines[1:-1]) + tail


class _Template:
    """Turns a message expression into (template, holes); None when it has no literal text."""

    def __init__(self, assigns: _Assigns, line: int, text: _Source) -> None:
        self.assigns = assigns
        self.line = line
        self.text = text
        self.depth = 0

    def render(self, node: ast.expr) -> tuple[str, list[str]] | None:
        self.depth += 1
        try:
            if self.depth > 20:
                return None
            return self._render(node)
        finally:
            self.depth -= 1

    def _src(self, node: ast.expr) -> str:
        return self.text.segment(node)

    def _render(self, node: ast.expr) -> tuple[str, list[str]] | None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return node.value.replace("{", "{{").replace("}", "}}"), []
            return None
        if isinstance(node, ast.JoinedStr):
            parts: list[str] = []
            holes: list[str] = []
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(value.value.replace("{", "{{").replace("}", "}}"))
                elif isinstance(value, ast.FormattedValue):
                    parts.append(HOLE)
                    holes.append(self._src(value.value))
            return "".join(parts), holes
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = self.render(node.left) or (HOLE, [self._src(node.left)])
            right = self.render(node.right) or (HOLE, [self._src(node.right)])
            if left[0] == HOLE and right[0] == HOLE:
                return None
            return left[0] + right[0], left[1] + right[1]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            base = self.render(node.left)
            if base is None:
                return None
            operands = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            count = len(_PERCENT.findall(base[0]))
            template = _PERCENT.sub(HOLE, base[0]).replace("%%", "%")
            return template, base[1] + [self._src(o) for o in operands][:count]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "format":
                raw = self._constant(node.func.value)
                if raw is None:
                    return None
                args = [self._src(a) for a in node.args] + [self._src(k.value) for k in node.keywords]
                return _format_template(raw, args)
            if node.func.attr in {"strip", "rstrip", "lstrip"}:
                return self.render(node.func.value)
        if isinstance(node, ast.Name):
            return self._resolve(node.id)
        return None

    def _constant(self, node: ast.expr) -> str | None:
        """The raw text of a string constant, directly or through a variable assigned one."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            history = [a for a in self.assigns.get(node.id, []) if a[0] < self.line and not a[2]]
            if history and isinstance(history[-1][1], ast.Constant) and isinstance(history[-1][1].value, str):
                return history[-1][1].value
        return None

    def _resolve(self, name: str) -> tuple[str, list[str]] | None:
        """The string last assigned to `name` in this function before the raise (plus `+=` after it)."""
        history = [a for a in self.assigns.get(name, []) if a[0] < self.line]
        if not history:
            return None
        start = max((i for i, (_, _, aug) in enumerate(history) if not aug), default=None)
        if start is None:
            return None
        template, holes = "", []
        for _, value, _aug in history[start:]:
            rendered = self.render(value)
            if rendered is None:
                rendered = (HOLE, [self._src(value)])
            template += rendered[0]
            holes += rendered[1]
        if not template.replace(HOLE, "").strip():
            return None
        return template, holes


def _format_template(raw: str, args: list[str]) -> tuple[str, list[str]]:
    """A `str.format` string as a template: its replacement fields become holes."""
    parts: list[str] = []
    holes: list[str] = []
    for literal, name, _spec, _conv in string.Formatter().parse(raw):
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            parts.append(HOLE)
            holes.append(name or (args[len(holes)] if len(holes) < len(args) else ""))
    return "".join(parts), holes


def _assignments(func: ast.AST) -> dict[str, list[tuple[int, ast.expr, bool]]]:
    found: dict[str, list[tuple[int, ast.expr, bool]]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append((node.lineno, node.value, False))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.setdefault(node.target.id, []).append((node.lineno, node.value, False))
        elif (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.op, ast.Add)
        ):
            found.setdefault(node.target.id, []).append((node.lineno, node.value, True))
    for entries in found.values():
        entries.sort(key=lambda e: e[0])
    return found


def _message_arg(call: ast.Call) -> ast.expr | None:
    if call.args:
        first = call.args[0]
        return None if isinstance(first, ast.Starred) else first
    for keyword in call.keywords:
        if keyword.arg in {"msg", "message", "error_message"}:
            return keyword.value
    return None


class _Assigns:
    """The string assignments of one function, read only when a message names a variable."""

    def __init__(self, function: ast.AST | None) -> None:
        self.function = function
        self.table: dict[str, list[tuple[int, ast.expr, bool]]] | None = None

    def get(self, name: str, default: list[tuple[int, ast.expr, bool]]) -> list[tuple[int, ast.expr, bool]]:
        if self.function is None:
            return default
        if self.table is None:
            self.table = _assignments(self.function)
        return self.table.get(name, default)


class _Walker(ast.NodeVisitor):
    """One pass over a module: each raise and call with the function it sits in."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.AST, _Assigns]] = []
        self.scope = _Assigns(None)

    def _enter(self, node: ast.AST) -> None:
        outer, self.scope = self.scope, _Assigns(node)
        self.generic_visit(node)
        self.scope = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _enter

    def visit_Raise(self, node: ast.Raise) -> None:
        self.found.append((node, self.scope))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.found.append((node, self.scope))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.found.append((node, self.scope))
        self.generic_visit(node)


def sites_in_source(text: str, rel: str) -> list[Site]:
    """The sites of one file's source text, in line order."""
    walker = _Walker()
    with warnings.catch_warnings():  # upstream's own invalid escape sequences are not ours to report
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        tree = ast.parse(text, filename=rel)
    walker.visit(tree)
    source = _Source(text)
    found = [site for node, scope in walker.found if (site := _site(node, rel, source, scope)) is not None]
    found.sort(key=lambda s: (s.line, s.kind))
    return found


def _site(node: ast.AST, rel: str, text: _Source, assigns: _Assigns) -> Site | None:
    if isinstance(node, ast.Assert):
        return _build(node, rel, text, assigns, "assert", "AssertionError", node.msg)
    if isinstance(node, ast.Raise):
        exc = node.exc
        if exc is None:
            return None
        if isinstance(exc, ast.Call):
            name = _call_name(exc.func)
            if not _looks_like_exception_class(name):
                return None  # `raise make_error(...)`, `raise self._error(...)`: built elsewhere
            message = _message_arg(exc)
        else:
            name = _call_name(exc)
            if not _looks_like_exception_class(name):
                return None  # `raise e`: passes on an error raised elsewhere
            message = None
        return _build(node, rel, text, assigns, "raise", name, message)
    if isinstance(node, ast.Call):
        name = _call_name(node.func)
        if name == "ensure_valid" and len(node.args) >= 2:
            return _build(node, rel, text, assigns, "ensure_valid", "IsNotValidError", node.args[1])
        if name == "ensure_valid":
            return None  # no message: "Expression is not valid" (the mm_validate_args_failed signature)
        if name in {"print", "print_rank_0"} and isinstance(node.func, ast.Name) and node.args:
            site = _build(node, rel, text, assigns, "print", name, node.args[0])
            return site if _ERROR_MARK.match(site.template) else None
        if isinstance(node.func, ast.Attribute) and name in LOG_ERROR_METHODS:
            receiver = node.func.value
            receiver_name = (
                receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
            )
            if _LOGGER_NAME.match(receiver_name):
                return _build(node, rel, text, assigns, "log", f"logger.{name}", _message_arg(node))
    return None


def _build(
    node: ast.AST,
    rel: str,
    text: _Source,
    assigns: _Assigns,
    kind: str,
    exception: str,
    message: ast.expr | None,
) -> Site:
    line = getattr(node, "lineno", 0)
    source = text.segment(node)
    if message is None:
        return Site(rel, line, kind, exception, "", (), "", source)
    rendered = _Template(assigns, line, text).render(message)
    if rendered is None or not rendered[0].replace(HOLE, "").strip():
        dynamic = text.segment(message)
        return Site(rel, line, kind, exception, "", (), dynamic, source)
    template, holes = rendered
    return Site(rel, line, kind, exception, template, tuple(holes), "", source)


def sites_in_tree(root: Path, package: str = "mindspeed_mm") -> list[Site]:
    """Every site under `root/package`, files in path order."""
    found: list[Site] = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        found.extend(sites_in_source(path.read_text(encoding="utf-8", errors="replace"), rel))
    return found


# --- rendering: the message as it would appear in a log -------------------------------------------------

_NUMBER_HINT = re.compile(
    r"(?i)(size|num|len|count|degree|rank|dim|step|iter|layer|head|frame|batch|world|interval|index|idx|"
    r"ratio|length|stride|epoch|micro|global|parallel|_pp|_tp|_cp|_dp|_ep|\bpp|\btp|\bcp|\bdp|\bep|width|height)"
)
_PATH_HINT = re.compile(r"(?i)(path|file|dir|folder|ckpt|checkpoint|load|save|root|json|yaml)")
_FILLERS = ("8", "value", "/data/example/file.json")


def _guess(hole: str) -> str:
    """A plausible value for one hole, from the name of the expression that fills it."""
    tail = re.split(r"[.\[(]", hole.strip())[-1] if hole else ""
    name = hole.lower()
    if name.startswith("type(") or name.endswith(".__name__") or "dtype" in name:
        return "torch.float32" if "dtype" in name else "str"
    if "shape" in name or name.endswith((".size", ".size()")):
        return "torch.Size([2, 16, 64])"
    if name.startswith("len("):
        return "8"
    if _PATH_HINT.search(name):
        return "/data/example/file.json"
    if _NUMBER_HINT.search(name) or tail.isdigit():
        return "8"
    return "value"


def fill(template: str, values: list[str]) -> str:
    """The template with its holes filled in order (`{{`/`}}` become literal braces)."""
    out: list[str] = []
    holes = iter(values)
    i = 0
    while i < len(template):
        pair = template[i : i + 2]
        if pair in {"{{", "}}"}:
            out.append(pair[0])
            i += 2
        elif pair == HOLE:
            out.append(next(holes, "value"))
            i += 2
        else:
            out.append(template[i])
            i += 1
    return "".join(out)


def renderings(site: Site) -> list[list[str]]:
    """The log lines the site could print: holes guessed from their names, then each uniform filler.

    A raise prints `<ExceptionClass>: <first line of the message>` then the message's further lines; an
    `IsNotValidError` carries its module path, as Python prints it; a log call prints the message itself.
    """
    if not site.template:
        return []
    count = site.template.replace("{{", "").replace("}}", "").count(HOLE)
    choices = [[_guess(site.holes[i]) if i < len(site.holes) else "value" for i in range(count)]]
    choices += [[filler] * count for filler in _FILLERS] if count else []
    result: list[list[str]] = []
    for values in choices:
        lines = fill(site.template, values).splitlines() or [""]
        if site.kind in {"log", "print"}:
            result.append(lines)
            continue
        name = (
            "mindspeed_mm.utils.utils.IsNotValidError"
            if site.exception == "IsNotValidError"
            else site.exception
        )
        result.append([f"{name}: {lines[0]}".rstrip(), *lines[1:]])
    return result


# --- judging: is a site's message known to the catalog, or listed as not for users? -----------------------


def traceback_line(site: Site) -> str:
    """The source line a Python traceback prints above the exception: the statement's first line."""
    first = site.source.splitlines()[0].strip() if site.source else ""
    return f"    {first}" if first else ""


@dataclass(frozen=True)
class Verdict:
    """How one site is covered: by a signature (`how` = message / traceback / citation), by a listed rule,
    or not at all (`how` = "")."""

    site: Site
    how: str
    by: str  # signature id or rule id; "" when uncovered
    generic: bool = False  # matched only by a catch-all signature


def _known(line: str, catalog: tuple[CompiledSignature, ...]) -> CompiledSignature | None:
    hits = [entry for entry, _ in match_line(line, catalog) if entry.sig.category not in {"unknown", "none"}]
    return min(hits, key=lambda e: (e.sig.generic, e.sig.id)) if hits else None


def judge(site: Site, catalog: tuple[CompiledSignature, ...], listed: UpstreamMessages) -> Verdict:
    """The first way the site is covered, trying the cheapest explanation a user would get first."""
    best: CompiledSignature | None = None
    for lines in renderings(site):
        for line in lines:
            entry = _known(line, catalog)
            if entry is not None and (best is None or (best.sig.generic and not entry.sig.generic)):
                best = entry
    if best is not None:
        return Verdict(site, "message", best.sig.id, best.sig.generic)
    shown = traceback_line(site)
    entry = _known(shown, catalog) if shown else None
    if entry is not None:
        return Verdict(site, "traceback", entry.sig.id, entry.sig.generic)
    for entry in catalog:
        for source in entry.sig.upstream:
            if source.repo == "MindSpeed-MM" and source.file == site.file and source.text in site.source:
                return Verdict(site, "citation", entry.sig.id, entry.sig.generic)
    rule = listed.rule_for(site.file, site.exception, site.template, site.dynamic)
    if rule is not None:
        return Verdict(site, "listed", rule.id)
    return Verdict(site, "", "")


def judge_trees(
    trees: dict[str, list[Site]], catalog: tuple[CompiledSignature, ...], listed: UpstreamMessages
) -> dict[str, list[Verdict]]:
    """Verdicts per tree; a message (file, class, text) is judged once over all trees (most repeat)."""
    seen: dict[tuple[str, str, str], Verdict] = {}
    out: dict[str, list[Verdict]] = {}
    for name, sites in trees.items():
        out[name] = []
        for site in sites:
            if site.key not in seen:
                seen[site.key] = judge(site, catalog, listed)
            out[name].append(replace(seen[site.key], site=site))
    return out


def summary(verdicts: list[Verdict]) -> dict[str, int]:
    """Counts for the coverage report: specific / catch-all signature matches, listed, uncovered, total."""
    return {
        "total": len(verdicts),
        "signature": sum(1 for v in verdicts if v.how not in {"", "listed"} and not v.generic),
        "catch_all": sum(1 for v in verdicts if v.how not in {"", "listed"} and v.generic),
        "listed": sum(1 for v in verdicts if v.how == "listed"),
        "uncovered": sum(1 for v in verdicts if not v.how),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the coverage table: `python -m tests.fidelity.raise_sites UPSTREAM [--catalog DIR]`.

    `--catalog` judges with another signature folder (e.g. an older commit's, from `git archive`) to measure
    coverage before a change; the not-user-facing list is always the current one.
    """
    import argparse

    from mm_agent.diagnose.catalog import load_catalog
    from mm_agent.diagnose.upstream import load_upstream_messages

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("upstream", type=Path, help="folder holding MindSpeed-MM/v<version>/ trees")
    parser.add_argument(
        "--catalog", type=Path, default=None, help="signature folder (default: the shipped one)"
    )
    parser.add_argument("--versions", nargs="+", default=["26.0.0", "26.1.0"])
    parser.add_argument("--uncovered", action="store_true", help="list the uncovered sites")
    args = parser.parse_args(argv)
    catalog = load_catalog(args.catalog)
    listed = load_upstream_messages()
    trees = {v: sites_in_tree(args.upstream / "MindSpeed-MM" / f"v{v}") for v in args.versions}
    verdicts = judge_trees(trees, catalog, listed)
    print("version  sites  not-user-facing  user-facing  matched (signature + catch-all)  uncovered")
    for version, found in verdicts.items():
        listed_ids = [
            listed.rule_for(v.site.file, v.site.exception, v.site.template, v.site.dynamic) for v in found
        ]
        user = [v for v, rule in zip(found, listed_ids, strict=True) if rule is None]
        c = summary(user)
        matched = c["signature"] + c["catch_all"]
        print(
            f"{version:8} {len(found):5} {len(found) - len(user):16} {len(user):12} "
            f"{matched:8} ({c['signature']} + {c['catch_all']}) {c['uncovered']:20}"
        )
        if args.uncovered:
            for v in user:
                if not v.how:
                    print(
                        f"  {v.site.file}:{v.site.line} {v.site.exception}: {v.site.template or v.site.dynamic}"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Static expansion of bash words: quotes, `$VAR`, `${VAR:-default}`, `$(( arithmetic ))` and the
job-dir idiom `$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)`.

Anything that needs running a command is *unknown*: the word it is part of expands to `None`.
Undefined variables are unknown too (they may come from the launcher's environment).
"""

from __future__ import annotations

import ast
import operator
import os
import re
from collections.abc import Callable

Env = dict[str, str | None]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SELF = r"(?:\$\{BASH_SOURCE(?:\[0\])?\}|\$BASH_SOURCE|\$0|\$\{0\})"
_DIRNAME = rf"\$\(\s*dirname\s+(?:--\s+)?\"?{_SELF}\"?\s*\)"
_CD_PWD = re.compile(
    rf"^\s*cd\s+(?:--\s+)?\"?{_DIRNAME}\"?(?P<rel>/[^\"\s;&|]*)?\"?\s*(?:&&|;)\s*pwd(?:\s+-P)?\s*$"
)
_BARE_DIRNAME = re.compile(rf"^\s*dirname\s+(?:--\s+)?\"?{_SELF}\"?\s*$")


class Expander:
    """Expands words against `env`; `script` is the path `${BASH_SOURCE[0]}` / `$0` stand for."""

    def __init__(self, env: Env, script: str) -> None:
        self.env = env
        self.script = script

    # ---- words -------------------------------------------------------------------------------------
    def word(self, raw: str) -> list[str | None]:
        """Expand one raw word into fields (unquoted expansions are split on whitespace)."""
        fields: list[str | None] = []
        cur: list[str] = []
        state = {"has": False, "unknown": False}

        def flush() -> None:
            if state["has"]:
                fields.append(None if state["unknown"] else "".join(cur))
            cur.clear()
            state.update(has=False, unknown=False)

        i = 0
        while i < len(raw):
            c = raw[i]
            if c == "'":
                j = raw.find("'", i + 1)
                j = len(raw) if j < 0 else j
                cur.append(raw[i + 1 : j])
                state["has"] = True
                i = j + 1
            elif c == '"':
                text, i = self._dquote(raw, i + 1)
                if text is None:
                    state["unknown"] = True
                else:
                    cur.append(text)
                state["has"] = True
            elif c == "\\":
                if raw[i + 1 : i + 2] != "\n":
                    cur.append(raw[i + 1 : i + 2])
                    state["has"] = True
                i += 2
            elif c == "`":
                j = raw.find("`", i + 1)
                i = len(raw) if j < 0 else j + 1
                state.update(has=True, unknown=True)
            elif c == "$":
                value, i = self._dollar(raw, i)
                if value is None:
                    state.update(has=True, unknown=True)
                    continue
                pieces = value.split()
                if value[:1].isspace():
                    flush()
                for k, piece in enumerate(pieces):
                    if k:
                        flush()
                    cur.append(piece)
                    state["has"] = True
                if value[-1:].isspace():
                    flush()
            else:
                cur.append(c)
                state["has"] = True
                i += 1
        flush()
        return fields

    def text(self, raw: str) -> str | None:
        """Expand a word without field splitting (assignment values, defaults)."""
        fields = self.word(raw)
        if any(f is None for f in fields):
            return None
        return " ".join(f for f in fields if f is not None)

    # ---- pieces ------------------------------------------------------------------------------------
    def _dquote(self, raw: str, i: int, *, nested: bool = False) -> tuple[str | None, int]:
        """Expand double-quoted text from raw[i] to its closing quote. `nested`: the word of a `${X:-word}`
        inside double quotes, which runs to the end of `raw`; there single quotes are plain characters and
        `$(...)` still runs (`"${X:-'$(id)'}"` runs id), as bash reads it."""
        out: list[str] = []
        unknown = False
        while i < len(raw) and (nested or raw[i] != '"'):
            c = raw[i]
            if c == '"':  # only when nested: a quote inside the word groups, it is not kept
                i += 1
            elif c == "\\" and i + 1 < len(raw):
                nxt = raw[i + 1]
                if nxt != "\n":
                    out.append(nxt if nxt in '$`"\\' else c + nxt)
                i += 2
            elif c == "$":
                value, i = self._dollar(raw, i, quoted=True)
                if value is None:
                    unknown = True
                else:
                    out.append(value)
            elif c == "`":
                j = raw.find("`", i + 1)
                i = len(raw) if j < 0 else j + 1
                unknown = True
            else:
                out.append(c)
                i += 1
        return (None if unknown else "".join(out)), i + 1

    def _dollar(self, raw: str, i: int, *, quoted: bool = False) -> tuple[str | None, int]:
        """Expand the `$...` starting at raw[i] (`quoted`: inside double quotes); return (value or None,
        index after it)."""
        rest = raw[i + 1 :]
        if rest.startswith("(("):
            end = matching(raw, i + 1, "(", ")")
            return self.arith(raw[i + 3 : end - 1]), end + 1
        if rest.startswith("("):
            end = matching(raw, i + 1, "(", ")")
            return self.command(raw[i + 2 : end]), end + 1
        if rest.startswith("{"):
            end = matching(raw, i + 1, "{", "}")
            return self._brace(raw[i + 2 : end], quoted), end + 1
        m = _NAME.match(rest)
        if m:
            return self.lookup(m.group()), i + 1 + m.end()
        if rest[:1] == "0":
            return self.script, i + 2
        if rest[:1] and rest[0] in "123456789@*#?$!-":
            return None, i + 2
        return "$", i + 1

    def lookup(self, name: str) -> str | None:
        if name == "BASH_SOURCE":
            return self.script
        return self.env.get(name)

    def _brace(self, body: str, quoted: bool) -> str | None:
        if body in ("BASH_SOURCE[0]", "0"):
            return self.script
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])(.*)$", body, re.S)
        if m:
            name, op, default = m.groups()
            known = name in self.env
            value = self.env.get(name)
            if known and value is None:
                return None
            is_set = known and (value != "" or not op.startswith(":"))
            if op.endswith("+"):
                return self._word_of(default, quoted) if is_set else ""
            if is_set:
                return value
            if op.endswith("?"):
                return None
            expanded = self._word_of(default, quoted)
            if op.endswith("="):
                self.env[name] = expanded
            return expanded
        if _NAME.fullmatch(body):
            return self.lookup(body)
        return None

    def _word_of(self, word: str, quoted: bool) -> str | None:
        """The word of `${X:-word}`: inside double quotes it is read as double-quoted text."""
        return self._dquote(word, 0, nested=True)[0] if quoted else self.text(word)

    def command(self, body: str) -> str | None:
        """Only the job-dir idiom is understood; every other command substitution is unknown."""
        here = os.path.dirname(self.script)
        m = _CD_PWD.match(body)
        if m:
            return os.path.normpath(here + (m.group("rel") or ""))
        if _BARE_DIRNAME.match(body):
            return here
        return None

    def arith(self, expr: str) -> str | None:
        expanded: list[str] = []
        i = 0
        while i < len(expr):
            if expr[i] == "$":
                value, i = self._dollar(expr, i)
                if value is None:
                    return None
                expanded.append(value)
            else:
                expanded.append(expr[i])
                i += 1
        text = "".join(expanded)
        names_ok = True

        def sub(m: re.Match[str]) -> str:
            nonlocal names_ok
            value = self.env.get(m.group())
            if value is None or not re.fullmatch(r"\s*-?\d+\s*", value):
                names_ok = False
                return "0"
            return f"({value.strip()})"

        text = _NAME.sub(sub, text)
        if not names_ok:
            return None
        result = safe_int_eval(text)
        return None if result is None else str(result)


def matching(raw: str, i: int, open_c: str, close_c: str) -> int:
    """Index of the bracket closing raw[i] (== open_c), skipping quoted text; len(raw) if none."""
    depth = 0
    j = i
    while j < len(raw):
        c = raw[j]
        if c == "\\":
            j += 2
            continue
        if c == "'" and open_c != "{":
            k = raw.find("'", j + 1)
            j = len(raw) if k < 0 else k + 1
            continue
        if c == '"':
            k = j + 1
            while k < len(raw) and raw[k] != '"':
                k += 2 if raw[k] == "\\" else 1
            j = k + 1
            continue
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(raw)


def _div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a: int, b: int) -> int:
    return a - b * _div(a, b)


_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.FloorDiv: _div,
    ast.Mod: _mod,
    ast.Pow: operator.pow,
}


def safe_int_eval(text: str) -> int | None:
    """Evaluate bash integer arithmetic (+ - * / % ** and parentheses); None when not that."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (
                right < 0 or right * (max(abs(left), 2).bit_length() - 1) > 63
            ):
                raise ValueError("exponent out of range")
            result = _BINOPS[type(node.op)](left, right)
            if abs(result) >= 2**63:  # bash arithmetic is 64-bit
                raise ValueError("overflow")
            return result
        raise ValueError("unsupported")

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None

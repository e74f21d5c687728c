"""How file names that are not UTF-8 become text: escaped, never as lone surrogates.

A name made on a Windows/GBK machine (an unzipped archive) holds bytes that are not UTF-8. Python hands
such a name around as a `str` with lone surrogates (PEP 383: byte 0xff becomes U+DCFF), which works for
opening the file but cannot be encoded as UTF-8: a reply carrying one made the MCP SDK's writer raise
"surrogates not allowed" and the server died, and the CLI printed a traceback. So a name becomes text only
through `shown`, which writes each such byte as `\\xff` (what Python's backslashreplace prints for the name's
bytes), and every reply, resource, prompt, error and CLI line passes through `shown`/`shown_data` once more
at the boundary, so no future tool can carry one out. Paths used to open files keep their real names.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import shlex
from pathlib import PurePath
from typing import Any, TypeVar

from pydantic import BaseModel

from mm_agent.errors import MMAgentError

_SURROGATE = re.compile("[\ud800-\udfff]")
ERRORS = "mm_agent.shown"  # codec error handler name: `stream.reconfigure(errors=ERRORS)`
M = TypeVar("M", bound=BaseModel)


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape carries it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"  # any other (never from a file name)


def shown(text: str) -> str:
    """`text` with each lone surrogate escaped: a non-UTF-8 byte of a name as `\\xNN`, any other as `\\uNNNN`."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: _escape(m.group()), text)


def shown_path(path: str | PurePath) -> str:
    """A path as text for a reply or a message (see `shown`)."""
    return shown(os.fspath(path))


def is_utf8(text: str) -> bool:
    """Whether `text` (a name from the file system) can be written as UTF-8 as it is."""
    return _SURROGATE.search(text) is None


def rename_fix(folder: str | PurePath | None = None) -> str:
    """The fix for a name that is not UTF-8: rename to UTF-8 (GBK is the common source; convmv converts a
    whole tree, and only with --notest does it rename)."""
    where = shlex.quote(shown_path(folder)) if folder is not None else "<folder>"
    return (
        f"rename it to UTF-8, e.g. `convmv -f gbk -t utf8 -r --notest {where}` (names from a Windows/GBK "
        "archive; use the archive's code page with -f), or unzip with `unzip -O gbk`"
    )


def shown_data(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, strings, numbers, and pydantic models of them) with every
    string passed through `shown`, keys included; the very same object when nothing needed escaping, so the
    common case copies nothing. A model is copied with the changed fields replaced (not validated again:
    the escaped text is still a str where a str was)."""
    if isinstance(value, dict | list):  # every answer's data: one C-speed pass finds the common case
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be encoded
            return value
        except (UnicodeEncodeError, TypeError, ValueError):
            pass  # a surrogate somewhere, or not plain JSON (a model inside): walk it
    return _shown_data(value)


def _shown_data(value: Any) -> Any:
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, BaseModel):
        fields = {name: getattr(value, name) for name in type(value).model_fields}
        fields |= value.model_extra or {}
        # (each field by `shown_data`: a JSON-RPC message's `result` dict gets the one-pass check)
        updates = {k: new for k, old in fields.items() if (new := shown_data(old)) is not old}
        return value.model_copy(update=updates) if updates else value
    if isinstance(value, dict):
        items = [(_shown_data(k), _shown_data(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        out = [_shown_data(v) for v in value]
        if all(a is b for a, b in zip(out, value, strict=True)):
            return value
        return type(value)(out) if isinstance(value, tuple) else out
    return value


def has_surrogates(value: Any) -> bool:
    """Whether `value` (as for `shown_data`) holds a string that cannot be written as UTF-8."""
    return shown_data(value) is not value


def shown_model(model: M) -> M:
    """`model` with every string escaped (a copy only when one needed it)."""
    clean: M = shown_data(model)
    return clean


_STOP = " \t\r\n\"',=;:()[]{}<>"


def _word(text: str, start: int, end: int) -> str:
    """The path-like word of `text` around `start:end` (what to rename), not the whole text it sits in."""
    while start > 0 and text[start - 1] not in _STOP and end - start < 400:
        start -= 1
    while end < len(text) and text[end] not in _STOP and end - start < 500:
        end += 1
    return text[start:end]


def text_error(exc: Exception) -> MMAgentError | None:
    """The user-facing error for an exception raised where text meets bytes, or None for any other: a name
    that is not UTF-8 reached a place that writes text (encode, JSON), or a file that is not UTF-8 was read
    as text. A tool that does not handle such input itself still answers with what is wrong and the fix."""
    if isinstance(exc, UnicodeEncodeError) or (
        type(exc).__name__ == "PydanticSerializationError" and "surrogates not allowed" in str(exc)
    ):
        around = ""
        if isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str):
            around = f": {shown(_word(exc.object, exc.start, exc.end))}"
        return MMAgentError(
            f"a file or folder name is not UTF-8 (its bytes are shown as \\xNN){around}", fix=rename_fix()
        )
    if isinstance(exc, UnicodeDecodeError):
        return MMAgentError(
            f"a file is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
            fix="re-save it as UTF-8 (e.g. `iconv -f GBK -t UTF-8 in > out`)",
        )
    return None


def not_text(err: Any) -> MMAgentError | None:
    """A pydantic error (one of `ValidationError.errors()`) for a value that is no valid text, as the
    user-facing error; None for any other. pydantic refuses such a str where a field is checked (a path given
    on the command line whose name is not UTF-8), with a message that does not say why."""
    if err.get("type") != "string_unicode":
        return None
    where = ".".join(str(p) for p in err.get("loc", ())) or None
    value = err.get("input")
    what = f"{shown(value)} (bytes shown as \\xNN)" if isinstance(value, str) else "the value"
    return MMAgentError(
        f"{what} holds a name that is not UTF-8 (bytes from another encoding)",
        field=where,
        fix=rename_fix(),
    )


def _handler(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: what `shown` writes, for a stream that meets a lone surrogate (the CLI's)."""
    if isinstance(exc, UnicodeEncodeError):
        return "".join(_escape(c) for c in exc.object[exc.start : exc.end]), exc.end
    raise exc


codecs.register_error(ERRORS, _handler)

"""Which file the doctor may run as `python`.

`check_environment` is read-only, yet it runs the interpreter it is given. Given a rendered job's
`finetune.sh` it ran the script. So `python` must be a CPython interpreter by its own identity, decided
WITHOUT running it:

- its folder lies inside the workspace (or an allowed root); the file itself may be a symlink, as a
  venv's `bin/python` is, to a system interpreter anywhere;
- what it leads to is a regular, executable, dynamically linked ELF program (not a `#!` script, not a
  shared library), and
- its dynamic symbol table names `Py_BytesMain`, the function CPython 3.8+'s `main()` calls. The rule
  holds for every build that can load extension modules (torch is one): on Linux those are not linked
  against libpython, so the interpreter must put the C API in its dynamic symbol table, either by
  exporting it (libpython linked in statically: Debian's /usr/bin/python3.x, conda) or by loading
  libpython3.x.so, whose `Py_BytesMain` its `main()` then imports (`--enable-shared`: pyenv);
  tests/security/test_doctor_hardening.py accepts a venv of each kind. A shell, perl or any other
  program has no such symbol; a fully static or pre-3.8 Python is refused too (MindSpeed-MM needs 3.10).

The probes then execute the very descriptor that was checked (`contained.run_contained(exec_fd=)`), so
swapping the file after the check changes nothing.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import check_text, confine, require_regular, resolve

FIELD = "python"
FIX = "pass the training environment's interpreter, e.g. <venv>/bin/python (a CPython 3.8+ executable)"
ENTRY_SYMBOL = b"Py_BytesMain"
_MAX_TABLE = 64 * 1024 * 1024  # a real dynamic symbol table is a few MB at most
_PT_INTERP = 3
_SHT_DYNSYM = 11
_ET_EXEC, _ET_DYN = 2, 3
# ELF class (32/64-bit) -> (struct layout of the header after e_ident, of a section header)
_LAYOUT = {
    1: ("HHIIIIIHHHHHH", "IIIIIIIIII"),  # 32-bit
    2: ("HHIQQQIHHHHHH", "IIQQQQIIQQ"),  # 64-bit
}


def interpreter_path(value: str, root: Path | None, base: Path) -> Path:
    """The absolute path `value` names, its folder resolved (and confined to the workspace with `root`);
    the last component is kept, so a venv's `bin/python` symlink stays the venv's."""
    check_text(value, FIELD)
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (root or base) / path
    if path.name in ("", ".", ".."):
        raise MMAgentError(f"{value!r} names a folder, not an interpreter", field=FIELD, fix=FIX)
    if root is None:
        return resolve(path.parent, FIELD) / path.name
    try:
        return confine(str(path.parent), root, FIELD) / path.name
    except MMAgentError as exc:
        raise MMAgentError(
            f"the folder of {value!r}: {exc.message}",
            field=FIELD,
            fix=f"{exc.fix}; {FIX} (its bin/python may be a symlink to a system interpreter)",
        ) from None


def open_interpreter(path: Path) -> int:
    """A read-only descriptor of the file `path` leads to, checked to be a CPython executable (see the
    module docstring). The caller closes it."""
    try:
        require_regular(path, FIELD)  # a FIFO or device is refused before it is opened
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except MMAgentError as exc:
        raise MMAgentError(exc.message, file=str(path), field=FIELD, fix=FIX) from None
    except OSError as exc:
        raise MMAgentError(os_error(exc).message, file=str(path), field=FIELD, fix=FIX) from None
    try:
        problem = _not_python(fd)
    except (OSError, struct.error, ValueError) as exc:
        problem = f"its ELF headers are unreadable ({exc})"
    if problem is not None:
        os.close(fd)
        raise MMAgentError(f"not a Python interpreter: {problem}", file=str(path), field=FIELD, fix=FIX)
    return fd


def check_interpreter(path: Path) -> None:
    """Refuse `path` (MMAgentError naming the field and the fix) unless it is a CPython executable."""
    os.close(open_interpreter(path))


def _read(fd: int, offset: int, size: int) -> bytes:
    if size < 0 or size > _MAX_TABLE:
        raise ValueError(f"a table of {size} bytes")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ValueError("the file is truncated")
    return data


def _not_python(fd: int) -> str | None:
    """Why the open file is not a CPython executable, or None when it is."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if not st.st_mode & 0o111:
        return "it is not executable"
    ident = os.pread(fd, 16, 0)
    if ident[:2] == b"#!":
        return "it is a script (it starts with #!), not an interpreter binary"
    if ident[:4] != b"\x7fELF" or ident[4] not in _LAYOUT or ident[5] not in (1, 2):
        return "it is not an ELF executable"
    order = "<" if ident[5] == 1 else ">"
    header, section = _LAYOUT[ident[4]]
    size = struct.calcsize(order + header)
    (e_type, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = struct.unpack(
        order + header, _read(fd, 16, size)
    )
    if e_type not in (_ET_EXEC, _ET_DYN):
        return "it is an ELF object, not an executable"
    table = _read(fd, phoff, phentsize * phnum)
    types = {struct.unpack_from(order + "I", table, i * phentsize)[0] for i in range(phnum)}
    if _PT_INTERP not in types:
        return "it is a shared library or a static binary, not a dynamically linked program"
    if ENTRY_SYMBOL in _dynamic_names(fd, order, section, shoff, shentsize, shnum):
        return None
    return (
        f"it neither defines nor imports {ENTRY_SYMBOL.decode()}, the entry point of every CPython 3.8+ "
        "interpreter (a shell or another program?)"
    )


def _dynamic_names(fd: int, order: str, layout: str, shoff: int, shentsize: int, shnum: int) -> set[bytes]:
    """Names in the dynamic symbol table (.dynsym, with the string table its sh_link names)."""
    headers = _read(fd, shoff, shentsize * shnum)

    def section(i: int) -> tuple[int, ...]:
        return struct.unpack_from(order + layout, headers, i * shentsize)

    names: set[bytes] = set()
    for i in range(shnum):
        _, sh_type, _, _, offset, size, link, _, _, entsize = section(i)
        if sh_type != _SHT_DYNSYM or not entsize or link >= shnum:
            continue
        strings = _read(fd, section(link)[4], section(link)[5])
        symbols = _read(fd, offset, size)
        for j in range(size // entsize):
            start = struct.unpack_from(order + "I", symbols, j * entsize)[0]
            end = strings.find(b"\0", start)
            names.add(strings[start : end if end >= 0 else len(strings)])
    return names

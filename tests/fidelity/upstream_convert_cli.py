"""Child process: MindSpeed-MM's own converter CLI parses converter commands, and runs none of them.

Usage: `python upstream_convert_cli.py SPEC_JSON`, SPEC = {"root": a MindSpeed-MM tree, "scratch": an empty
folder, "cases": [argv, ...]}. Each argv is a whole command as a user would type it: `["mm-convert", <Class>,
...]` (the console script MindSpeed-MM's pyproject.toml installs: `checkpoint.convert_cli:main`) or
`["python", "-c", CODE, <Class>, ...]` (the form mm-agent renders for a converter whose module
`checkpoint/__init__.py` does not import). The command's own program runs: `main()` of that tree's
`checkpoint/convert_cli.py`, or CODE, with `sys.argv` as the shell would set it. It calls
`jsonargparse.auto_cli(Commandable.subclasses, as_positional=False)`, and that one call is replaced: the
parser is built by `jsonargparse.auto_parser` from the same arguments and `parse_args` reads the command line;
nothing is instantiated and no converter method runs (so the weights need not exist).

What the parser checks is all jsonargparse checks: the converter class and method exist as subcommands,
every flag is a parameter, required parameters are there, values have their types (pydantic
`DirectoryPath` fields check that the folder exists). The folders a command names are therefore created
first, empty, under `scratch` (a relative path under the current directory, which is `scratch`; an absolute
one only when it lies inside `scratch`, anything else is left as it is), as a user's downloaded weights would
be there.

Each case starts from the same state: the `checkpoint` package imported (as `mm-convert` imports it) and
nothing else of the tree; modules of the tree a case's CODE imports, and the converter classes they register
in `Commandable.subclasses`, are dropped after it, so one case's imports never make another case's class
visible. Imports are real (torch, transformers, pydantic, safetensors): MindSpeed-MM's `checkpoint/`
imports on CPU without stand-ins.

Prints one JSON line per case: {"argv", "ok", "error" (the parser's message, or the exception), "parsed"
(the subcommands the parser chose, e.g. ["WanConverter", "hf_to_mm"]), "checkpoint" (the file the
`checkpoint` package was imported from, so the parent can tell which tree judged)}.
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

SPEC = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
ROOT = str(Path(SPEC["root"]).resolve())
SCRATCH = Path(SPEC["scratch"]).resolve()
PYTHONS = ("python", "python3")


class Parsed(Exception):
    """Raised by the stand-in for `auto_cli` after parse_args: what the CLI would have run next."""

    def __init__(self, chosen: list[str]) -> None:
        super().__init__(" ".join(chosen))
        self.chosen = chosen


def _chosen(namespace: Any) -> list[str]:
    out: list[str] = []
    node = namespace
    while node is not None and isinstance(getattr(node, "subcommand", None), str):
        out.append(node.subcommand)
        node = getattr(node, node.subcommand, None)
    return out


_PARSERS: dict[Any, Any] = {}


def _parse_only(components: Any = None, args: list[str] | None = None, **kwargs: Any) -> Any:
    """`jsonargparse.auto_cli` up to its parse_args: the same parser, errors raised instead of exiting.

    Building the parser over all converter classes takes seconds, so a parser is kept for the same
    component objects and arguments (a case that imports a module gets new class objects, so its own)."""
    import jsonargparse

    kwargs["exit_on_error"] = False
    key = (tuple(id(c) for c in components or ()), repr(sorted(kwargs.items())))
    if key not in _PARSERS:  # the components are kept with their parser, so their ids stay theirs
        _PARSERS[key] = (list(components or ()), jsonargparse.auto_parser(components, **kwargs))
    raise Parsed(_chosen(_PARSERS[key][1].parse_args(args)))


def _make_dirs(values: list[str]) -> None:
    """The folders a command names, created empty (see the module docstring)."""
    for value in values:
        if value.startswith(("-", "[", "{")) or value.lstrip("-").isdigit() or value in ("true", "false"):
            continue
        path = Path(value)
        target = (SCRATCH / path).resolve() if not path.is_absolute() else path.resolve()
        if target.is_relative_to(SCRATCH):
            target.mkdir(parents=True, exist_ok=True)


def _from_tree(module: Any) -> bool:
    """A module of the MindSpeed-MM tree (what a case's code imports; jsonargparse's own lazily imported
    modules stay, as they would in one process)."""
    return str(getattr(module, "__file__", None) or "").startswith(ROOT + os.sep)


def _program(argv: list[str]) -> tuple[str, str]:
    """(code to run, argv[0] as the program sees it) of a converter command."""
    if argv[0] == "mm-convert":
        return "from checkpoint.convert_cli import main\nmain()", "mm-convert"  # the console script
    if argv[0] in PYTHONS and len(argv) > 2 and argv[1] == "-c":
        return argv[2], "-c"
    raise ValueError(f"not a converter command (mm-convert or python -c): {argv[:3]}")


def _case(argv: list[str], base_modules: set[str], base_classes: list[Any]) -> dict[str, Any]:
    import jsonargparse
    from checkpoint.common.converter import Commandable

    line: dict[str, Any] = {"argv": argv, "ok": False, "error": None, "parsed": None}
    out, err = io.StringIO(), io.StringIO()
    try:
        code, prog = _program(argv)
        args = argv[3:] if prog == "-c" else argv[1:]
        _make_dirs(args)
        sys.argv = [prog, *args]
        with redirect_stdout(out), redirect_stderr(err):
            exec(compile(code, f"<{prog}>", "exec"), {"__name__": "__main__"})
        line["error"] = "the command returned without calling jsonargparse.auto_cli"
    except Parsed as done:
        line.update(ok=True, parsed=done.chosen)
    except SystemExit as stop:  # a parser that exits (it should not: exit_on_error=False)
        line["error"] = f"exit {stop.code}: {err.getvalue()[-2000:]}"
    except Exception as exc:  # jsonargparse.ArgumentError and whatever the program raised
        line["error"] = (
            f"{type(exc).__name__}: {exc}"
            if isinstance(exc, jsonargparse.ArgumentError)
            else traceback.format_exc()[-3000:]
        )
    finally:
        for name in set(sys.modules) - base_modules:
            if _from_tree(sys.modules[name]):
                del sys.modules[name]
        Commandable.subclasses[:] = base_classes
    return line


def main() -> int:
    os.chdir(SCRATCH)
    sys.path.insert(0, ROOT)
    import checkpoint.convert_cli  # noqa: F401  (what the mm-convert console script imports first)
    import jsonargparse
    from checkpoint.common.converter import Commandable

    jsonargparse.auto_cli = _parse_only
    base_modules, base_classes = set(sys.modules), list(Commandable.subclasses)
    for argv in SPEC["cases"]:
        line = _case(argv, base_modules, base_classes)
        line["checkpoint"] = getattr(sys.modules.get("checkpoint"), "__file__", None)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

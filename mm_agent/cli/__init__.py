"""`mm-agent` command line: one module per subcommand, each a thin call into the typed core.

Errors are turned into a clean message at exactly one place (`main`): `MMAgentError` prints the problem,
where it is and the fix, and exits 2; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from mm_agent import __version__, names
from mm_agent.errors import MMAgentError

# The subcommand modules, in the order `mm-agent --help` lists them. Imported when the parser is built, so
# `mm-agent serve` (an MCP host starts it for every session) loads only its own module: see build_parser.
COMMANDS = (
    "models",
    "route",
    "dataset",
    "render",
    "validate",
    "estimate",
    "ranktable",
    "diagnose",
    "doctor",
    "install",
    "convert",
    "stages",
    "jobs",
    "status",
    "logs",
    "ps",
    "stop",
    "demo",
    "new_model",
    "skills",
    "serve",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` just that subcommand (same options, help and errors): every
    subcommand module imports its part of the core to build its options, and `serve` needs none of them, so
    an MCP server starts without paying for the other commands' imports."""
    parser = argparse.ArgumentParser(
        prog="mm-agent",
        description="Take a multimodal model from a plain request to a validated MindSpeed-MM job.",
        epilog='Start with: mm-agent route "fine-tune Wan2.1 text-to-video on 8 NPUs"',
    )
    parser.add_argument("--version", action="version", version=f"mm-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is None or name == only:
            importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def _escaping_streams() -> None:
    """stdout and stderr write a name that is not UTF-8 escaped (`\\xff`, as `names.shown` does) instead of
    raising in the middle of a report: no path printed by any command can end in a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors=names.ERRORS)


def main(argv: Sequence[str] | None = None) -> int:
    _escaping_streams()
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] != ["serve"]:
        return _main(build_parser(), given)
    # Start-up imports the SDK and builds hundreds of long-lived models and schemas; the cyclic collector would
    # walk that growing heap again and again (a third of the start). server.serve switches it back on, with what
    # start-up built frozen, once the server is built; here, whatever happens (a refused option, an error).
    gc.disable()
    try:
        return _main(build_parser("serve"), given)
    finally:
        gc.enable()


def _main(parser: argparse.ArgumentParser, given: list[str]) -> int:
    args = parser.parse_args(given)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, so a reader that went away is seen by the handler below
        return code
    except BrokenPipeError:
        # `mm-agent ... | head`: the reader closed the pipe. Stop quietly, as coreutils do on SIGPIPE, and point
        # stdout at /dev/null so the interpreter's exit-time flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MMAgentError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a request model refused an option value: same shape as MMAgentError
        err = exc.errors()[0]
        if (unreadable := names.not_text(err)) is not None:  # a path given whose name is not UTF-8
            print(f"error: {unreadable.render()}", file=sys.stderr)
            return 2
        field = ".".join(str(part) for part in err["loc"]) or "input"
        fix = f"see `mm-agent {args.command} --help`"
        print(f"error: {MMAgentError(err['msg'], field=field, fix=fix).render()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ValueError as exc:  # a non-UTF-8 name met where text is written, or a file that is not UTF-8 text
        if (error := names.text_error(exc)) is None:
            raise
        print(f"error: {error.render()}", file=sys.stderr)
        return 2

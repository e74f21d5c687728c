"""`mm-agent` command line: one module per subcommand, each a thin call into the typed core.

Errors are turned into a clean message at exactly one place (`main`): `MMAgentError` prints the problem,
where it is and the fix, and exits 2; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from mm_agent import __version__, names
from mm_agent.errors import MMAgentError

from . import (
    convert,
    dataset,
    demo,
    diagnose,
    doctor,
    estimate,
    install,
    jobs,
    logs,
    models,
    new_model,
    ps,
    ranktable,
    render,
    route,
    serve,
    skills,
    stages,
    status,
    stop,
    validate,
)

COMMANDS = (
    models,
    route,
    dataset,
    render,
    validate,
    estimate,
    ranktable,
    diagnose,
    doctor,
    install,
    convert,
    stages,
    jobs,
    status,
    logs,
    ps,
    stop,
    demo,
    new_model,
    skills,
    serve,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mm-agent",
        description="Take a multimodal model from a plain request to a validated MindSpeed-MM job.",
        epilog='Start with: mm-agent route "fine-tune Wan2.1 text-to-video on 8 NPUs"',
    )
    parser.add_argument("--version", action="version", version=f"mm-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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
    args = build_parser().parse_args(argv)
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

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

from mm_agent import __version__
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


def main(argv: Sequence[str] | None = None) -> int:
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
        field = ".".join(str(part) for part in err["loc"]) or "input"
        fix = f"see `mm-agent {args.command} --help`"
        print(f"error: {MMAgentError(err['msg'], field=field, fix=fix).render()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""Shared output helpers: `--json` prints exactly the pydantic model the MCP tool returns."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from mm_agent import names
from mm_agent.errors import MMAgentError


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (same model as the MCP tool)"
    )


def print_json(model: BaseModel) -> None:
    """The model as JSON; a name that is not UTF-8 in it is shown escaped (`names.shown`), as over MCP, where
    pydantic would refuse to serialize it."""
    print(names.shown_model(model).model_dump_json(indent=2))


def console():  # type: ignore[no-untyped-def]
    """Rich console, imported lazily so `--json` paths and the server stay light."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def option_error(exc: ValidationError, command: str) -> MMAgentError:
    """A request model's refusal of an option value, named as the flag the user typed (`--max-height`)."""
    err = exc.errors()[0]
    flag = "--" + ".".join(str(p) for p in err["loc"]).replace("_", "-") if err["loc"] else "arguments"
    if (unreadable := names.not_text(err)) is not None:  # a path whose name is not UTF-8
        return MMAgentError(unreadable.message, field=flag, fix=unreadable.fix)
    return MMAgentError(err["msg"], field=flag, fix=f"see `mm-agent {command} --help`")


def flag_name(field: str) -> str:
    """A request field's CLI flag: num_frames -> --num-frames."""
    return "--" + field.replace("_", "-")


def int_list(text: str) -> list[int]:
    """argparse type of a list-of-integers field: `1,2,2` (brackets tolerated)."""
    try:
        return [int(x) for x in text.replace("[", "").replace("]", "").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def arg_type(annotation: Any) -> Any:
    """A request field's annotation as an argparse type (None: a string), so the CLI options of a command are
    generated from its request model and cannot drift from the MCP tool's arguments."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is list:
        return int_list
    return annotation if annotation in (int, float) else None

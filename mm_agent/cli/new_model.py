"""`mm-agent new-model NAME --from BASE [--checkout DIR | --out DIR] [--yes] [--json]`: scaffold MindSpeed-MM's
new-model flow (a DiT, its model, dataset, entry, configs, launch script and registration) for the user's own
model. Dry run unless --yes.

A thin adapter over `mm_agent.scaffold.scaffold_model`, the function the MCP tool `scaffold_model` calls: the
options are the request model's fields (so the CLI and the tool cannot drift apart), `--json` prints the whole
result, and the short text says what would be or was written, where, and the next command.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from pydantic import ValidationError

from mm_agent.scaffold import ScaffoldRequest, ScaffoldResult, scaffold_model

from .output import add_json_flag, arg_type, console, flag_name, option_error, print_json

# Request fields that are not plain `--field-name` options: the positional NAME, --from, --yes.
_POSITIONAL = {"name": "name", "base": "from", "confirm": "yes"}
# CLI help where the field's own description is written for the MCP tool list (kept short there).
_HELP = {
    "patch": "patch size as frames,height,width, e.g. 1,2,2 (default: the base's)",
    "layers": "DiT blocks (default: the base's)",
    "heads": "attention heads (default: the base's)",
    "head_dim": "width per head, even (default: the base's)",
    "hidden": "model width = heads x head_dim (sets head_dim)",
    "freq_dim": "timestep embedding width (default: the base's)",
    "text_dim": "text encoder width (the base's UMT5: 4096)",
    "ffn_dim": "feed-forward width of each block (default: the base's)",
    "npus_per_node": "NPUs per node in the launch script (default 8)",
    "checkout": "a MindSpeed-MM checkout to write into; its predict_model.py gets the registration",
    "out": "an overlay folder to write instead, with the copy commands (default new_models/NAME)",
}


def add_parser(sub: Any) -> None:
    fields = ScaffoldRequest.model_fields
    p = sub.add_parser(
        "new-model",
        help="scaffold your own DiT model on MindSpeed-MM's new-model flow (dry run; --yes writes)",
        description="Write MindSpeed-MM's new-model flow for your own model: the DiT registered in "
        "PREDICTOR_MODEL_MAPPINGS, its model, dataset, training entry, model/data/FSDP2 configs, launch script "
        "and a README of the steps, at the paths that MindSpeed-MM version imports them from. Into a checkout "
        "(--checkout) or an overlay folder with the copy commands (--out). See docs/new_model.md.",
        epilog="examples:\n"
        "  mm-agent new-model tinydit --from wan2.1 --out new_models/tinydit            # dry run\n"
        "  mm-agent new-model tinydit --from wan2.1 --out new_models/tinydit --yes\n"
        "  mm-agent new-model mydit --from wan2.1 --mm-version 26.1.0 --layers 2 --heads 2 --head-dim 16 "
        "--checkout MindSpeed-MM --yes\n"
        "then: mm-agent demo --new-model (rehearse the loop here), mm-agent validate, launch on NPUs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME", help=fields["name"].description or "the new model's id")
    p.add_argument(
        "--from", dest="base", help=fields["base"].description or "the registered DiT to start from"
    )
    for name, field in fields.items():
        if name in _POSITIONAL or name == "detail":
            continue
        kwargs: dict[str, Any] = {"default": None, "dest": name, "help": _HELP.get(name) or field.description}
        kind = arg_type(field.annotation)
        if kind is not None:
            kwargs["type"] = kind
        p.add_argument(flag_name(name), **kwargs)
    p.add_argument("--yes", action="store_true", help="write the files (default: dry run, nothing written)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _request(args: argparse.Namespace) -> ScaffoldRequest:
    names = set(ScaffoldRequest.model_fields) - {"confirm"}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    try:
        return ScaffoldRequest(**given, confirm=args.yes)
    except ValidationError as exc:
        raise option_error(exc, "new-model") from None


def run(args: argparse.Namespace) -> int:
    result = scaffold_model(_request(args))
    if args.json:
        print_json(result)
    else:
        _show(result)
    return 0


VERB = {"dry_run": "would write", "written": "wrote", "unchanged": "unchanged:"}


def _show(r: ScaffoldResult) -> None:
    """What would be (or was) written and where, then the next commands; every field: --json."""
    out = console()
    where = "into the checkout" if r.mode == "checkout" else "in the overlay"
    out.print(
        f"{r.name} ({r.cls}) from {r.base}, MindSpeed-MM {r.mm_version}: {VERB[r.status]} {len(r.files)} files "
        f"{where} {r.root}",
        markup=False,
    )
    for f in r.files:
        out.print(f"  {f.action:<9} {f.path}  ({f.role})", markup=False)
    out.print(f"registry entry: {r.registry_file}", markup=False)
    if r.copy_commands:
        out.print("copy it into a MindSpeed-MM checkout:", markup=False)
        for argv in r.copy_commands:
            out.print(f"  $ {shlex.join(argv)}", markup=False)
    if r.register_lines:
        out.print("and register it in mindspeed_mm/models/predictor/predict_model.py:", markup=False)
        for line in r.register_lines:
            out.print(f"  {line}", markup=False)
    if r.next_steps:  # (a dry run's first: nothing written yet, --yes writes)
        out.print("next:", markup=False)
        for step in r.next_steps:
            out.print(f"  - {step}", markup=False)

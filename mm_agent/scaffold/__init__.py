"""`scaffold_model` / `mm-agent new-model`: MindSpeed-MM's new-model flow (docs/zh/pytorch/new_model_development.md)
written out for a user's own DiT — the DiT, model, dataset, entry, three configs, launch script and README at the
places MindSpeed-MM imports them, the PREDICTOR_MODEL_MAPPINGS registration, and a registry entry in the workspace
so every other tool knows the model. Dry run unless `confirm`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

from mm_agent.errors import MMAgentError
from mm_agent.paths import confine, resolve
from mm_agent.registry import user_models_dir
from mm_agent.scaffold.entry import entry_data, entry_text
from mm_agent.scaffold.plan import make_plan
from mm_agent.scaffold.request import ScaffoldFile, ScaffoldRequest, ScaffoldResult
from mm_agent.scaffold.write import atomic_write, inventory, write_plan

__all__ = ["ScaffoldFile", "ScaffoldRequest", "ScaffoldResult", "scaffold_model"]


def _place(raw: str, root: Path | None, base: Path, field: str) -> Path:
    return confine(raw, root, field) if root else resolve(base / Path(raw).expanduser(), field)


def scaffold_model(req: ScaffoldRequest, *, root: Path | None = None) -> ScaffoldResult:
    """Plan (and with `confirm`, write) a new model. `root` confines `checkout`/`out` (the MCP workspace); the
    registry entry goes to the workspace (`root`, else `workspace.set_workspace`'s, else the current directory)."""
    base = (root or Path.cwd()).resolve()
    if req.checkout and req.out:
        raise MMAgentError(
            "give either checkout (write into a MindSpeed-MM clone) or out (an overlay folder), not both",
            field="out",
            fix="drop one of them",
        )
    checkout = _place(req.checkout, root, base, "checkout") if req.checkout else None
    target = checkout or _place(req.out or f"new_models/{req.name}", root, base, "out")
    if checkout is None and target.exists() and not target.is_dir():
        raise MMAgentError("not a folder", file=str(target), field="out", fix="name a folder for the overlay")
    plan = make_plan(req, checkout)
    items = inventory(plan, target)
    mode: Literal["checkout", "overlay"] = "checkout" if checkout is not None else "overlay"
    data = entry_data(plan, target, mode)
    registry_file = user_models_dir(root) / f"{req.name}.yaml"  # the server's workspace, else the CLI's
    entry = entry_text(data)
    old_entry = registry_file.read_text(encoding="utf-8") if registry_file.is_file() else None
    if old_entry is not None and old_entry != entry:
        raise MMAgentError(
            f"the workspace already has a model {req.name!r} made differently",
            file=str(registry_file),
            field="name",
            fix="pick another --name, or delete that registry entry (and its files) to start again",
        )
    changed = any(i.action != "unchanged" for i in items) or old_entry is None
    status = "dry_run"
    if req.confirm:
        write_plan(plan, target, items)
        if old_entry is None:
            atomic_write(registry_file, entry)
        status = "written" if changed else "unchanged"
    copy: list[list[str]] = []
    if (
        mode == "overlay"
    ):  # GNU cp -r merges into the checkout's existing folders; predict_model.py is not in it
        tops = [str(target / top) for top in ("mindspeed_mm", "examples", plan.path_of("entry"))]
        copy = [["cp", "-r", "--", *tops, "MINDSPEED_MM/"]]
    q = shlex.quote
    steps: list[str] = []
    if status == "dry_run":
        steps.append("nothing written yet: run again with confirm (CLI --yes) to write these files")
    if mode == "overlay":
        steps.append(
            "copy into your MindSpeed-MM checkout (copy_commands, MINDSPEED_MM = its root) and add register_lines "
            f"to {plan.spec.registration.file} — or write straight into it: mm-agent new-model {q(req.name)} "
            f"--from {q(plan.base.id)} --checkout MINDSPEED_MM --yes"
        )
    steps += [
        f"check it: mm-agent validate {q(str(target / 'examples' / req.name))} --mm-root {q(str(checkout or 'MINDSPEED_MM'))}",
        "rehearse here: mm-agent demo --new-model (a tiny copy of this DiT, trained by the bundled runtime)",
        f"train on NPUs, from the checkout root: bash {plan.path_of('launch')}",
    ]
    return ScaffoldResult(
        name=req.name,
        cls=plan.cls,
        model_class=f"{plan.camel}Model",
        dataset_class=f"{plan.camel}T2VDataset",
        base=plan.base.id,
        mm_version=req.mm_version,
        arch={**plan.arch.model_dump(), "patch_size": list(plan.arch.patch_size)},
        mode=mode,
        root=str(target),
        status=status,  # type: ignore[arg-type]
        files=items,
        registry_file=str(registry_file),
        copy_commands=copy,
        register_lines=plan.register_lines if mode == "overlay" else [],
        next_steps=steps,
    )

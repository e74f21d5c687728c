"""What a scaffold is, before anything is written: the names, the network's sizes, every file's text and the
registration edit, all checked (a bad input is refused here with the field and the fix, nothing written).

The files follow MindSpeed-MM's new-model guide at the requested release (registry/data/new_model.yaml); with a
checkout, its own source is read to confirm the interfaces the files import are there and to edit its
PREDICTOR_MODEL_MAPPINGS.
"""

from __future__ import annotations

import ast
import keyword
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry
from mm_agent.scaffold.request import ScaffoldRequest
from mm_agent.scaffold.spec import Arch, Base, NewModelSpec, load_spec
from mm_agent.templating import jinja_environment, templates_dir

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,38}[a-z0-9]$")


@dataclass
class Plan:
    """A checked scaffold: `files` (path relative to the root -> text) in the order they are written."""

    req: ScaffoldRequest
    spec: NewModelSpec
    base: Base
    arch: Arch
    cls: str
    camel: str
    files: dict[str, str]
    roles: dict[str, str]
    registration: tuple[str, str] | None = None  # (path, edited text) in checkout mode
    register_lines: list[str] = field(default_factory=list)

    @property
    def dit_file(self) -> str:
        return self.path_of("dit")

    def path_of(self, role: str) -> str:
        return next(p for p, r in self.roles.items() if r == role)


def class_names(name: str) -> tuple[str, str]:
    """(CamelCase stem, DiT class): tinydit -> (Tiny, TinyDiT), my_video -> (MyVideo, MyVideoDiT)."""
    stem = re.sub(r"_?dit$", "", name) or name
    camel = "".join(part[:1].upper() + part[1:] for part in stem.split("_") if part)
    return camel, camel + "DiT"


def check_name(name: str, checkout_keys: set[str]) -> None:
    if not NAME_RE.match(name) or "__" in name or keyword.iskeyword(name):
        raise MMAgentError(
            f"{name!r} cannot name a model: it becomes a Python module, a predictor model_id and a folder",
            field="name",
            fix="use 2-40 lower-case letters, digits and single underscores, starting with a letter "
            "(e.g. my_dit)",
        )
    registry = get_registry()
    for entry in registry.models.values():
        if entry.user is None and (name == entry.id or name in {a.lower() for a in entry.aliases}):
            raise MMAgentError(
                f"{name!r} is MindSpeed-MM's shipped model {entry.id} ({entry.name})",
                field="name",
                fix=f"pick a name of your own (e.g. my_{re.sub(r'[^a-z0-9]+', '_', name).strip('_')}); to train "
                f"{entry.name} itself, route_model / render_job it",
            )
    spec = load_spec()
    if spec.base(name) is not None:
        raise MMAgentError(f"{name!r} is a base's name", field="name", fix="pick a name of your own")
    if name in checkout_keys:
        raise MMAgentError(
            f"{name!r} is already a key of the checkout's PREDICTOR_MODEL_MAPPINGS",
            field="name",
            fix=f"pick another name; the keys taken are {', '.join(sorted(checkout_keys))}",
        )


def resolve_arch(req: ScaffoldRequest, base: Base) -> Arch:
    """The base's sizes with the request's changes; heads must divide the width and head_dim be even (the
    rotary embedding rotates pairs of channels, split over frames, height and width)."""
    values: dict[str, Any] = base.arch.model_dump()
    heads = req.heads or values["num_heads"]
    head_dim = req.head_dim or values["head_dim"]
    if req.hidden is not None:
        if req.hidden % heads:
            raise MMAgentError(
                f"hidden {req.hidden} is not divisible by heads {heads}",
                field="hidden",
                fix=f"use a multiple of {heads} (e.g. {heads * max(1, round(req.hidden / heads))}), or heads "
                "that divide it",
            )
        if req.head_dim is not None and req.head_dim * heads != req.hidden:
            raise MMAgentError(
                f"hidden {req.hidden} is not heads {heads} x head_dim {req.head_dim}",
                field="head_dim",
                fix="give two of hidden, heads and head_dim",
            )
        head_dim = req.hidden // heads
    if head_dim % 2 or head_dim < 6:
        raise MMAgentError(
            f"head_dim {head_dim} must be even and at least 6: Wan's rotary embedding rotates channel pairs, "
            "split over frames, height and width",
            field="head_dim" if req.hidden is None else "hidden",
            fix="pick heads and width so that width / heads is even, e.g. 64 or 128",
        )
    values.update(num_heads=heads, head_dim=head_dim)
    for key, value in (
        ("num_layers", req.layers),
        ("ffn_dim", req.ffn_dim),
        ("freq_dim", req.freq_dim),
        ("text_dim", req.text_dim),
    ):
        if value is not None:
            values[key] = value
    if req.patch is not None:
        if any(p <= 0 for p in req.patch):
            raise MMAgentError(
                f"patch {req.patch} must be positive",
                field="patch",
                fix="e.g. [1, 2, 2] (frames, height, width; CLI: --patch 1,2,2)",
            )
        values["patch_size"] = tuple(req.patch)
    return Arch.model_validate(values)


def _module_file(root: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for path in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Try, ast.If)):
            names.update(
                _defined(ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[]))
            )
    return names


def missing_interfaces(root: Path, interfaces: dict[str, list[str]]) -> list[str]:
    """`module.name` entries of `interfaces` that the tree at `root` does not define (read with ast, nothing
    imported)."""
    missing: list[str] = []
    for module, names in interfaces.items():
        path = _module_file(root, module)
        if path is None:
            missing += [f"{module}.{n}" for n in names]
            continue
        with warnings.catch_warnings():  # MindSpeed-MM's own invalid escapes are not ours to report
            warnings.simplefilter("ignore")
            defined = _defined(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        missing += [f"{module}.{n}" for n in names if n not in defined]
    return missing


def mapping_keys(text: str, mapping: str, file: str) -> tuple[ast.Dict, set[str]]:
    for node in ast.parse(text, file).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == mapping for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            keys = {
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
            return node.value, keys
    raise MMAgentError(
        f"no `{mapping} = {{...}}` in it",
        file=file,
        field=mapping,
        fix="point --checkout at a MindSpeed-MM 26.1.0 or master checkout",
    )


def register(text: str, name: str, cls: str, file: str, mapping: str) -> str:
    """`text` (predict_model.py) with `from .dits.{name}_dit import {cls}` and `"{name}": {cls}` in `mapping`;
    unchanged if both are there. Edits by the positions ast gives, so the rest of the file stays byte for byte."""
    import_line = f"from .dits.{name}_dit import {cls}"
    tree = ast.parse(text, file)
    node, keys = mapping_keys(text, mapping, file)
    lines = text.splitlines(keepends=True)
    if name not in keys:
        last = node.values[-1] if node.values else None
        close_line = (node.end_lineno or node.lineno) - 1
        indent = "    "
        if last is not None:
            first_key = node.keys[0]
            indent = " " * (first_key.col_offset if first_key is not None else 4)
            row = (last.end_lineno or last.lineno) - 1
            raw = lines[row].encode()  # ast's column offsets count UTF-8 bytes
            col = last.end_col_offset or 0
            rest = raw[col:].decode()
            if not rest.lstrip().startswith(","):
                lines[row] = raw[:col].decode() + "," + rest
        closing = lines[close_line]
        brace = closing.rfind("}")
        if closing[:brace].strip():  # `{... "x": X}` on one line: put the entry before the brace
            lines[close_line] = closing[:brace].rstrip() + f' "{name}": {cls}' + closing[brace:]
        else:
            lines.insert(close_line, f'{indent}"{name}": {cls},\n')
    if import_line not in text:
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        at = (imports[-1].end_lineno or imports[-1].lineno) if imports else 0
        lines.insert(at, import_line + "\n")
    return "".join(lines)


def _context(
    req: ScaffoldRequest, spec: NewModelSpec, base: Base, arch: Arch, cls: str, camel: str
) -> dict[str, Any]:
    ckpt = f"./ckpt/{base.hf_id}"
    data = spec.data
    predictor = {"model_id": req.name, **arch.model_dump()}
    predictor["patch_size"] = list(arch.patch_size)
    model_config = {
        "diffusion": dict(spec.diffusion),
        "predictor": predictor,
        "text_encoder": {**base.text_encoder, "from_pretrained": f"{ckpt}/text_encoder/"},
        "ae": {**base.ae, "from_pretrained": f"{ckpt}/vae/"},
    }
    data_config = {
        "dataset_param": {
            "data_folder": f"./data/{req.name}/",
            "json_path": f"./data/{req.name}/data.json",
            "num_frames": data.num_frames,
            "max_height": data.max_height,
            "max_width": data.max_width,
            "tokenizer_config": {
                "pretrained_model_name_or_path": f"{ckpt}/tokenizer/",
                "model_max_length": data.model_max_length,
            },
        },
        "dataloader_param": dict(data.dataloader_param),
    }
    fsdp2 = {**spec.fsdp2, "sharding_size": req.npus_per_node}
    version = get_registry().versions.get(req.mm_version)
    return {
        "name": req.name,
        "cls": cls,
        "camel": camel,
        "guide": spec.guide,
        "mm_version": req.mm_version,
        "arch": {**arch.model_dump(), "patch_size": list(arch.patch_size)},
        "data": data.model_dump(),
        "model_config": model_config,
        "data_config": data_config,
        "fsdp2_config": fsdp2,
        "npus_per_node": req.npus_per_node,
        "cann_env": list(getattr(version, "cann_env", []) or []),
        "base": base.model_dump(),
        "hf_id": base.hf_id,
        "files": {},
    }


def make_plan(req: ScaffoldRequest, checkout: Path | None) -> Plan:
    spec = load_spec()
    registry = get_registry()
    registry.check_version(req.mm_version)
    refusal = spec.refusal(req.mm_version)
    if refusal is not None or req.mm_version not in spec.versions:
        raise MMAgentError(
            refusal.reason.format(version=req.mm_version)
            if refusal
            else f"no new-model flow for {req.mm_version}",
            field="mm_version",
            fix=refusal.fix if refusal else f"use one of {', '.join(spec.versions)}",
        )
    base = spec.base(req.base)
    if base is None:
        raise MMAgentError(
            f"unknown base {req.base!r}",
            field="base",
            fix=f"use one of {', '.join(b.id for b in spec.bases)} (the Wan DiTs whose VAE and text encoder a new "
            "model reuses)",
        )
    registration: tuple[str, str] | None = None
    keys: set[str] = set()
    reg_text = ""
    if checkout is not None:
        reg_path = checkout / spec.registration.file
        if not reg_path.is_file():
            raise MMAgentError(
                f"not a MindSpeed-MM checkout: {spec.registration.file} is missing",
                file=str(checkout),
                field="checkout",
                fix="point --checkout at the root of a MindSpeed-MM clone (the folder holding mindspeed_mm/), or "
                "use --out for an overlay folder",
            )
        missing = missing_interfaces(checkout, spec.interfaces)
        if missing:
            raise MMAgentError(
                f"the checkout lacks what the {req.mm_version} scaffold imports: {', '.join(missing[:6])}",
                file=str(checkout),
                field="mm_version",
                fix="check out the release you asked for (git -C CHECKOUT checkout v26.1.0) or pass the "
                "--mm-version it is",
            )
        reg_text = reg_path.read_text(encoding="utf-8")
        _, keys = mapping_keys(reg_text, spec.registration.mapping, str(reg_path))
    camel, cls = class_names(req.name)
    if f"from .dits.{req.name}_dit import {cls}" in reg_text:
        keys.discard(req.name)  # registered by an earlier run of this scaffold: writing again is a no-op
    check_name(req.name, keys)
    arch = resolve_arch(req, base)
    context = _context(req, spec, base, arch, cls, camel)
    files: dict[str, str] = {}
    roles: dict[str, str] = {}
    for item in spec.files:
        roles[item.path.format(name=req.name)] = item.role
    context["files"] = {role: path for path, role in roles.items()}
    context["overlay"] = checkout is None
    context["register_lines"] = [f"from .dits.{req.name}_dit import {cls}", f'"{req.name}": {cls},']
    env = jinja_environment(str(templates_dir() / "new_model"))
    for item in spec.files:
        files[item.path.format(name=req.name)] = env.get_template(item.template).render(**context)
    plan = Plan(req, spec, base, arch, cls, camel, files, roles)
    plan.register_lines = context["register_lines"]
    if checkout is not None:
        edited = register(
            reg_text, req.name, cls, str(checkout / spec.registration.file), spec.registration.mapping
        )
        registration = (spec.registration.file, edited)
        plan.registration = registration
    return plan

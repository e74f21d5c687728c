"""New-model development (`newmodel.*`): a model config against the DiT code of the MindSpeed-MM checkout.

MindSpeed-MM builds a diffusion model's predictor by name: `PredictModel` (mindspeed_mm/models/predictor/
predict_model.py) does `model_cls = PREDICTOR_MODEL_MAPPINGS[config.model_id]` and then
`model_cls(**config.to_dict())`, every key of the `predictor` block (model_id included) a keyword argument. Its
FSDP2 path (mindspeed_mm/models/transformers/base_model.py `get_submodules_by_path`) finds the modules an
fsdp2_config.yaml names (`sub_modules_to_wrap`, `recompute_modules`, `ignored_modules`, `moe_modules`) by
attribute path. A new DiT that is not registered stops the run with a bare `KeyError: 'name'`; a key its
`__init__` does not take stops it with a TypeError, or, when `__init__` has `**kwargs`, is swallowed without a
word (a `num_layer` typo trains the default depth); a path the model lacks prints a `Warning: Module not found`
and trains that part unwrapped (a `{*}` path whose list is missing raises ValueError).

These rules read the checkout's source with `ast` (`pysource`; nothing of it runs), from the checkout the job
names (`mm_root`, MM_ROOT, job.yaml) or, for a job directory inside a checkout (a scaffolded `examples/<name>/`),
that checkout. Without one, or where the code cannot be read statically, they say nothing.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import Any

from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, is_dir
from mm_agent.validate.pysource import MAPPING, PREDICT_MODEL, Checkout, ClassRef, InitSignature, Mapping

MODEL_KINDS = ("sora_model", "inference_model")
# Keys PredictModel reads itself (a DiT with **kwargs never needs to use them).
PREDICT_MODEL_KEYS = frozenset({"model_id", "from_pretrained", "pipeline_num_layers"})
# The attributes a SoRA-style model (SoRAModel, the guide's CustomModel) gives each block of model.json.
TOP_LEVEL = ("predictor", "ae", "text_encoder", "diffusion")
FSDP2_PATH_KEYS = ("sub_modules_to_wrap", "recompute_modules", "ignored_modules", "moe_modules")
_PATH_EFFECT = {
    "sub_modules_to_wrap": "is not wrapped by fully_shard of its own (its parameters are gathered with the parent's)",
    "recompute_modules": "is not recomputed (activation memory is kept)",
    "ignored_modules": "is sharded and handled by FSDP2 instead of being ignored",
    "moe_modules": "is not treated as experts",
}


def check(job: Job) -> None:
    checkouts: dict[Path, Checkout] = {}
    for cfg in job.of_kind(*MODEL_KINDS):
        checkout = _checkout(job, cfg, checkouts)
        if checkout is not None and isinstance(cfg.data, dict):
            _predictor(job, cfg, checkout)
    for cfg in job.of_kind("fsdp2_config"):
        models = _models_of(job, cfg)
        for model in models:
            checkout = _checkout(job, model, checkouts)
            if checkout is not None:
                _fsdp2_paths(job, cfg, model, checkout)


def _checkout(job: Job, cfg: ConfigFile, cache: dict[Path, Checkout]) -> Checkout | None:
    """The checkout the job runs in (its mm_root), else the checkout the config file lies in."""
    candidates: list[Path] = []
    if job.mm_root is not None:
        candidates.append(job.mm_root)
    else:
        candidates += [p for p in cfg.path.parents if job.inside(p)]
    for root in candidates:
        if root in cache:
            return cache[root]
        if job.inside(root) and is_dir(root) and Checkout.holds_predictor(root):
            cache[root] = Checkout(root, job.root)
            return cache[root]
        if job.mm_root is not None:
            return None  # the job names its checkout: never another one
    return None


def _entry(checkout: Checkout, mapping: Mapping, key: str) -> str:
    """`wandit (WanDiT, mindspeed_mm/models/predictor/dits/wan_dit.py)`: a registered name and where its class is."""
    cls = checkout.predictor_class(key, mapping)
    if cls is None:
        return f"{key} ({mapping.entries[key] or '?'})"
    try:
        where = cls.file.relative_to(checkout.root)
    except ValueError:
        where = cls.file
    return f"{key} ({cls.name}, {where})"


def _register_fix(model_id: str, checkout: Checkout) -> str:
    """The two lines that register the DiT, naming its class when a file in dits/ defines one."""
    dits = checkout.root / "mindspeed_mm/models/predictor/dits"
    module = cls = None
    stems = (
        (model_id, f"{model_id}_dit", model_id.removesuffix("_dit") + "_dit")
        if model_id.isidentifier()
        else ()
    )
    for stem in stems:
        path = dits / f"{stem}.py"
        tree = checkout.tree(path) if path.is_file() else None
        if tree is None:
            continue
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        wanted = model_id.replace("_", "").lower()
        cls = next((n for n in names if n.lower() == wanted), None) or next(
            (n for n in names if n.endswith(("DiT", "Model", "Transformer")) and "Block" not in n), None
        )
        module = stem
        if cls:
            break
    where = f"{checkout.root / PREDICT_MODEL}"
    if module and cls:
        lines = f'`from .dits.{module} import {cls}` and `"{model_id}": {cls},` in {MAPPING}'
    else:
        lines = (
            f'`from .dits.<file> import <YourDiT>` and `"{model_id}": <YourDiT>,` in {MAPPING} '
            "(the DiT in mindspeed_mm/models/predictor/dits/<file>.py)"
        )
    return (
        f"register the DiT: add {lines} ({where}); `mm-agent new-model {model_id} --checkout "
        f"{checkout.root} --yes` writes both; or set predictor.model_id to a registered name"
    )


def _predictor(job: Job, cfg: ConfigFile, checkout: Checkout) -> None:
    block = cfg.get("predictor")
    if not isinstance(block, dict):
        return
    model_id = block.get("model_id")
    if not isinstance(model_id, str):
        return
    mapping = checkout.mapping()
    if mapping is None:
        return
    if model_id not in mapping.entries:
        if mapping.complete:
            known = ", ".join(_entry(checkout, mapping, key) for key in sorted(mapping.entries)) or "none"
            job.sink.error(
                "newmodel.predictor_unregistered",
                str(cfg.path),
                f"predictor.model_id {model_id!r} is not a key of {MAPPING} in {mapping.file} (it has: {known}); "
                f"PredictModel stops with KeyError: {model_id!r} at `model_cls = {MAPPING}[config.model_id]`",
                _register_fix(model_id, checkout),
                field="predictor.model_id",
                line=cfg.line("predictor.model_id"),
            )
        return
    cls = checkout.predictor_class(model_id, mapping)
    sig = checkout.init_signature(cls) if cls is not None else None
    if cls is None or sig is None:
        return
    _keys(job, cfg, block, cls, sig, checkout)


def _keys(
    job: Job, cfg: ConfigFile, block: dict[str, Any], cls: ClassRef, sig: InitSignature, checkout: Checkout
) -> None:
    where = f"{sig.cls.name}.__init__ ({sig.cls.file}:{sig.line})"
    takes = ", ".join(sig.params) or "no parameters"
    for key in block:
        if key in sig.params:
            continue
        near = difflib.get_close_matches(key, sig.params, n=1)
        instead = f"rename it to {near[0]!r}" if near else f"use one of its parameters ({takes})"
        if sig.var_kw is None:
            job.sink.error(
                "newmodel.predictor_key_unknown",
                str(cfg.path),
                f"predictor.{key} is not a parameter of {where}, which has no **kwargs: PredictModel calls "
                f"{cls.name}(**predictor) with every key of the block and stops with TypeError: "
                f"{sig.cls.name}.__init__() got an unexpected keyword argument {key!r}",
                f"{instead}, or give {sig.cls.name}.__init__ a **kwargs parameter"
                + (" (model_id is always passed)" if key == "model_id" else ""),
                field=f"predictor.{key}",
                line=cfg.line(f"predictor.{key}"),
            )
        elif (
            key not in PREDICT_MODEL_KEYS
            and key not in sig.kwargs_read
            and not sig.kwargs_opaque
            and not checkout.read_anywhere(key)
        ):
            job.sink.warning(
                "newmodel.predictor_key_ignored",
                str(cfg.path),
                f"predictor.{key} is not a parameter of {where}: its **{sig.var_kw} takes it and no code of "
                f"{checkout.root} reads it, so the value changes nothing"
                + (f" and {near[0]} keeps its default" if near else ""),
                f"{instead}, or drop the key (its parameters: {takes})",
                field=f"predictor.{key}",
                line=cfg.line(f"predictor.{key}"),
            )
    missing = [p for p in sig.required if p not in block]
    if missing:
        job.sink.error(
            "newmodel.predictor_key_missing",
            str(cfg.path),
            f"{where} requires {', '.join(missing)}, which the predictor block does not set: PredictModel stops "
            f"with TypeError: {sig.cls.name}.__init__() missing required argument(s)",
            f"add {', '.join(f'predictor.{p}' for p in missing)} to the config, or give the parameter a default",
            field="predictor",
            line=cfg.line("predictor"),
        )


# ---- FSDP2 module paths --------------------------------------------------------------------------------
def _models_of(job: Job, cfg: ConfigFile) -> list[ConfigFile]:
    """The SoRA-style model configs the FSDP2 config is used with: its launches', else its job directory's."""
    models = [
        c
        for launch, _ in job.users(cfg)
        for role, c in launch.configs.items()
        if role == "mm-model" and c.kind in MODEL_KINDS and isinstance(c.data, dict)
    ]
    if not models and not job.users(cfg):
        home = job.job_dir(cfg.path)
        models = [
            c for c in job.of_kind(*MODEL_KINDS) if isinstance(c.data, dict) and job.job_dir(c.path) == home
        ]
    return list({id(c): c for c in models}.values())


def _fsdp2_paths(job: Job, cfg: ConfigFile, model: ConfigFile, checkout: Checkout) -> None:
    assert isinstance(model.data, dict)
    top = [name for name in TOP_LEVEL if model.data.get(name) is not None]
    if "predictor" not in top:
        return
    dit = _dit_attributes(model, checkout)
    for key in FSDP2_PATH_KEYS:
        paths = cfg.get(key)
        if not isinstance(paths, list):
            continue
        for index, raw in enumerate(paths):
            if isinstance(raw, str) and raw.strip():
                _one_path(job, cfg, model, key, index, raw.strip(), top, dit)


def _dit_attributes(model: ConfigFile, checkout: Checkout) -> tuple[ClassRef, set[str]] | None:
    model_id = model.get("predictor.model_id")
    mapping: Mapping | None = checkout.mapping() if isinstance(model_id, str) else None
    if mapping is None or not isinstance(model_id, str):
        return None
    cls = checkout.predictor_class(model_id, mapping)
    names = checkout.attributes(cls) if cls is not None else None
    return (cls, names) if cls is not None and names is not None else None


def _one_path(
    job: Job,
    cfg: ConfigFile,
    model: ConfigFile,
    key: str,
    index: int,
    path: str,
    top: list[str],
    dit: tuple[ClassRef, set[str]] | None,
) -> None:
    parts = path.split(".")
    first, second = parts[0], parts[1] if len(parts) > 1 else None
    if "{" in first:
        return
    missing: str | None = None
    exists: list[str] = []
    owner = ""
    if first not in top:
        missing, exists = first, top
        owner = f"the model built from {model.path} (its blocks: {', '.join(top)})"
    elif first == "predictor" and second is not None and "{" not in second and dit is not None:
        cls, names = dit
        if second not in names:
            missing = f"predictor.{second}"
            exists = sorted(n for n in names if not n.startswith("_"))
            owner = f"{cls.name} ({cls.file})"
    if missing is None:
        return
    near = difflib.get_close_matches(missing.rsplit(".", 1)[-1], exists, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    field = f"{key}[{index}]"
    line = cfg.line(field) or cfg.line(key)
    if "{*}" in path:
        base = path[: path.index("{*}")].rstrip(".")
        job.sink.error(
            "newmodel.fsdp2_path_missing",
            str(cfg.path),
            f"{key} names {path!r}, but {owner} has no {missing!r}{hint}: get_submodules_by_path stops with "
            f"ValueError: Module at path '{base}' is None or does not have length attribute",
            f"name a module list the model has ({', '.join(exists)}), or drop the entry",
            field=field,
            line=line,
        )
        return
    job.sink.warning(
        "newmodel.fsdp2_path_missing",
        str(cfg.path),
        f"{key} names {path!r}, but {owner} has no {missing!r}{hint}: MindSpeed-MM only prints "
        + (
            '"Warning: Module not found at expanded path ..." for each index'
            if "{" in path
            else f"\"Warning: Module not found at path '{path}'\""
        )
        + f" and trains on: that part {_PATH_EFFECT[key]}",
        f"name a module the model has ({', '.join(exists)}), or drop the entry",
        field=field,
        line=line,
    )

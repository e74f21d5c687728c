"""A MindSpeed-MM checkout's Python read as text with `ast`: classes, their `__init__` and their modules.

New-model development adds a DiT to a checkout and a line to `PREDICTOR_MODEL_MAPPINGS`; whether a job's
configs fit that code (`rules_newmodel`) is read here from the source, never imported: nothing of the checkout
runs, so no trust is needed (the parser check, `rules_mmparser`, is the one that runs its code). A class is
followed through the imports that bring it into a module (`from .dits import WanDiT`, the package
`__init__` that re-exports it, `as` aliases) to the file that defines it. What cannot be read statically (a
base class from outside the checkout that may add modules, `setattr(self, name, ...)`, a `**kwargs` handed on)
makes the answer `None`/opaque, so the rules say nothing rather than something wrong.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mm_agent import cancel
from mm_agent.errors import MMAgentError
from mm_agent.paths import open_file, read_upto

MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_HOPS = 8  # imports followed to find where a class is defined (re-export chains are short)
PREDICT_MODEL = "mindspeed_mm/models/predictor/predict_model.py"
MAPPING = "PREDICTOR_MODEL_MAPPINGS"
# Bases that add no submodule a config path could name: torch's Module, MindSpeed-MM's and Megatron's module
# bases, the mixins of the FSDP2 new-model flow, diffusers' config/model mixins.
MODULE_FREE_BASES = frozenset(
    {
        "object",
        "Module",
        "MegatronModule",
        "MultiModalModule",
        "FSDP2Mixin",
        "WeightInitMixin",
        "ModelMixin",
        "ConfigMixin",
        "PeftAdapterMixin",
        "FromOriginalModelMixin",
        "ABC",
        "Generic",
    }
)
MAX_SCAN_FILES = 5000
MAX_SCAN_BYTES = 128 * 1024 * 1024
# `cfg.key`, `"key"`, `'key'`: how code reads a config key (a bare variable of that name does not count)
_READ = re.compile(r"""(?:\.|["'])([A-Za-z_]\w*)""")
_REGISTER = frozenset({"add_module", "register_module", "register_buffer", "register_parameter"})


@dataclass(frozen=True)
class ClassRef:
    """A class found in the checkout: its name where it is defined, that file and its node."""

    name: str
    file: Path
    node: ast.ClassDef


@dataclass
class InitSignature:
    """What `Cls(**config)` accepts: its `__init__`'s keyword-capable parameters."""

    cls: ClassRef  # the class whose __init__ it is (the class itself or a base)
    line: int
    params: list[str]
    required: list[str]  # parameters without a default
    var_kw: str | None  # the name of `**kwargs`, if any
    kwargs_read: set[str] = field(default_factory=set)  # literal keys read from it (`kwargs.get("x")`)
    kwargs_opaque: bool = False  # handed on (`f(**kwargs)`) or used whole: where its keys go is unknown


@dataclass
class Mapping:
    """`PREDICTOR_MODEL_MAPPINGS` as written in predict_model.py."""

    file: Path
    line: int
    entries: dict[str, str]  # model_id -> the name the value has in predict_model.py
    complete: bool  # False: a `**spread` or computed key, so a name missing here may still be registered


class Checkout:
    """One MindSpeed-MM checkout's source, parsed on demand (each file at most once per validation)."""

    def __init__(self, root: Path, workspace: Path | None) -> None:
        self.root = root
        self.workspace = workspace
        self._trees: dict[Path, ast.Module | None] = {}
        self._read: set[str] | None = None

    @staticmethod
    def holds_predictor(root: Path) -> bool:
        try:
            return (root / PREDICT_MODEL).is_file()
        except (OSError, ValueError):
            return False

    def tree(self, path: Path) -> ast.Module | None:
        """The parsed module, or None when it cannot be read or parsed (too large, not Python)."""
        if path in self._trees:
            return self._trees[path]
        cancel.check()
        tree: ast.Module | None = None
        try:
            with open_file(path, self.workspace, "mm_root") as fh:
                raw = read_upto(fh, MAX_SOURCE_BYTES)
            if len(raw) <= MAX_SOURCE_BYTES:
                tree = ast.parse(raw.decode("utf-8", errors="replace"), filename=str(path))
        except (MMAgentError, OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        self._trees[path] = tree
        return tree

    def read_anywhere(self, key: str) -> bool:
        """Whether any Python file of the checkout (mindspeed_mm/ and the entry scripts at its root) reads
        `key` as an attribute or a string: a key a DiT's **kwargs swallows may still be read elsewhere
        (validate_args_patch reads `predictor.use_fused_rmsnorm`). Scanned once per validation."""
        if self._read is None:
            self._read = set()
            files = [p for p in sorted(self.root.glob("*.py"))]
            for folder, dirs, names in os.walk(self.root / "mindspeed_mm"):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
            total = 0
            for path in files[:MAX_SCAN_FILES]:
                cancel.check()
                try:
                    with open_file(path, self.workspace, "mm_root") as fh:
                        raw = read_upto(fh, MAX_SOURCE_BYTES)
                except (MMAgentError, OSError):
                    continue
                total += len(raw)
                self._read |= set(_READ.findall(raw.decode("utf-8", errors="replace")))
                if total > MAX_SCAN_BYTES:
                    break
        return key in self._read

    # ---- modules and imports -------------------------------------------------------------------------
    def module_file(self, module: str | None, level: int, here: Path) -> Path | None:
        """The file of `from <level dots><module> import ...` written in `here` (a package or a .py)."""
        if level:
            base = here.parent
            for _ in range(level - 1):
                base = base.parent
        else:
            base = self.root
        parts = module.split(".") if module else []
        target = base.joinpath(*parts) if parts else base
        for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
            try:
                if candidate is not None and candidate.is_file():
                    return candidate
            except (OSError, ValueError):
                continue
        return None

    def find_class(self, name: str, file: Path, hops: int = 0) -> ClassRef | None:
        """The class `name` means in `file`: defined there, or imported (through re-exports and aliases)."""
        tree = self.tree(file)
        if tree is None or hops > MAX_HOPS:
            return None
        for node in _top_level(tree):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return ClassRef(name, file, node)
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    source = self.module_file(node.module, node.level, file)
                    if source is not None:
                        found = self.find_class(alias.name, source, hops + 1)
                        if found is not None:
                            return found
                    # `from . import sub` then `sub.Cls` is not a class named `name`: nothing more here
        return None

    def mapping(self) -> Mapping | None:
        """PREDICTOR_MODEL_MAPPINGS of the checkout's predict_model.py (None when it holds none)."""
        path = self.root / PREDICT_MODEL
        tree = self.tree(path)
        if tree is None:
            return None
        found: Mapping | None = None
        for node in _top_level(tree):
            value: ast.expr | None = None
            if (isinstance(node, ast.Assign) and any(_is_name(t, MAPPING) for t in node.targets)) or (
                isinstance(node, ast.AnnAssign) and _is_name(node.target, MAPPING)
            ):
                value = node.value
            if value is not None:
                found = Mapping(path, node.lineno, {}, True)
                _dict_into(found, value)
            elif found is not None:
                _update_into(found, node)
        return found

    def predictor_class(self, model_id: str, mapping: Mapping) -> ClassRef | None:
        name = mapping.entries.get(model_id)
        return self.find_class(name, mapping.file) if name else None

    # ---- a class's constructor and attributes --------------------------------------------------------
    def bases(self, cls: ClassRef) -> tuple[list[ClassRef], bool]:
        """(the bases found in the checkout, whether every other base is known to add no submodules)."""
        found: list[ClassRef] = []
        known = True
        for base in cls.node.bases:
            name = _dotted(base)
            tail = name.rsplit(".", 1)[-1] if name else ""
            ref = self.find_class(name, cls.file) if name and "." not in name else None
            if ref is not None and ref.node is not cls.node:
                found.append(ref)
            elif tail not in MODULE_FREE_BASES:
                known = False
        return found, known

    def init_signature(self, cls: ClassRef, depth: int = 0) -> InitSignature | None:
        """The `__init__` that `cls(**config)` runs: its own, else the first base's found in the checkout."""
        for node in cls.node.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                return _signature(cls, node)
        if depth > MAX_HOPS:
            return None
        bases, _ = self.bases(cls)
        for base in bases:
            found = self.init_signature(base, depth + 1)
            if found is not None:
                return found
        return None

    def attributes(self, cls: ClassRef, depth: int = 0) -> set[str] | None:
        """Names `getattr(instance, name)` finds: `self.X = ...` in any method, registered modules and the
        class body's names, with those of its bases; None when that cannot be known statically."""
        names: set[str] = set()
        for node in cls.node.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        for sub in ast.walk(cls.node):
            if isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for target in targets:
                    names |= _self_attrs(target)
            elif isinstance(sub, ast.Call):
                named = _registered(sub)
                if named == "":
                    return None  # a name computed at run time
                if named is not None:
                    names.add(named)
        if depth > MAX_HOPS:
            return None
        bases, known = self.bases(cls)
        if not known:
            return None
        for base in bases:
            inherited = self.attributes(base, depth + 1)
            if inherited is None:
                return None
            names |= inherited
        return names


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module statements, with those of top-level `if`/`try` blocks (guarded imports)."""
    out: list[ast.stmt] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        out.append(node)
        if isinstance(node, ast.If):
            pending[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending[:0] = [*node.body, *node.orelse, *node.finalbody]
    return out


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    if isinstance(node, ast.Subscript):  # Generic[T]
        return _dotted(node.value)
    return ""


def _dict_into(found: Mapping, value: ast.expr) -> None:
    if not isinstance(value, ast.Dict):
        found.complete = False
        return
    for key, item in zip(value.keys, value.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.entries[key.value] = _dotted(item)
        else:  # `**OTHER` or a computed key
            found.complete = False


def _update_into(found: Mapping, node: ast.stmt) -> None:
    """`MAPPING["x"] = Cls` and `MAPPING.update({...})` after the assignment."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Subscript) and _is_name(target.value, MAPPING):
                key = target.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.entries[key.value] = _dotted(node.value)
                else:
                    found.complete = False
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute) and _is_name(func.value, MAPPING):
            if func.attr == "update" and len(node.value.args) == 1 and not node.value.keywords:
                _dict_into(found, node.value.args[0])
            else:
                found.complete = False


def _registered(call: ast.Call) -> str | None:
    """The attribute `setattr(self, "x", ...)` / `self.add_module("x", ...)` (and register_*) gives the
    instance; "" when its name is computed; None for other calls."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "setattr" and call.args and _is_name(call.args[0], "self"):
        return (_literal(call.args[1]) or "") if len(call.args) > 1 else ""
    if isinstance(func, ast.Attribute) and func.attr in _REGISTER and _is_name(func.value, "self"):
        return (_literal(call.args[0]) or "") if call.args else ""
    return None


def _self_attrs(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Attribute) and _is_name(target.value, "self"):
        return {target.attr}
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_self_attrs(t) for t in target.elts)) if target.elts else set()
    return set()


def _signature(cls: ClassRef, node: ast.FunctionDef) -> InitSignature:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    keyword_capable = [a.arg for a in args.args] + [a.arg for a in args.kwonlyargs]
    if keyword_capable and positional and keyword_capable[0] == positional[0].arg:
        keyword_capable = keyword_capable[1:]  # self
    no_default = positional[: len(positional) - len(args.defaults)]
    required = [a.arg for a in no_default if a.arg in keyword_capable]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    sig = InitSignature(cls, node.lineno, keyword_capable, required, args.kwarg.arg if args.kwarg else None)
    if sig.var_kw is not None:
        _kwargs_use(node, sig)
    return sig


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _key_read(sub: ast.AST, name: str) -> tuple[str, ast.expr] | None:
    """(key, the **kwargs name node) for `kwargs.get("k")` / `.pop` / `.setdefault`, `kwargs["k"]`,
    `"k" in kwargs`; None for anything else."""
    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.args:
        func = sub.func
        key = _literal(sub.args[0])
        if _is_name(func.value, name) and func.attr in ("get", "pop", "setdefault") and key is not None:
            return key, func.value
    elif isinstance(sub, ast.Subscript) and _is_name(sub.value, name):
        key = _literal(sub.slice)
        if key is not None:
            return key, sub.value
    elif (
        isinstance(sub, ast.Compare)
        and len(sub.comparators) == 1
        and isinstance(sub.ops[0], ast.In | ast.NotIn)
    ):
        key = _literal(sub.left)
        if key is not None and _is_name(sub.comparators[0], name):
            return key, sub.comparators[0]
    return None


def _kwargs_use(node: ast.FunctionDef, sig: InitSignature) -> None:
    """Which keys the body reads from **kwargs, and whether it hands the rest on (then none is ignored)."""
    name = sig.var_kw or ""
    explained: set[int] = set()  # ids of the Name nodes whose use is understood
    for sub in ast.walk(node):
        found = _key_read(sub, name)
        if found is not None:
            sig.kwargs_read.add(found[0])
            explained.add(id(found[1]))
    for sub in ast.walk(node):
        if _is_name(sub, name) and id(sub) not in explained:
            sig.kwargs_opaque = True  # `super().__init__(**kwargs)`, `self.kw = kwargs`, `f(kwargs)`
            return

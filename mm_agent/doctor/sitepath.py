"""The first lines of every doctor probe, run by the checked interpreter as `python -I -S -c <this + probe>`:
sys.path as that interpreter's `site` would build it, without executing anything found there.

Why: the interpreter a request names is often a venv inside the workspace. Started normally, its `site`
module executes every `import` line of every `site-packages/*.pth` (and imports `sitecustomize` and
`usercustomize`) before the probe's first line, so a workspace file would run as code. Started with `-I -S`,
none of that happens, nor do PYTHON* variables, the current directory or a script's folder reach sys.path.
`setup()` then adds what the probes need to find the installed packages: the venv's site-packages (and the
base install's when its pyvenv.cfg includes them), the user site where `site` would add it, the folders that
`.pth` path lines name (a path line is data: an older editable install), the packages a setuptools editable
finder maps (read from its `MAPPING` literal with `ast`, never imported), and `$PYTHONPATH`. Every other
`import` line of a .pth file is skipped.

Standard library only, Python 3.8-compatible and no `from __future__` import: its source is prepended to the
probe's own code.
"""

import ast
import os
import sys

_EDITABLE_PREFIX = "__editable___"
_EDITABLE_SUFFIX = "_finder"
_MAPPING: "dict[str, str]" = {}  # top-level name -> its folder or module file, from editable finders


def _pyvenv(exe: str) -> "tuple[str, bool] | None":
    """(the venv's prefix, whether it includes the system site-packages) as `site.venv()` reads pyvenv.cfg."""
    exe_dir = os.path.dirname(os.path.abspath(exe))
    prefix = os.path.dirname(exe_dir)
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(prefix, "pyvenv.cfg")):
        if os.path.isfile(conf):
            system = "true"
            with open(conf, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    key, sep, value = line.partition("=")
                    if sep and key.strip().lower() == "include-system-site-packages":
                        system = value.strip().lower()
            return prefix, system == "true"
    return None


def _editable_mapping(sitedir: str, line: str) -> "dict[str, str] | None":
    """The `MAPPING` of a setuptools editable finder that an `import __editable___X_finder; ...install()`
    line would install, read as a literal (the finder module is never imported)."""
    words = line.replace(";", " ").split()
    if len(words) < 2 or words[0] != "import":
        return None
    module = words[1]
    if not (
        module.startswith(_EDITABLE_PREFIX) and module.endswith(_EDITABLE_SUFFIX) and module.isidentifier()
    ):
        return None
    try:
        with open(os.path.join(sitedir, module + ".py"), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    target: ast.expr
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "MAPPING" and value is not None:
            try:
                mapping = ast.literal_eval(value)
            except ValueError:
                return None
            if isinstance(mapping, dict):
                return {str(k): str(v) for k, v in mapping.items()}
    return None


class _MappedFinder:
    """What a setuptools editable finder answers for its top-level names and their direct children."""

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: object = None) -> object:
        import importlib.machinery
        import importlib.util

        if fullname in _MAPPING:
            base = _MAPPING[fullname]
            suffixes = importlib.machinery.all_suffixes()
            for candidate in [os.path.join(base, "__init__.py")] + [base + s for s in suffixes]:
                if os.path.exists(candidate):
                    return importlib.util.spec_from_file_location(fullname, candidate)
            return None
        parent, _, _ = fullname.rpartition(".")
        if parent in _MAPPING:
            return importlib.machinery.PathFinder.find_spec(fullname, [_MAPPING[parent]])
        return None


def _add_sitedir(sitedir: str, known: "set[str]") -> None:
    """`site.addsitedir` without the code: the folder, then each .pth file's path lines."""
    if not os.path.isdir(sitedir) or sitedir in known:
        return
    known.add(sitedir)
    sys.path.append(sitedir)
    try:
        names = sorted(os.listdir(sitedir))
    except OSError:
        return
    for name in names:
        if not name.endswith(".pth") or name.startswith("."):
            continue
        try:
            with open(os.path.join(sitedir, name), encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith(("import ", "import\t")):
                mapping = _editable_mapping(sitedir, line)
                if mapping:
                    _MAPPING.update(mapping)
                continue  # code: never executed
            folder = os.path.abspath(os.path.join(sitedir, line.rstrip()))
            if folder not in known and os.path.exists(folder):
                known.add(folder)
                sys.path.append(folder)


def setup() -> None:
    import site  # under -S only the module is loaded: its main(), which runs .pth files, is not called

    venv = _pyvenv(sys.executable)
    bases = [sys.prefix, sys.exec_prefix]
    prefixes = list(bases)
    user = not os.environ.get("PYTHONNOUSERSITE")
    if venv is not None:
        prefix, system = venv
        sys.prefix = sys.exec_prefix = prefix  # as site.venv() sets them (Debian's getsitepackages reads it)
        prefixes = [prefix] + (bases if system else [])
        user = user and system
    known = set(sys.path)
    for folder in [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p][::-1]:
        sys.path.insert(0, folder)
    if venv is not None:  # site's order: the venv's site-packages, then the user site, then the system's
        for folder in site.getsitepackages([prefixes[0]]):
            _add_sitedir(folder, known)
        prefixes = prefixes[1:]
    if user and hasattr(os, "getuid") and os.getuid() == os.geteuid():
        _add_sitedir(site.getusersitepackages(), known)
    for folder in site.getsitepackages(prefixes) if prefixes else []:
        _add_sitedir(folder, known)
    if _MAPPING:
        sys.meta_path.append(_MappedFinder)  # type: ignore[arg-type]

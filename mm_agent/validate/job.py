"""The job under validation: its files, its launch commands and how paths resolve.

A relative path in a script or config is read, at run time, from the directory the reading process starts in:
the one its script `cd`s into, else wherever it is launched from (`mm-agent launch` and launch_all.sh start a
script in its job directory; the stock MindSpeed-MM scripts are started in the MindSpeed-MM root). So a relative
path resolves in a directory the script `cd`s into when that directory is here, else in the first of the job
directory, the script's directory and the MindSpeed-MM root where the named file exists (a job copied off the
cluster names a root that is not on this machine; its files are in the job). That root comes from the request,
else `MM_ROOT=` in the script (`mm_root_of`), else `MM_ROOT=` in another script, else `mm_root` in job.yaml.
With `root` set, nothing outside it (and the allowed roots) is read, and every file is re-checked against
it once open (`files.read_text`). An input that cannot be resolved (a symlink loop) is a finding with
the fix.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_agent.memo import remembered
from mm_agent.paths import owning_root
from mm_agent.validate.files import ConfigFile, load_config, read_text
from mm_agent.validate.findings import Severity, Sink
from mm_agent.validate.shell import LaunchCommand, ScriptInfo, parse_script

CONFIG_FLAGS = {"mm-data": "--mm-data", "mm-model": "--mm-model", "mm-tool": "--mm-tool"}
FE_MARKERS = ("feature_extraction", "get_wan_feature", "get_sora_feature", "runtime.extract")
# mm-agent's bundled runtime (`python -m runtime.<x>`): MindSpeed-MM's configs, its own launch flags.
BUNDLED_PREFIX = "runtime."


@dataclass
class ScriptFile:
    path: Path
    text: str
    info: ScriptInfo


@dataclass
class Launch:
    """One torchrun/python command of a script, with the config files it passes."""

    script: ScriptFile
    cmd: LaunchCommand
    configs: dict[str, ConfigFile] = field(default_factory=dict)
    flags: dict[str, list[str | None]] = field(default_factory=dict)
    yaml_flags: dict[str, str] = field(default_factory=dict)  # flag -> gpt_args key it came from

    @property
    def entry(self) -> str:
        return (self.cmd.entry or "").rsplit("/", 1)[-1]

    @property
    def is_feature(self) -> bool:
        return any(m in (self.cmd.entry or "") for m in FE_MARKERS)

    @property
    def is_bundled(self) -> bool:
        return (self.cmd.entry or "").startswith(BUNDLED_PREFIX)

    @property
    def is_training(self) -> bool:
        name = self.entry
        return not self.is_feature and (
            name.startswith(("pretrain", "posttrain", "finetune", "train", "trainer"))
            or name in (BUNDLED_PREFIX + "train", BUNDLED_PREFIX + "user_train")
        )

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def value(self, flag: str) -> str | None:
        values = self.flags.get(flag)
        return values[0] if values else None

    def int_flag(self, flag: str, default: int | None = 1) -> int | None:
        if flag not in self.flags:
            return None if self.cmd.has_unknown and not self.yaml_flags else default
        return to_int(self.value(flag))

    def env(self, name: str) -> str | None:
        return self.script.info.env.get(name)

    def where(self, flag: str | None = None, var: str | None = None) -> tuple[str, str | None, int | None]:
        """(file, field, line) to report a problem with `flag` (or the variable that sets it)."""
        if flag and flag in self.yaml_flags and "yaml" in self.configs:
            cfg = self.configs["yaml"]
            key = f"gpt_args.{self.yaml_flags[flag]}"
            return str(cfg.path), key, cfg.line(key)
        info = self.script.info
        if var and var in info.var_lines:
            return str(self.script.path), var, info.var_lines[var]
        if flag:
            return str(self.script.path), flag, info.flag_line(flag) or self.cmd.line
        return str(self.script.path), None, self.cmd.line


def exists(path: Path) -> bool:
    """Path.exists() that treats unusable names (NUL bytes, too long) as missing instead of raising."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def resolved(path: Path) -> Path | None:
    """`path.resolve()`, or None for names that cannot be resolved (a symlink loop, a NUL byte)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def _listed(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in dict.fromkeys(paths))


def to_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


class Job:
    def __init__(self, sink: Sink, root: Path | None, mm_root: str | None) -> None:
        self.sink = sink
        self.root = root
        self.mm_root: Path | None = Path(mm_root).expanduser().resolve() if mm_root else None
        self.mm_root_given = self.mm_root is not None  # the request's root replaces every script's MM_ROOT
        self.inputs: list[Path] = []  # the directories given to validate (a job's files are under one)
        self.configs: dict[Path, ConfigFile] = {}
        self.scripts: dict[Path, ScriptFile] = {}
        self.launches: list[Launch] = []
        self.failed: set[Path] = set()
        # One validation asks about the same few paths many times (each rule resolves the job's files and
        # weights again); symlinks followed once per path and validation, never kept beyond it.
        self._inside: dict[Path, bool] = {}
        self._real: dict[Path, Path | None] = {}

    # ---- filesystem ----------------------------------------------------------------------------------
    def inside(self, path: Path) -> bool:
        if self.root is None:
            return True
        if (known := self._inside.get(path)) is not None:
            return known
        # as paths.inside: symlinks followed, in the workspace or an allowed root; a path that cannot be
        # resolved (a loop, a NUL byte taken from a config) is inside nothing
        real = self.resolved(path)
        answer = real is not None and owning_root(real, self.root) is not None
        self._inside[path] = answer
        return answer

    def resolved(self, path: Path) -> Path | None:
        """`resolved(path)`, once per path in this validation."""
        if path not in self._real:
            self._real[path] = self._in_resolved_folder(path) or resolved(path)
        return self._real[path]

    def _in_resolved_folder(self, path: Path) -> Path | None:
        """A job's files share their folders: a name that is not a symlink is its folder's resolution (itself
        remembered) plus the name, one lstat instead of one per component. None: resolve it whole (a symlink,
        `..`, a relative path, an entry that cannot be read)."""
        parent = path.parent
        if not path.is_absolute() or parent == path or ".." in path.parts:
            return None
        base = self.resolved(parent)
        if base is None:
            return None
        try:
            return None if stat.S_ISLNK(os.lstat(path).st_mode) else base / path.name
        except FileNotFoundError:
            return base / path.name  # (as resolve() without strict: the folder's path, then the name)
        except (OSError, ValueError):
            return None

    def outside(self, path: Path, file: str, field: str | None, line: int | None) -> bool:
        """True (and an info finding) when `path` is outside the workspace root."""
        if self.inside(path):
            return False
        self.sink.info(
            "path.outside_workspace",
            file,
            f"{path} is outside the workspace {self.root}; not checked",
            "copy the file into the workspace, or run the validator with a wider root",
            field=field,
            line=line,
        )
        return True

    def job_dir(self, path: Path) -> Path:
        """The job directory `path` belongs to: the nearest folder above it holding job.yaml (not above the
        input directory that holds it), else that input directory, else the file's own folder."""
        tops = [d for d in self.inputs if path.is_relative_to(d)]
        top = max(tops, key=lambda d: len(d.parts)) if tops else None
        folders = [path.parent, *path.parent.parents]
        for folder in folders if top is not None else folders[:2]:
            if not self.inside(folder):
                break
            if is_file(folder / "job.yaml"):
                return folder
            if folder == top:
                break
        return top or path.parent

    @property
    def dirs(self) -> list[Path]:
        """The job directories: those holding a job.yaml, then the input directories."""
        return list(dict.fromkeys([*(c.path.parent for c in self.of_kind("job_yaml")), *self.inputs]))

    def mm_root_of(self, script: ScriptFile) -> Path | None:
        """The MindSpeed-MM root `script` runs with: the request's, else its own MM_ROOT, else the job's."""
        value = script.info.env.get("MM_ROOT")
        if self.mm_root_given or not value:
            return self.mm_root
        return self.resolve(value, base=script.path.parent)

    def candidates(self, search: Sequence[Path] = ()) -> list[Path]:
        """Where a relative path is looked for when the directory it is read from is not known, in order."""
        return list(dict.fromkeys([*search, *self.dirs, *([self.mm_root] if self.mm_root else [])]))

    def locate(
        self, raw: str, *, base: Path | None = None, search: Sequence[Path] = ()
    ) -> tuple[Path | None, Path | None, list[Path]]:
        """(path, the directory it was found in, the paths tried) for `raw`: absolute as-is; relative in `base`
        (the directory it is read from, when known), else in the first of `candidates(search)` where it exists
        (inside the workspace), else where the MindSpeed-MM root would hold it (None when that is unknown)."""
        raw = os.path.expanduser(raw.strip())
        if os.path.isabs(raw):
            return Path(os.path.normpath(raw)), None, []
        if base is not None:
            path = Path(os.path.normpath(base / raw))
            return path, base, [path]
        tried = [Path(os.path.normpath(d / raw)) for d in self.candidates(search)]
        for folder, path in zip(self.candidates(search), tried, strict=True):
            if self.inside(path) and exists(path):
                return path, folder, tried
        fallback = Path(os.path.normpath(self.mm_root / raw)) if self.mm_root else None
        return fallback, None, tried

    def resolve(self, raw: str, *, base: Path | None = None, search: Sequence[Path] = ()) -> Path | None:
        """Absolute path for `raw` (see `locate`); None when it is relative, found nowhere and the MindSpeed-MM
        root is unknown."""
        return self.locate(raw, base=base, search=search)[0]

    def check_path(
        self,
        raw: Any,
        *,
        file: str,
        field: str | None,
        line: int | None,
        what: str,
        severity: Severity = "warning",
        rule: str = "path.missing",
        fix: str | None = None,
        base: Path | None = None,
        search: Sequence[Path] = (),
    ) -> Path | None:
        """Resolve `raw` (see `locate`) and report it missing/unresolvable/outside, or found only in a job
        directory (info: say which); return the path when it exists."""
        if not isinstance(raw, str) or not raw.strip():
            return None
        path, folder, tried = self.locate(raw, base=base, search=search)
        if path is None:
            looked = f" (not in {_listed(tried)} either)" if tried else ""
            self.sink.info(
                "path.unresolved",
                file,
                f"{what} {raw!r} is relative and the MindSpeed-MM root is unknown{looked}; not checked",
                "pass mm_root (or set MM_ROOT= in the script / mm_root in job.yaml), or use an absolute path",
                field=field,
                line=line,
            )
            return None
        if self.outside(path, file, field, line):
            return None
        if exists(path):
            if base is None and folder is not None and folder != self.mm_root:
                self.sink.info(
                    "path.resolved",
                    file,
                    f"{what} {raw!r} checked as {path}: where the run reads it from is not known here, and "
                    f"{folder} is the first of {_listed(self.candidates(search))} that has it",
                    "make the path absolute if the run reads another file",
                    field=field,
                    line=line,
                )
            return path
        where = f"tried {_listed(tried)}" if len(tried) > 1 else str(path)
        self.sink.add(
            severity,
            rule,
            file,
            f"{what} {raw!r} does not exist ({where})",
            fix
            or f"point {field or 'the ' + what} at an existing path (fine if it only exists on the cluster)",
            field=field,
            line=line,
        )
        return None

    # ---- loading -------------------------------------------------------------------------------------
    def unresolvable(self, path: Path) -> None:
        """A loop used to crash the whole validation; now it is one finding that says how to fix it."""
        self.sink.error(
            "file.unreadable",
            str(path),
            "cannot resolve the path: a symlink loop, or a name no filesystem accepts",
            "remove or repoint the looping symlink, or pass the real file",
        )

    def load(self, path: Path, *, kind_hint: str | None = None) -> ConfigFile | None:
        real = self.resolved(path)
        if real is None:
            self.unresolvable(path)
            return None
        path = real
        if path in self.configs:
            return self.configs[path]
        if path in self.failed or not exists(path):
            return None
        cfg = load_config(path, self.sink, self.root, kind_hint=kind_hint)
        if cfg is None:
            self.failed.add(path)
            return None
        self.configs[path] = cfg
        return cfg

    def load_script(self, path: Path) -> ScriptFile | None:
        real = self.resolved(path)
        if real is None:
            self.unresolvable(path)
            return None
        path = real
        if path in self.scripts:
            return self.scripts[path]
        if path in self.failed:
            return None
        text = read_text(path, self.sink, self.root)
        if text is None:
            self.failed.add(path)
            return None
        normal = text.replace("\r\n", "\n")
        info = remembered("script", str(path), normal, lambda: parse_script(str(path), normal))
        script = ScriptFile(path, text, info)
        self.scripts[path] = script
        return script

    def find_mm_root(self) -> None:
        if self.mm_root is not None:
            return
        for script in self.scripts.values():
            value = script.info.env.get("MM_ROOT")
            if value:
                self.mm_root = self.resolve(value, base=script.path.parent)
                return
        for cfg in self.configs.values():
            if cfg.kind == "job_yaml" and isinstance(cfg.get("mm_root"), str):
                self.mm_root = self.resolve(cfg.get("mm_root"), base=cfg.path.parent)
                return

    # ---- queries -------------------------------------------------------------------------------------
    def of_kind(self, *kinds: str) -> list[ConfigFile]:
        return [c for c in self.configs.values() if c.kind in kinds]

    def users(self, cfg: ConfigFile) -> list[tuple[Launch, str]]:
        """(launch, role) pairs that pass `cfg`."""
        return [(ln, role) for ln in self.launches for role, c in ln.configs.items() if c is cfg]

    def is_wan(self) -> bool:
        for cfg in self.of_kind("sora_model", "fe_model", "inference_model"):
            if cfg.get("predictor.model_id") == "wandit" or cfg.get("ae.model_id") == "wan_video_vae":
                return True
        return False

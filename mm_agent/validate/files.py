"""Finding, reading and classifying the files of a job.

Files are classified by content (keys), not by name, except `*.sh`, `data.txt` and `job.yaml`.
Reading never raises: unreadable files, bad UTF-8 and binary junk become findings. Only regular files are
opened (a FIFO would block the call forever, a device never end), through `paths.open_file`, which with a
workspace `root` also checks what was really opened against it (a parent swapped for a symlink after the
check cannot leak a file from outside), and no more than `MAX_BYTES` of a file is ever read.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mm_agent import cancel
from mm_agent.errors import MMAgentError
from mm_agent.memo import remembered
from mm_agent.paths import open_file, read_upto
from mm_agent.validate.findings import Sink
from mm_agent.validate.parse import Parsed, ParseError, line_of, parse_json, parse_yaml

MAX_BYTES = 64 * 1024 * 1024
MAX_LINE = 1024 * 1024  # characters of one JSON Lines record read (a record with no newline is cut here)
MAX_WALK_FILES = 2000
MAX_DEPTH = 8
_SKIP_DIRS = {"__pycache__", "node_modules", "logs", "release", ".git", ".venv"}
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
HOSTFILE_NAMES = frozenset({"hosts", "hostfile", "machinefile", "nodefile"})


@dataclass
class ConfigFile:
    """One parsed JSON/YAML/txt file of the job."""

    path: Path
    kind: str
    data: Any = None
    lines: dict[str, int] = field(default_factory=dict)
    text: str = ""
    # where the process that reads it runs (the directory its launch `cd`s into), when known: relative paths
    # inside the file resolve there at run time. None: in the first of `search` (the directories its launch may
    # run in: job directory, script directory, MM_ROOT), the job directories and the MindSpeed-MM root that
    # holds the named file (`Job.locate`).
    run_base: Path | None = None
    search: tuple[Path, ...] = ()

    def line(self, key_path: str) -> int | None:
        return line_of(self.lines, key_path)

    def get(self, key_path: str, default: Any = None) -> Any:
        """Value at a dotted path (no list indices), or default."""
        node = self.data
        for part in key_path.split(".") if key_path else []:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def open_text(path: Path, root: Path | None) -> TextIO:
    """A regular file opened as UTF-8 text (undecodable bytes replaced), re-checked against `root`;
    MMAgentError (with the fix) when it is not a regular file, not readable, or now outside."""
    return io.TextIOWrapper(open_file(path, root, "path"), encoding="utf-8", errors="replace")


def lines(fh: TextIO) -> Iterator[str]:
    """The lines of a text file, each cut at MAX_LINE characters, so one endless line is never held."""
    return iter(lambda: fh.readline(MAX_LINE), "")


def jsonl_head(path: Path, root: Path | None, limit: int) -> list[Any]:
    """The first `limit` records of a JSONL file (None for a line that is not JSON), read line by line;
    MMAgentError/OSError as `open_text`."""
    out: list[Any] = []
    with open_text(path, root) as fh:
        for text in lines(fh):
            if len(out) >= limit:
                break
            if text.strip():
                try:
                    out.append(json.loads(text))
                except ValueError:
                    out.append(None)
    return out


def read_text(path: Path, sink: Sink, root: Path | None) -> str | None:
    """File text, or None after reporting why it can't be used."""
    shown = str(path)
    try:
        with open_file(path, root, "path") as fh:
            size = os.fstat(fh.fileno()).st_size
            raw = read_upto(fh, MAX_BYTES) if size <= MAX_BYTES else b""
    except MMAgentError as exc:
        sink.error("file.unreadable", shown, f"cannot read: {exc.message}", exc.fix or "fix the path")
        return None
    except OSError as exc:
        sink.error(
            "file.unreadable",
            shown,
            f"cannot read: {exc.strerror or exc}",
            "make the file readable by this user (chmod/chown) or fix the path",
        )
        return None
    if size > MAX_BYTES or len(raw) > MAX_BYTES:
        sink.warning(
            "file.too_large",
            shown,
            f"{max(size, len(raw))} bytes; files over {MAX_BYTES} bytes are not checked",
            "split the file, or validate a smaller sample of it",
        )
        return None
    if b"\x00" in raw:
        sink.error(
            "file.binary",
            shown,
            "binary content (NUL bytes) in a text config",
            "replace the file with the text config it should be (re-copy it; it may be corrupted)",
            line=raw[: raw.index(b"\x00")].count(b"\n") + 1,
        )
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        sink.error(
            "file.encoding",
            shown,
            f"not valid UTF-8 at byte {exc.start}",
            "re-save the file as UTF-8 (e.g. `iconv -f GBK -t UTF-8 in > out`)",
            line=raw[: exc.start].count(b"\n") + 1,
        )
        return None


def classify(data: Any, name: str) -> str:
    if name == "job.yaml":
        return "job_yaml"
    if isinstance(data, list):
        records = [r for r in data[:50] if isinstance(r, dict)]
        if not records:
            return "unknown"
        if any("messages" in r or "conversations" in r for r in records):
            return "vlm_dataset"
        return "raw_dataset"
    if not isinstance(data, dict):
        return "unknown"
    if "gpt_args" in data:
        return "transformers_yaml"
    if "parallel" in data and "training" in data:
        return "fsdp2_trainer_yaml"
    dataset = data.get("dataset_param")
    if isinstance(dataset, dict):
        dataset_type = dataset.get("dataset_type")
        if dataset_type == "feature":
            return "feature_data"
        if dataset_type == "huggingface":
            return "vlm_data"
        pre = dataset.get("preprocess_parameters")
        if isinstance(pre, dict) and "train_pipeline" in pre:
            return "fe_data"
        return "sora_data"
    if "pipeline_class" in data:
        return "inference_model"
    if "predictor" in data:
        return "sora_model"
    if "ae" in data and "text_encoder" in data:
        return "fe_model"
    if "image_encoder" in data or "text_decoder" in data:
        return "vlm_model"
    if any(k in data for k in ("sorafeature", "profile", "memory_profile")):
        return "tools"
    if "sharding_size" in data:
        return "fsdp2_config"
    if "zero3_size" in data:
        return "layerzero_config"
    return "unknown"


def load_config(
    path: Path, sink: Sink, root: Path | None, *, kind_hint: str | None = None
) -> ConfigFile | None:
    """Read and parse one JSON/YAML/data.txt file; syntax errors are reported, not raised."""
    cancel.check()  # an abandoned call reads no more files
    text = read_text(path, sink, root)
    if text is None:
        return None
    shown = str(path)
    if kind_hint == "data_txt" or path.name == "data.txt":
        return ConfigFile(path, "data_txt", text=text)
    if kind_hint == "hostfile" or is_hostfile(path):
        return ConfigFile(path, "hostfile", text=text)  # (launch_all.sh's host list: rules_launcher)
    is_yaml = path.suffix in (".yaml", ".yml")
    parsed: Parsed | ParseError = remembered(
        "config", is_yaml, text, (lambda: parse_yaml(text)) if is_yaml else (lambda: parse_json(text))
    )
    if isinstance(parsed, ParseError) and parsed.fix:  # well-formed but past a bound (an alias bomb)
        sink.error("yaml.limit", shown, parsed.message, parsed.fix, line=parsed.line)
        return ConfigFile(path, "unknown", text=text)
    if isinstance(parsed, ParseError):
        rule = "yaml.syntax" if is_yaml else "json.syntax"
        sink.error(
            rule,
            shown,
            f"invalid {'YAML' if is_yaml else 'JSON'}: {parsed.message}",
            f"fix the syntax{f' at line {parsed.line}' if parsed.line else ''}"
            + ("" if is_yaml else " (JSON allows no trailing commas, comments or single quotes)")
            + "; MindSpeed-MM otherwise stops with 'RuntimeError: One or more config files failed to load'",
            line=parsed.line,
        )
        return ConfigFile(path, "unknown", text=text)
    for key_path, line in parsed.duplicates:
        sink.warning(
            "json.duplicate_key",
            shown,
            f"key {key_path!r} is defined twice; the last one silently wins",
            "delete one of the two definitions",
            field=key_path,
            line=line,
        )
    return ConfigFile(path, classify(parsed.data, path.name), parsed.data, parsed.lines, text)


def is_hostfile(path: Path) -> bool:
    """A host list by its name: `hosts` (what render's next steps tell a pdsh job to write), `hostfile`,
    `machinefile`, `nodefile` (also with `.txt`), or `*.hosts` / `*.hostfile`."""
    name = path.name.removesuffix(".txt")
    return name in HOSTFILE_NAMES or path.suffix in (".hosts", ".hostfile")


def is_candidate(path: Path) -> bool:
    return path.suffix in (".sh", *CONFIG_SUFFIXES) or path.name == "data.txt" or is_hostfile(path)


def walk(directory: Path) -> list[Path]:
    """Candidate files under a job directory (scripts, configs, data.txt), skipping checkpoints."""
    found: list[Path] = []
    base_depth = len(directory.parts)
    for current, dirs, files in os.walk(directory):
        cancel.check()  # an abandoned call stops walking here
        here = Path(current)
        if "latest_checkpointed_iteration.txt" in files or any(f.endswith(".safetensors") for f in files):
            dirs[:] = []
            continue
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in _SKIP_DIRS
            and not d.startswith("iter_")
            and len(here.parts) - base_depth < MAX_DEPTH
        )
        for name in sorted(files):
            path = here / name
            if is_candidate(path):
                found.append(path)
                if len(found) >= MAX_WALK_FILES:
                    return found
    return found

"""Probe run *by the checked interpreter*: package versions, install origins and module locations as JSON.

Standard library only and Python 3.8-compatible, because it runs in the training environment, which need not
have mm-agent (or anything else) installed. It never imports the probed packages: `find_spec` locates a
top-level module without executing it, and versions come from distribution metadata.
Usage: python envprobe.py '{"dists": [...], "requires": [...], "direct_url": [...], "modules": [...],
"files": {"module": ["file", ...]}}'; `files` are read (the first FILE_HEAD bytes, as text) from the folder
of a package found by `modules`, e.g. torch/version.py for the build (CPU, CUDA); only regular files, opened
non-blocking (a FIFO planted there is skipped, never waited on).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
import sys

FILE_HEAD = 4096


def probe(request: dict) -> dict:
    import importlib.metadata as md
    import importlib.util

    out: dict = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "machine": platform.machine(),
        "dists": {},
        "requires": {},
        "direct_url": {},
        "modules": {},
        "files": {},
    }
    for name in request.get("dists", []):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out["dists"][name] = dist.version
        if name in request.get("requires", []):
            out["requires"][name] = list(dist.requires or [])
        if name in request.get("direct_url", []):
            text = dist.read_text("direct_url.json")
            if text:
                with contextlib.suppress(ValueError):
                    out["direct_url"][name] = json.loads(text)
    for module in request.get("modules", []):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        out["modules"][module] = (
            None
            if spec is None
            else {"origin": spec.origin, "locations": list(spec.submodule_search_locations or [])}
        )
    for module, names in request.get("files", {}).items():
        found = out["modules"].get(module)
        folders = found["locations"] if found else []
        for name in names:
            for folder in folders[:1]:
                text = _head(os.path.join(folder, name))
                if text is not None:
                    out["files"][module + "/" + name] = text
    return out


def _head(path: str) -> str | None:
    """The first FILE_HEAD bytes of a regular file as text; None for anything else or an unreadable one."""
    with contextlib.suppress(OSError):
        if not stat.S_ISREG(os.stat(path).st_mode):  # no device or FIFO is ever opened
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return os.read(fd, FILE_HEAD).decode("utf-8", "replace")
        finally:
            os.close(fd)
    return None


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))

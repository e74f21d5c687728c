"""Probe run *by the checked interpreter*: package versions, install origins and module locations as JSON.

Standard library only and Python 3.8-compatible, because it runs in the training environment, which need not
have mm-agent (or anything else) installed. It never imports the probed packages: `find_spec` locates a
top-level module without executing it, and versions come from distribution metadata.
Usage: python envprobe.py '{"dists": [...], "requires": [...], "direct_url": [...], "modules": [...]}'
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys


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
    return out


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))

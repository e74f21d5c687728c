"""Probes shared by several checks: the checked interpreter's packages, the torch_npu import, and the
CANN/driver install files. Anything that could import torch runs in a contained subprocess with a timeout
(`mm_agent.contained`), so doctor stays fast, cannot be taken down by a broken NPU stack, and leaves
nothing running behind it. Every probe runs as `python -I -S` (`probe_argv`): the checked environment's
`.pth` files, sitecustomize and PYTHON* variables run nothing; `sitepath.py` finds its packages as data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from mm_agent.contained import Finished, Scope, run_contained
from mm_agent.doctor.interpreter import open_interpreter
from mm_agent.errors import MMAgentError

ENVPROBE = Path(__file__).with_name("envprobe.py")
SITEPATH = Path(__file__).with_name("sitepath.py")
# runs the script sys.argv[1] as __main__ with the remaining arguments (after sitepath's setup)
RUN_SCRIPT = "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')"


class ModuleSpec(BaseModel):
    origin: str | None = None
    locations: list[str] = Field(default_factory=list)


class EnvProbe(BaseModel):
    """What the checked interpreter has installed (from envprobe.py)."""

    python: str
    executable: str
    prefix: str
    machine: str
    dists: dict[str, str] = Field(default_factory=dict)
    requires: dict[str, list[str]] = Field(default_factory=dict)
    direct_url: dict[str, dict[str, Any]] = Field(default_factory=dict)
    modules: dict[str, ModuleSpec | None] = Field(default_factory=dict)
    files: dict[str, str] = Field(
        default_factory=dict, description="'module/file' -> its first characters, for files the request named"
    )


class ProbeError(Exception):
    """A probe could not run or did not answer; the message says which and why."""


def probe_argv(python: str, code: str, args: Sequence[str] = ()) -> list[str]:
    """`python -I -S -c <sitepath.py + code> args...`: isolated (no PYTHON* variables, no current directory or
    script folder on sys.path) and without `site`, so no `.pth` line, sitecustomize or usercustomize of the
    checked environment runs; `sitepath.setup()` puts its packages on sys.path as data."""
    boot = SITEPATH.read_text(encoding="utf-8")
    return [python, "-I", "-S", "-c", f"{boot}\nsetup()\ndel setup\n{code}", *args]


def run_interpreter(
    python: str,
    code: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    timeout_s: float,
    what: str,
    scope: Scope,
) -> Finished:
    """Run `code` (with `args` as sys.argv[1:]) in the checked interpreter `python`, as `probe_argv` says:
    the descriptor checked by `open_interpreter` is what executes, in a contained process group (nothing it
    starts outlives the call)."""
    try:
        fd = open_interpreter(Path(python))
    except MMAgentError as exc:
        raise ProbeError(f"{python}: {exc.message}") from None
    try:
        done = run_contained(
            probe_argv(python, code, args), timeout_s=timeout_s, env=env, exec_fd=fd, scope=scope
        )
    except OSError as exc:
        raise ProbeError(f"cannot run {python}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if done.timed_out:
        raise ProbeError(
            f"{python} did not finish {what} within {timeout_s:.1f} s (stopped, with all it started)"
        )
    return done


def run_env_probe(
    python: str, request: Mapping[str, Any], *, env: Mapping[str, str], timeout_s: float, scope: Scope
) -> EnvProbe:
    out = run_interpreter(
        python,
        RUN_SCRIPT,
        [str(ENVPROBE), json.dumps(dict(request))],
        env=env,
        timeout_s=timeout_s,
        what="the package probe",
        scope=scope,
    )
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"{python} failed the package probe (exit {out.returncode}): {tail}")
    try:
        return EnvProbe.model_validate_json(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise ProbeError(f"{python} printed an unreadable probe result: {exc}") from None


TORCH_NPU_PROBE = """
import json, os
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
import torch
out = {"torch": torch.__version__}
try:
    import torch_npu
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
else:
    out["torch_npu"] = getattr(torch_npu, "__version__", None)
    out["cann"] = getattr(torch.version, "cann", None)
    try:
        out["npu_count"] = torch.npu.device_count()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def run_torch_npu_probe(
    python: str, *, env: Mapping[str, str], timeout_s: float, scope: Scope
) -> dict[str, Any]:
    """Import torch (backend autoload off, as on a CPU-only box) and torch_npu in a child process."""
    out = run_interpreter(
        python,
        TORCH_NPU_PROBE,
        env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        timeout_s=timeout_s,
        what="`import torch, torch_npu`",
        scope=scope,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail}
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable probe output: {lines[-1][:200]}"}
    return result


TORCH_CUDA_PROBE = """
import json, os
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda}
try:
    out["available"] = bool(torch.cuda.is_available())
    out["count"] = torch.cuda.device_count() if out["available"] else 0
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def run_torch_cuda_probe(
    python: str, *, env: Mapping[str, str], timeout_s: float, scope: Scope
) -> dict[str, Any]:
    """`torch.cuda.is_available()` and the GPU count, asked of the checked interpreter in a child process."""
    out = run_interpreter(
        python,
        TORCH_CUDA_PROBE,
        env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        timeout_s=timeout_s,
        what="`import torch; torch.cuda.is_available()`",
        scope=scope,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable probe output: {lines[-1][:200]}"}
    return result


# ---------------------------------------------------------------------------------------------------------
# CANN toolkit and driver install files


def ascend_bases(env: Mapping[str, str]) -> list[Path]:
    """Where Ascend software may be installed: `$MM_AGENT_ASCEND_BASE` (colon-separated), the root
    default /usr/local/Ascend and the non-root default ~/Ascend."""
    extra = [Path(p).expanduser() for p in env.get("MM_AGENT_ASCEND_BASE", "").split(os.pathsep) if p]
    return [*extra, Path("/usr/local/Ascend"), Path.home() / "Ascend"]


def read_kv(path: Path) -> dict[str, str]:
    """key=value lines (ascend_toolkit_install.info, driver version.info), keys lower-cased."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    return values


class InstallInfo(BaseModel):
    version: str | None
    file: str
    root: str


def _toolkit_roots(env: Mapping[str, str]) -> list[Path]:
    roots = [Path(env[k]) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if env.get(k)]
    for base in ascend_bases(env):
        roots += [base / "cann", base / "cann" / "latest", base / "ascend-toolkit" / "latest"]
        roots += sorted(base.glob("cann-*"), reverse=True)
    return roots


def cann_toolkit(env: Mapping[str, str]) -> InstallInfo | None:
    """The CANN toolkit's install info: `<root>/<arch>-linux/ascend_toolkit_install.info` (version=...),
    else `<root>/version.cfg`."""
    seen: set[Path] = set()
    for root in _toolkit_roots(env):
        if root in seen or not root.is_dir():
            continue
        seen.add(root)
        for info in [
            *sorted(root.glob("*-linux/ascend_toolkit_install.info")),
            root / "ascend_toolkit_install.info",
        ]:
            if info.is_file():
                return InstallInfo(version=read_kv(info).get("version"), file=str(info), root=str(root))
        cfg = root / "version.cfg"  # older layouts: toolkit_running_version=[<inner>:<CANN version>]
        if cfg.is_file():
            values = read_kv(cfg)
            raw = values.get("toolkit_running_version") or values.get("runtime_running_version") or ""
            version = raw.strip("[]").rpartition(":")[2] or None
            return InstallInfo(version=version, file=str(cfg), root=str(root))
    return None


def driver_info(env: Mapping[str, str]) -> InstallInfo | None:
    """The NPU driver's `driver/version.info` (Version=...)."""
    for base in ascend_bases(env):
        info = base / "driver" / "version.info"
        if info.is_file():
            return InstallInfo(
                version=read_kv(info).get("version"), file=str(info), root=str(base / "driver")
            )
    return None


def find_library(name: str, env: Mapping[str, str]) -> Path | None:
    """First `name` in $LD_LIBRARY_PATH, the path the loader uses for CANN libraries."""
    for folder in env.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if folder and (Path(folder) / name).exists():
            return Path(folder) / name
    return None

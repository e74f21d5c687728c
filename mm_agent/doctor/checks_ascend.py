"""Checks of the Ascend stack: CANN toolkit and driver versions, NPUs from `npu-smi info`, and whether the
CANN and NNAL environments are sourced in this shell (the #1 cause of `libhccl.so` / `No module named 'acl'`).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from mm_agent.doctor.context import Context
from mm_agent.doctor.probes import InstallInfo, ascend_bases, cann_toolkit, driver_info, find_library
from mm_agent.doctor.registry import MM_ONLY, Outcome, check, fail, ok, skip, warn

_LEADING_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_DEVICE_MOUNTS = "/dev/davinci*, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc"


def _version_tuple(text: str) -> tuple[int, ...] | None:
    m = _LEADING_VERSION.match(text.strip())
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def cann_set_env(ctx: Context, toolkit: InstallInfo | None) -> str:
    """The CANN set_env.sh to name in a fix: the MM version's, else the one next to the found install."""
    wanted = ctx.version.cann_env[0]
    if Path(wanted).is_file() or toolkit is None:
        return wanted
    root = Path(toolkit.root)
    for folder in (root, root.parent):
        if (folder / "set_env.sh").is_file():
            return str(folder / "set_env.sh")
    return wanted


def nnal_set_env(ctx: Context) -> tuple[str, bool]:
    """(nnal set_env.sh to name, whether it exists)."""
    named = [p for p in ctx.version.cann_env if "/nnal/" in p] or ["/usr/local/Ascend/nnal/atb/set_env.sh"]
    candidates = [Path(named[0])] + [b / "nnal" / "atb" / "set_env.sh" for b in ascend_bases(ctx.env)]
    for path in candidates:
        if path.is_file():
            return str(path), True
    return named[0], False


@check("cann_version", "CANN toolkit version matches the version matrix", MM_ONLY)
def cann_version(ctx: Context) -> Outcome:
    toolkit = cann_toolkit(ctx.env)
    want = ctx.version.cann
    if toolkit is None:
        return fail(
            "CANN toolkit not found",
            f"install the CANN {want or ''} toolkit and the kernels package for your NPU, then "
            f"`source {shlex.quote(ctx.version.cann_env[0])}`".replace("  ", " "),
            [
                "looked in $ASCEND_HOME_PATH, $ASCEND_TOOLKIT_HOME and {cann, cann/latest, ascend-toolkit/latest, cann-*} "
                f"under {', '.join(str(b) for b in ascend_bases(ctx.env))}"
            ],
        )
    evidence = [
        f"{toolkit.file}: version={toolkit.version}",
        f"MM {ctx.version.id} matrix: CANN {want or 'not listed'}",
    ]
    if not toolkit.version:
        return warn(
            "CANN toolkit found but its version is unreadable", "reinstall the CANN toolkit", evidence
        )
    if want is None:
        return ok(f"CANN {toolkit.version} (the matrix lists no CANN for MM {ctx.version.id})", evidence)
    have_t, want_t = _version_tuple(toolkit.version), _version_tuple(want)
    if have_t is not None and want_t is not None and have_t[: len(want_t)] == want_t:
        return ok(f"CANN {toolkit.version}", evidence)
    return warn(
        f"CANN {toolkit.version}, but MindSpeed-MM {ctx.version.id} is released against CANN {want}",
        f"install CANN {want} (toolkit, kernels and NNAL of the same release); a CANN/torch_npu mismatch fails "
        "at NPU init (error code 500001 / ERR00100)",
        evidence,
    )


@check("driver_version", "NPU driver installed", MM_ONLY)
def driver_version(ctx: Context) -> Outcome:
    drv = driver_info(ctx.env)
    if drv is None:
        return fail(
            "no Ascend NPU driver found",
            "install the Ascend NPU driver and firmware (npu-smi comes with them); in a container, mount the "
            "host's /usr/local/Ascend/driver",
            [f"looked for driver/version.info under {', '.join(str(b) for b in ascend_bases(ctx.env))}"],
        )
    return ok(f"driver {drv.version or '(version unreadable)'}", [f"{drv.file}: Version={drv.version}"])


@check("npu_devices", "NPUs visible to npu-smi and healthy", MM_ONLY)
def npu_devices(ctx: Context) -> Outcome:
    info = ctx.npu()
    if info is None:
        return fail(
            "npu-smi not found: no NPU driver on this machine (or not on PATH)",
            f"install the Ascend driver; in docker also mount /usr/local/bin/npu-smi and {_DEVICE_MOUNTS}",
        )
    if info.error:
        return fail(
            info.error,
            "check the driver with `npu-smi info` as root; after a driver upgrade reboot; in docker mount "
            f"{_DEVICE_MOUNTS}",
        )
    evidence = [
        f"NPU {c.npu} chip {c.chip}"
        + (f" (phy {c.phy_id})" if c.phy_id is not None else "")
        + f": {c.name} {c.health}"
        + (f", HBM {c.hbm_used_mb}/{c.hbm_total_mb} MB" if c.hbm_total_mb else "")
        for c in info.chips
    ]
    evidence += [
        f"NPU {p.npu} chip {p.chip} in use by PID {p.pid} ({p.name}, {p.memory_mb} MB)"
        for p in info.processes
    ]
    count = len(info.chips)
    bad = [c for c in info.unhealthy if c.health.lower() in {"alarm", "critical"}]
    if bad:
        ids = ", ".join(f"{c.npu}/{c.chip}" for c in bad)
        return fail(
            f"{len(bad)} of {count} NPU(s) unhealthy ({ids})",
            "see `npu-smi info -t health -i <id>`; exclude them with ASCEND_RT_VISIBLE_DEVICES or ask the admin "
            "to reset/replace the card",
            evidence,
        )
    visible = ctx.env.get("ASCEND_RT_VISIBLE_DEVICES", "")
    if visible:
        wanted = [int(x) for x in re.findall(r"\d+", visible)]
        beyond = [i for i in wanted if i >= count]
        evidence.append(f"ASCEND_RT_VISIBLE_DEVICES={visible}")
        if beyond:
            return fail(
                f"ASCEND_RT_VISIBLE_DEVICES names NPU(s) {beyond}, but only {count} exist (0-{count - 1})",
                "match ASCEND_RT_VISIBLE_DEVICES to `npu-smi info`",
                evidence,
            )
        count = len(wanted)
    if ctx.npus_per_node and count < ctx.npus_per_node:
        return fail(
            f"{count} NPU(s) usable, but the job runs {ctx.npus_per_node} per node",
            f"render the job with --npus-per-node {count} (and parallel sizes that divide it)",
            evidence,
        )
    if info.unhealthy:
        return warn(
            f"{count} NPU(s); {len(info.unhealthy)} report a health warning",
            "see `npu-smi info -t health -i <id>` before a long run",
            evidence,
        )
    return ok(f"{count} NPU(s), all healthy (npu-smi {info.version})", evidence)


@check("cann_env", "CANN environment sourced (ASCEND_HOME_PATH, libhccl.so)", MM_ONLY)
def cann_env(ctx: Context) -> Outcome:
    toolkit = cann_toolkit(ctx.env)
    script = cann_set_env(ctx, toolkit)
    home_var = next((k for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if ctx.env.get(k)), None)
    hccl = find_library("libhccl.so", ctx.env)
    evidence = [
        f"{home_var}={ctx.env[home_var]}"
        if home_var
        else "ASCEND_HOME_PATH and ASCEND_TOOLKIT_HOME are not set",
        f"libhccl.so: {hccl}" if hccl else "libhccl.so: not in any LD_LIBRARY_PATH folder",
    ]
    if home_var is None and toolkit is None:
        return fail(
            "CANN is neither installed nor sourced",
            f"install the CANN toolkit{' ' + ctx.version.cann if ctx.version.cann else ''}, then `source {shlex.quote(str(script))}`",
            evidence,
        )
    if home_var is None or hccl is None:
        where = f" (installed at {toolkit.root})" if toolkit else ""
        return fail(
            f"CANN environment not sourced in this shell{where}",
            f"`source {shlex.quote(str(script))}` (in every shell and in the launch script; `docker exec` and non-interactive "
            "shells skip .bashrc)",
            evidence,
        )
    site = Path(ctx.env[home_var]) / "python" / "site-packages"
    pythonpath = [p for p in ctx.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site.is_dir() and not any(Path(p) == site for p in pythonpath):
        return fail(
            "PYTHONPATH lacks CANN's python/site-packages: it was overwritten after sourcing set_env.sh",
            f"prepend instead of overwriting (`export PYTHONPATH=...:$PYTHONPATH`), then `source {shlex.quote(str(script))}` again; "
            "otherwise `No module named 'acl'`",
            [*evidence, f"expected on PYTHONPATH: {site}"],
        )
    return ok(f"sourced ({ctx.env[home_var]})", evidence)


@check("nnal_env", "NNAL/ATB environment sourced (libatb.so)", MM_ONLY)
def nnal_env(ctx: Context) -> Outcome:
    atb = find_library("libatb.so", ctx.env)
    script, exists = nnal_set_env(ctx)
    evidence = [
        f"libatb.so: {atb}" if atb else "libatb.so: not in any LD_LIBRARY_PATH folder",
        f"ATB_HOME_PATH={ctx.env.get('ATB_HOME_PATH', '(unset)')}",
    ]
    if atb:
        return ok(f"libatb.so found ({atb.parent})", evidence)
    required = any("/nnal/" in p for p in ctx.version.cann_env)
    verdict = fail if required else warn
    if exists:
        return verdict(
            "NNAL is installed but its environment is not sourced",
            f"`source {shlex.quote(str(script))}` (after CANN's set_env.sh)",
            evidence,
        )
    if cann_toolkit(ctx.env) is None and not required:
        return skip("no CANN toolkit; NNAL is not part of this MM version's documented setup", evidence)
    return verdict(
        "NNAL (ATB) is not installed: `OSError: libatb.so: cannot open shared object file`",
        f"install the NNAL package of the same CANN release after sourcing CANN's set_env.sh, then `source {shlex.quote(str(script))}`",
        evidence,
    )

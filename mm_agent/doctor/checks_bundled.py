"""Checks of what a bundled-runtime job (`runtime: bundled` in job.yaml) runs with: the training interpreter's
Python, the `runtime` package and mm-agent in it, torch at a version the runtime supports, the runtime extra's
other packages (all from mm-agent's own metadata, `bundled.py`) and the device the job asks for.

The device is decided without importing torch where a file says enough (torch/version.py names the build: a
CPU-only build never sees a GPU); otherwise torch (and torch_npu) are imported in a contained child process.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from mm_agent.doctor.bundled import INSTALL_HINT, pip_install, runtime_needs
from mm_agent.doctor.checks_python import probe_or_fail
from mm_agent.doctor.context import PROBED_FILES, Context
from mm_agent.doctor.probes import EnvProbe, ProbeError, run_torch_cuda_probe, run_torch_npu_probe
from mm_agent.doctor.registry import BUNDLED_ONLY, Outcome, check, fail, ok, warn

# What torch/version.py says about the build: `cuda: Optional[str] = '12.8'` or `= None`.
_BUILD_LINE = re.compile(r"^(cuda|hip|rocm|xpu)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)
NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
CANN_FIX = (
    "source the CANN environment (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`) in the shell that "
    "starts the job"
)


def rerender(ctx: Context, flags: str) -> str:
    """The command that re-renders this job in place with `flags` changed (job.yaml keeps the rest)."""
    if ctx.job_dir is None:
        return f"re-render the job with {flags}"
    job = shlex.quote(str(ctx.job_dir))
    return f"re-render it: `mm-agent render --from {job}/job.yaml --out {job} --force {flags}`"


def elsewhere(ctx: Context) -> str:
    """How to run the job on the CPU instead: the device comes from job.yaml or from $MM_AGENT_DEVICE."""
    if ctx.device_choice()[1].startswith("$"):
        return "or `export MM_AGENT_DEVICE=cpu` (or unset it)"
    return "or " + rerender(ctx, "--device cpu")


def _satisfies(installed: str, req: Requirement) -> bool:
    try:
        return req.specifier.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


def torch_build(env: EnvProbe) -> dict[str, str | None]:
    """{cuda, hip, rocm, xpu} -> version or None, from the installed torch/version.py ({} when unread)."""
    text = env.files.get("torch/version.py")
    if text is None:
        return {}
    build: dict[str, str | None] = {}
    for name, value in _BUILD_LINE.findall(text):
        value = value.strip().strip("'\"")
        build[name] = None if value == "None" else value
    return build


def _build_text(build: dict[str, str | None]) -> str:
    accel = [f"{k.upper() if k != 'rocm' else 'ROCm'} {v}" for k, v in build.items() if v]
    if not build:
        return "build unknown (torch/version.py not read)"
    return f"{', '.join(accel)} build" if accel else "CPU-only build"


@check(
    "runtime_install",
    "Bundled runtime installed for the training interpreter (Python, mm-agent, runtime/)",
    BUNDLED_ONLY,
)
def runtime_install(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    needs = runtime_needs()
    evidence = [
        f"interpreter: {env.executable} (Python {env.python}; {ctx.python_source})",
        f"requirements: {needs.source}",
    ]
    if needs.requires_python is not None:
        evidence.append(f"mm-agent requires Python{needs.requires_python}")
        if not needs.requires_python.contains(env.python, prereleases=True):
            return fail(
                f"Python {env.python}, but the bundled runtime needs Python{needs.requires_python}",
                f"create the training env with a Python{needs.requires_python} (`python3 -m venv .venv`), "
                f"then {INSTALL_HINT}; pass its interpreter with --python",
                evidence,
            )
    version = env.dists.get("mm-agent")
    evidence.append(f"mm-agent {version or '-'} installed in this interpreter")
    missing = []
    if env.modules.get("mm_agent") is None:
        missing.append("mm_agent (the runtime imports mm_agent.convert for the checkpoint layout)")
    spec = env.modules.get("runtime")
    if spec is None or not spec.locations:
        missing.append("runtime (`python -m runtime.train`: No module named runtime)")
    else:
        absent = [f for f in PROBED_FILES["runtime"] if f"runtime/{f}" not in env.files]
        evidence.append(f"runtime package: {spec.locations[0]}")
        if absent:
            missing.append(f"runtime at {spec.locations[0]} is not mm-agent's (no {', '.join(absent)})")
    if missing:
        return fail(
            f"{env.executable} cannot run the bundled runtime: {'; '.join(missing)}",
            f"{pip_install(env.executable, ['-e', '.[runtime]'])}, or pass the interpreter of the env that has "
            "it with --python (the job's scripts use $PYTHON, default the interpreter that rendered the job)",
            evidence,
        )
    summary = f"Python {env.python}, runtime at {spec.locations[0] if spec else '?'}"
    if ctx.python_problem is not None:
        status, problem, fix = ctx.python_problem
        return Outcome(status, f"{problem} ({summary})", evidence, fix)
    return ok(summary, evidence)


@check("runtime_torch", "torch at a version the bundled runtime supports", BUNDLED_ONLY)
def runtime_torch(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    needs = runtime_needs()
    req = needs.get("torch")
    have = env.dists.get("torch")
    want = str(req.specifier) if req is not None else ""
    evidence = [
        f"the bundled runtime needs torch{want or ' (no version listed)'} ({needs.source})",
        f"installed: torch {have or '-'}" + (f", {_build_text(torch_build(env))}" if have else ""),
    ]
    pip = pip_install(env.executable, [f"torch{want}"])
    if have is None:
        return fail("torch is not installed", f"{pip}, or {INSTALL_HINT}", evidence)
    if req is not None and not _satisfies(have, req):
        return fail(
            f"torch {have}, but the bundled runtime needs torch{want} (FSDP2 `fully_shard`, DCP state dicts)",
            pip,
            evidence,
        )
    return ok(f"torch {have} ({_build_text(torch_build(env))})", evidence)


@check("runtime_deps", "Other packages of the bundled runtime (the `runtime` extra)", BUNDLED_ONLY)
def runtime_deps(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    needs = runtime_needs()
    if not needs.requirements:
        return warn(
            f"cannot tell which packages the bundled runtime needs: {needs.source}",
            INSTALL_HINT,
        )
    own_checks = {"torch", "decord"}  # runtime_torch and decord report these
    bad, evidence = [], [f"from {needs.source}"]
    for req in needs.requirements:
        if req.name in own_checks:
            continue
        have = env.dists.get(req.name)
        evidence.append(f"{req.name}{req.specifier}: installed {have or '-'}")
        if have is None or not _satisfies(have, req):
            bad.append(f"{req.name}{req.specifier}")
    if bad:
        return fail(
            f"missing or too old: {', '.join(bad)}",
            f"{pip_install(env.executable, bad)}, or {INSTALL_HINT}",
            evidence,
        )
    return ok(f"{len(evidence) - 1} package(s) satisfied", evidence)


def _npu(ctx: Context, env: EnvProbe, evidence: list[str]) -> tuple[Outcome, bool]:
    """The NPU's verdict, and whether the runtime's auto choice would take the NPU (it is there, or could
    not be ruled out in time): a present NPU with too few chips fails the job, never falls back."""
    ranks = ctx.npus_per_node or 1
    if "torch_npu" not in env.dists:
        return fail(
            "the job runs on the NPU, but torch_npu is not installed in the training interpreter",
            f"pip install the torch_npu wheel built for torch {env.dists.get('torch', '?')} (with CANN "
            f"installed), {elsewhere(ctx)}",
            evidence,
        ), False
    try:
        result = run_torch_npu_probe(ctx.python, env=ctx.env, timeout_s=ctx.remaining(), scope=ctx.scope)
    except ProbeError as exc:
        return warn(
            f"could not confirm the NPU: {exc}",
            f"rerun `mm-agent doctor --job ... --check runtime_device --timeout {max(20, ctx.timeout_s * 4):g}`",
            evidence,
        ), True
    if result.get("error"):
        return fail(
            "import torch_npu fails", f"{CANN_FIX}, {elsewhere(ctx)}", [*evidence, str(result["error"])]
        ), False
    count = int(result.get("npu_count") or 0)
    evidence.append(f"torch_npu {result.get('torch_npu')} sees {count} NPU(s), CANN {result.get('cann')}")
    if count < ranks:
        return fail(
            f"{count} NPU(s) visible, the job starts {ranks} process(es) per node",
            f"check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES, or {rerender(ctx, f'--npus-per-node {max(count, 1)}')}",
            evidence,
        ), count > 0
    return ok(f"NPU: {count} visible for {ranks} process(es) per node (hccl)", evidence), True


def _cuda(ctx: Context, env: EnvProbe, evidence: list[str]) -> tuple[Outcome, bool]:
    """As `_npu`, for CUDA."""
    ranks = ctx.npus_per_node or 1
    build = torch_build(env)
    fix = f"install a CUDA build of torch into the training env and check `nvidia-smi`, {elsewhere(ctx)}"
    if build and not build.get("cuda") and not build.get("hip"):
        return fail(
            f"the job runs on CUDA, but torch {env.dists.get('torch')} is a CPU-only build "
            "(torch.version.cuda is None): torch.cuda.is_available() is False",
            fix,
            evidence,
        ), False
    driver = [f for f in NVIDIA_DRIVER_FILES if Path(f).exists()]
    evidence.append(
        f"NVIDIA driver files: {', '.join(driver) or 'none of ' + ', '.join(NVIDIA_DRIVER_FILES)}"
    )
    if not driver and not build.get("hip"):
        return fail(
            "the job runs on CUDA, but no NVIDIA driver is loaded on this machine", fix, evidence
        ), False
    try:
        result = run_torch_cuda_probe(ctx.python, env=ctx.env, timeout_s=ctx.remaining(), scope=ctx.scope)
    except ProbeError as exc:
        return warn(
            f"could not confirm CUDA: {exc}",
            f"rerun `mm-agent doctor --job ... --check runtime_device --timeout {max(20, ctx.timeout_s * 4):g}`",
            evidence,
        ), True
    if result.get("error"):
        return fail("torch.cuda fails", fix, [*evidence, str(result["error"])]), False
    count = int(result.get("count") or 0)
    evidence.append(f"torch.cuda.is_available() = {result.get('available')}, {count} GPU(s)")
    if count < ranks:
        return fail(
            f"{count} GPU(s) usable, the job starts {ranks} process(es) per node",
            f"check `nvidia-smi` and CUDA_VISIBLE_DEVICES, or {rerender(ctx, f'--npus-per-node {max(count, 1)}')}"
            if count
            else fix,
            evidence,
        ), count > 0
    return ok(f"CUDA: {count} GPU(s) for {ranks} process(es) per node (nccl)", evidence), True


@check("runtime_device", "The job's device (cpu / cuda / npu) is usable", BUNDLED_ONLY)
def runtime_device(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    want, source = ctx.device_choice()
    torch = env.dists.get("torch")
    evidence = [f"device {want} ({source})", f"torch {torch or '-'}, {_build_text(torch_build(env))}"]
    if torch is None:
        return fail("torch is not installed: no device can be used", INSTALL_HINT, evidence)
    if want not in ("auto", "cpu", "cuda", "npu"):
        return fail(
            f"unknown device {want!r}: the runtime stops with `unknown device`",
            "set MM_AGENT_DEVICE (or job.yaml device) to one of auto, npu, cuda, cpu",
            evidence,
        )
    if want == "npu":
        return _npu(ctx, env, evidence)[0]
    if want == "cuda":
        return _cuda(ctx, env, evidence)[0]
    ranks = ctx.npus_per_node or 1
    cpus = os.cpu_count() or 1
    if want == "cpu":
        evidence.append(f"{ranks} process(es) per node on {cpus} CPU core(s) (gloo)")
        return ok(f"CPU: {ranks} process(es) per node (gloo, fp32)", evidence)
    # auto: say what the runtime will pick, confirming an accelerator only when one can be there.
    build = torch_build(env)
    if "torch_npu" in env.dists:
        picked, taken = _npu(ctx, env, list(evidence))
        if taken:  # the runtime takes the NPU (or it could not be ruled out in time)
            return picked
        evidence.append(f"NPU not usable ({picked.summary}): the runtime falls back to CUDA, then CPU")
    if build.get("cuda") and any(Path(f).exists() for f in NVIDIA_DRIVER_FILES):
        picked, taken = _cuda(ctx, env, list(evidence))
        if taken:
            return picked
        evidence.append(f"CUDA not usable ({picked.summary})")
    evidence.append(f"{ranks} process(es) per node on {cpus} CPU core(s) (gloo)")
    return ok(f"auto picks the CPU: {ranks} process(es) per node (gloo, fp32)", evidence)

"""Checks of the training interpreter: Python, torch/torch_npu, the MM base pins, the model's overlay, decord.

Versions come from distribution metadata reported by the checked interpreter (never by importing the
packages); only `torch_npu_import` imports anything, in a child process with a timeout.
"""

from __future__ import annotations

import shlex

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mm_agent.doctor.context import Context
from mm_agent.doctor.gitinfo import installed_commit
from mm_agent.doctor.probes import EnvProbe, ProbeError, run_torch_npu_probe
from mm_agent.doctor.registry import MM_ONLY, Outcome, check, fail, ok, skip, warn
from mm_agent.doctor.trainenv import NoTrainingEnv


def probe_or_fail(ctx: Context, lead: bool = False) -> EnvProbe | Outcome:
    """The judged interpreter's probe, or the `fail` every interpreter check reports when it cannot run. When
    no training environment is judged (`trainenv.py`), the `lead` check (python_version) warns with why and how
    to name one; the others skip, pointing at it."""
    try:
        return ctx.pyenv()
    except NoTrainingEnv as exc:
        if lead:
            return warn(exc.summary, exc.fix, exc.evidence)
        return skip("no training environment judged (see python_version): pass --python <env>/bin/python")
    except ProbeError as exc:
        return fail(
            f"cannot inspect the training interpreter: {exc}",
            "pass the training environment's interpreter with --python /path/to/env/bin/python",
            [f"interpreter: {ctx.python}"],
        )


def env_fix(ctx: Context, fix: str) -> str:
    """`fix` (an install into the judged env) as it applies when that env is mm-agent's own and the run is
    MindSpeed-MM's: never in mm-agent's env (it would break mm-agent and leave the job without its own), but
    in a training env of its own."""
    if not ctx.judges_agent_env:
        return fix
    return (
        f"not in {ctx.python}: mm-agent itself runs in that environment. Create a separate training env "
        f"(Python {ctx.version.python}, e.g. `conda create -n mm python={ctx.version.python}`), there: {fix}; "
        "then pass its interpreter with --python"
    )


def base_version(text: str) -> str:
    try:
        return Version(text).base_version
    except InvalidVersion:
        return text


def _satisfies(installed: str, spec: SpecifierSet) -> bool:
    try:
        return spec.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


def _pin(value: str) -> str:
    """A base pin from versions.yaml: a bare version means ==."""
    return value if value[:1] in "<>=!~" else f"=={value}"


@check("python_version", "Python version matches the MindSpeed-MM version", MM_ONLY)
def python_version(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx, lead=True)
    if isinstance(env, Outcome):
        return env
    want = ctx.version.python
    have = ".".join(env.python.split(".")[:2])
    evidence = [
        f"interpreter: {env.executable} (Python {env.python})",
        f"MM {ctx.version.id} matrix: Python {want}",
    ]
    if have == want:
        return ok(f"Python {env.python}", evidence)
    return warn(
        f"Python {env.python}, but MindSpeed-MM {ctx.version.id} is built and tested on Python {want}",
        f"create the training env with Python {want} (e.g. `conda create -n mm python={want}`) and pass its "
        "interpreter with --python if mm-agent runs elsewhere",
        evidence,
    )


@check("torch_version", "torch and torch_npu match the version matrix", MM_ONLY)
def torch_version(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    v = ctx.version
    want_torch = v.torch
    torch, npu = env.dists.get("torch"), env.dists.get("torch_npu")
    evidence = [
        f"MM {v.id} matrix: torch {want_torch}, torch_npu {v.torch_npu or 'not listed'}, CANN {v.cann or 'not listed'}",
        f"installed: torch {torch or '-'}, torch_npu {npu or '-'}",
    ]
    wheel = f"torch_npu=={want_torch}.*"
    if torch is None:
        return fail(
            "torch is not installed",
            env_fix(
                ctx,
                f"pip install torch=={want_torch} then the matching torch_npu wheel ({wheel}) for your CPU architecture",
            ),
            evidence,
        )
    if base_version(torch) != want_torch:
        return fail(
            f"torch {torch}, but MindSpeed-MM {v.id} needs torch {want_torch}",
            env_fix(
                ctx,
                f"pip install torch=={want_torch} and the matching {wheel} (torch_npu only loads into the torch "
                "release it was built for)",
            ),
            evidence,
        )
    if npu is None:
        return fail(
            f"torch {torch} is installed but torch_npu is not: no NPU backend",
            env_fix(ctx, f"pip install the torch_npu wheel built for torch {want_torch} ({wheel})"),
            evidence,
        )
    for spec in env.requires.get("torch_npu", []):
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        if req.name == "torch" and not req.marker and not _satisfies(torch, req.specifier):
            return fail(
                f"torch_npu {npu} requires torch{req.specifier}, but torch {torch} is installed",
                env_fix(
                    ctx,
                    f"install the torch_npu built for torch {want_torch} ({wheel}), or torch{req.specifier}",
                ),
                [*evidence, f"torch_npu metadata: Requires-Dist {spec}"],
            )
    if base_version(npu) != want_torch:
        return warn(
            f"torch_npu {npu} does not carry torch {want_torch}'s version",
            env_fix(
                ctx,
                f"install the torch_npu wheel for torch {want_torch} ({wheel}); a mismatched pair fails at "
                "`import torch_npu` or at NPU init (ERR00100 / error code 500001)",
            ),
            evidence,
        )
    return ok(f"torch {torch}, torch_npu {npu}", evidence)


@check("torch_npu_import", "torch_npu imports and sees NPUs", MM_ONLY)
def torch_npu_import(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    if "torch_npu" not in env.dists or "torch" not in env.dists:
        return skip("torch/torch_npu not installed (see torch_version)")
    try:
        result = run_torch_npu_probe(ctx.python, env=ctx.env, timeout_s=ctx.remaining(), scope=ctx.scope)
    except ProbeError as exc:
        return warn(
            str(exc),
            f"run `{shlex.quote(ctx.python)} -c 'import torch, torch_npu; print(torch.npu.device_count())'` "
            "to see it, or rerun doctor with a larger --timeout",
        )
    error = result.get("error")
    cann_fix = f"source {shlex.quote(ctx.version.cann_env[0])}"
    if error:
        fix = f"fix the import error above; usually `{cann_fix}` in this shell"
        if any(k in error for k in ("libhccl", "libascendcl", "libatb", "No module named 'acl'")):
            fix = (
                f"`{cann_fix}` (and nnal's set_env.sh) before running; on a CPU-only box export "
                "TORCH_DEVICE_BACKEND_AUTOLOAD=0, or uninstall torch_npu: with torch_npu installed and CANN "
                "absent, even `import torch` fails"
            )
        return fail("import torch_npu fails", env_fix(ctx, fix), [error])
    count = result.get("npu_count") or 0
    evidence = [
        f"torch {result.get('torch')}, torch_npu {result.get('torch_npu')}, CANN {result.get('cann')}"
    ]
    if count == 0:
        return fail(
            "torch_npu imports but sees no NPU",
            "check `npu-smi info`, ASCEND_RT_VISIBLE_DEVICES and (in docker) the /dev/davinci* device mounts",
            evidence,
        )
    return ok(f"torch_npu imports and sees {count} NPU(s)", evidence)


def _effective_pins(ctx: Context) -> dict[str, tuple[str, str]]:
    """package -> (specifier, where it comes from): base pins, overridden by the model overlay."""
    pins = {
        name: (_pin(value), f"MM {ctx.version.id} base pyproject")
        for name, value in ctx.version.base_pins.items()
        if name != "torch"  # torch_version covers it
    }
    overlay = ctx.overlay()
    for spec in overlay.pins() if overlay else []:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        if req.name in pins:
            pins[req.name] = (str(req.specifier), f"{ctx.model.id if ctx.model else '?'} overlay")
    return pins


@check("base_deps", "MindSpeed-MM base pins installed", MM_ONLY)
def base_deps(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    missing, drift, evidence = [], [], []
    for name, (spec, source) in sorted(_effective_pins(ctx).items()):
        have = env.dists.get(name)
        evidence.append(f"{name}{spec} ({source}): installed {have or '-'}")
        if have is None:
            missing.append(f"{name}{spec}")
        elif not _satisfies(have, SpecifierSet(spec)):
            drift.append(f"{name}{spec}")
    if missing:
        return fail(
            f"missing: {', '.join(missing)}",
            env_fix(
                ctx,
                f"install MindSpeed-MM into this env (`pip install -e .` in the checkout), or "
                f"`pip install {' '.join(shlex.quote(m) for m in missing + drift)}`",
            ),
            evidence,
        )
    if drift:
        return warn(
            f"installed versions differ from the pins: {', '.join(drift)}",
            env_fix(
                ctx,
                f"pip install {' '.join(shlex.quote(d) for d in drift)} (the versions MindSpeed-MM {ctx.version.id} was tested with)",
            ),
            evidence,
        )
    return ok("base pins satisfied", evidence)


@check("model_deps", "Model dependency overlay installed (and its conflicts)", MM_ONLY)
def model_deps(ctx: Context) -> Outcome:
    if ctx.model is None:
        return skip("no model given (--model or --job)")
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    overlay = ctx.overlay()
    conflicts = [f"known conflict: {c}" for c in ctx.model.conflicts]
    name = f"{ctx.model.id} on MM {ctx.version.id}"
    if overlay is None or not (overlay.pins() or overlay.git_sources):
        return ok(f"{name} needs nothing beyond the base install", conflicts)
    git_fixes: list[str] = []
    bad, evidence = [], []
    for spec in overlay.pins():
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            evidence.append(f"{spec}: not a pip requirement, not checked")
            continue
        have = env.dists.get(req.name)
        if req.url:  # a git pin: compare the installed commit with the ref after the last "@"
            ref = req.url.rsplit("@", 1)[-1]
            commit, how = installed_commit(env, req.name, ctx.root) if have else (None, "not installed")
            evidence.append(
                f"{spec}: {req.name} {have or '-'}, {how}" + (f" @ {commit[:12]}" if commit else "")
            )
            if commit is None or not (commit.startswith(ref) or ref.startswith(commit)):
                bad.append(spec)
            continue
        evidence.append(f"{spec}: installed {have or '-'}")
        if have is None or (req.specifier and not _satisfies(have, req.specifier)):
            bad.append(spec)
    for source in overlay.git_sources:
        name = canonicalize_name(source.name)
        commit, how = installed_commit(env, name, ctx.root) if name in env.dists else (None, "not installed")
        evidence.append(
            f"{source.name} from {source.url} @ {source.ref}: {how}" + (f" @ {commit[:12]}" if commit else "")
        )
        if commit is None or not commit.startswith(source.ref):
            bad.append(f"{source.name}@{source.ref}")
            git_fixes.append(
                f"git clone {source.url} && cd {source.name} && git checkout {source.ref} && pip install -e ."
            )
    if overlay.requirements_file:
        evidence.append(f"MindSpeed-MM lists them in {overlay.requirements_file}")
    if overlay.install_sh:
        evidence.append(f"MindSpeed-MM installer: bash scripts/install.sh {shlex.join(overlay.install_sh)}")
    if overlay.scripts:
        evidence.append(f"MindSpeed-MM install script(s), not checked here: {', '.join(overlay.scripts)}")
    if not bad:
        return ok(f"{name}: overlay requirements satisfied", [*evidence, *conflicts])
    pips = [b for b in bad if b in overlay.pins()]
    fix = " && ".join(([f"pip install {' '.join(shlex.quote(b) for b in pips)}"] if pips else []) + git_fixes)
    if conflicts:
        fix += f" — these pins clash with other models' ({len(conflicts)} known conflict(s) listed): keep one venv per model"
    return fail(f"{name}: not satisfied: {', '.join(bad)}", env_fix(ctx, fix), [*evidence, *conflicts])


@check("decord", "decord (video reader) importable")
def decord(ctx: Context) -> Outcome:
    env = probe_or_fail(ctx)
    if isinstance(env, Outcome):
        return env
    spec = env.modules.get("decord")
    dist = env.dists.get("decord") or env.dists.get("eva-decord")
    if spec is not None:
        return ok(f"decord {dist or '(no metadata)'} at {spec.origin}")
    overlay = ctx.overlay()
    bundled = ctx.runtime == "bundled"  # runtime/video.py reads every clip with decord: no other reader
    needed = bundled or (
        ctx.model is not None
        and (
            ctx.model.family == "generative"
            or any(p.startswith("decord") for p in (overlay.pins() if overlay else []))
        )
    )
    other_reader = (
        "" if bundled else ', or set video_reader_type to "TorchvisionVideo"/"AvVideo" in data.json'
    )
    if env.machine in {"aarch64", "arm64"}:
        fix = (
            "no aarch64 wheel on PyPI: build it from source against FFmpeg 4.x (MindSpeed-MM "
            f"docker/common/install_decord_on_arm.sh){other_reader}"
        )
    else:
        fix = f"pip install decord==0.6.0{other_reader}"
    fix = env_fix(ctx, fix)
    evidence = [
        "the bundled runtime decodes clips with decord (runtime/video.py)"
        if bundled
        else 'MM video datasets default to video_reader_type "DecordVideo"',
        f"architecture: {env.machine}",
    ]
    if needed:
        return fail(
            f"decord is not installed; {ctx.model.id if ctx.model else ''} reads videos with it",
            fix,
            evidence,
        )
    return warn("decord is not installed (needed by video models)", fix, evidence)

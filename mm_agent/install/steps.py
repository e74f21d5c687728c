"""The install steps: one builder per part of the MindSpeed-MM stack, each an argv list with why and checks.

Builders read only registry data (`versions.yaml`, the model's `deps` overlay, `install.yaml`) through a
`StepContext`; the request decides nothing but paths and choices. The order mirrors MindSpeed-MM's manual
install guide (docs/*/pytorch/install_guide.md) with the pins of its docker/Dockerfile, and a model README's
one-click `scripts/install.sh` options are translated into these same explicit steps.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from mm_agent.install.checks import PYTHON_VERSION_SNIPPET, Check, requirements_check
from mm_agent.install.schema import Arch, InstallKnowledge, OsFamily, load_install_knowledge
from mm_agent.registry import Registry, get_registry
from mm_agent.registry.deps import ModelAction, split_loc
from mm_agent.registry.schema import DepsOverlay, ModelEntry, VersionInfo

_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

Stage = Literal["system", "env_setup", "model_deps"]
# The note a step carries when its overlay says the README's install section does not show it (and why).
BEYOND_README = "Not in the README's install section: "
EnvKind = Literal["venv", "conda"]


class Command(BaseModel):
    """One argv. Path arguments are relative to `cwd` when it is set, else to where the plan runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: list[str] = Field(min_length=1)
    cwd: str | None = Field(default=None, description="working directory; None = where the plan is run from")
    unless_exists: str | None = Field(default=None, description="skip when this path exists (re-runs)")


class PlanStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    stage: Stage
    title: str
    why: str
    commands: list[Command] = Field(default_factory=list)
    verify: list[Check] = Field(default_factory=list)
    manual: bool = Field(default=False, description="done by hand (never executed); instructions say how")
    requires_root: bool = False
    instructions: list[str] = Field(default_factory=list)
    manual_commands: list[str] = Field(
        default_factory=list,
        description="a manual step's README commands, from the folder that holds MindSpeed-MM (never run)",
    )
    notes: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Layout:
    """Where things go and how pip is called; plans use absolute paths, the pipeline summary relative ones."""

    mm_root: str
    src_dir: str
    env_path: str
    python: str
    pip: tuple[str, ...]

    @classmethod
    def for_env(cls, mm_root: str, src_dir: str, env_path: str) -> Layout:
        python = f"{env_path}/bin/python"
        return cls(mm_root, src_dir, env_path, python, (python, "-m", "pip"))

    def mm(self, *parts: str) -> str:
        return "/".join((self.mm_root, *parts))

    def src(self, *parts: str) -> str:
        return "/".join((self.src_dir, *parts))


@dataclass(frozen=True)
class StepContext:
    entry: ModelEntry
    info: VersionInfo
    overlay: DepsOverlay | None
    knowledge: InstallKnowledge
    arch: Arch
    os_family: OsFamily
    env: EnvKind
    python: str
    layout: Layout

    def pip(self, *args: str, cwd: str | None = None) -> Command:
        return Command(argv=[*self.layout.pip, *args], cwd=cwd)


# ------------------------------------------------------------------------------------------- the steps


def _system_packages(c: StepContext) -> PlanStep:
    spm = c.knowledge.system_packages[c.os_family]
    extra = [p.replace("{python}", c.python) for p in spm.venv_packages] if c.env == "venv" else []
    packages = [*spm.packages, *extra]
    commands = [Command(argv=list(spm.refresh))] if spm.refresh else []
    commands.append(Command(argv=[*spm.install, *packages]))
    return PlanStep(
        id="system-packages",
        stage="system",
        title=f"System packages ({c.os_family})",
        why="git, compilers, cmake and the FFmpeg libraries are what MindSpeed-MM's docker/Dockerfile installs "
        "before any Python package.",
        commands=commands,
        verify=[Check(argv=[*spm.query, *packages])],
        requires_root=True,
    )


def _cann(c: StepContext) -> PlanStep:
    cann = c.info.cann or "matching the torch_npu release"
    instructions = [
        *c.knowledge.cann.notes,
        f"CANN {cann}: {c.knowledge.cann.docs}",
        *(f"source {shlex.quote(path)}" for path in c.info.cann_env),
    ]
    return PlanStep(
        id="cann",
        stage="system",
        title=f"Ascend driver, firmware and CANN {cann}",
        why="torch_npu loads CANN's libraries (libhccl.so, libascendcl.so) at import time; CANN is installed "
        "from Huawei's .run packages, not from pip.",
        verify=[Check(argv=["test", "-f", path]) for path in c.info.cann_env],
        manual=True,
        instructions=instructions,
    )


def _create_env(c: StepContext) -> PlanStep:
    env = c.layout.env_path
    if c.env == "venv":
        argv = [f"python{c.python}", "-m", "venv", env]
        title = f"Python {c.python} venv"
    else:
        argv = ["conda", "create", "-y", "-p", env, f"python={c.python}"]
        title = f"Python {c.python} conda environment"
    return PlanStep(
        id="create-env",
        stage="system",
        title=title,
        why=f"MindSpeed-MM {c.info.id} is tested with Python {c.info.python}, and a dedicated environment keeps "
        "this model's pins away from other models.",
        commands=[Command(argv=argv, unless_exists=f"{env}/bin/python")],
        verify=[Check(argv=[c.layout.python, "-c", PYTHON_VERSION_SNIPPET], expect=c.python)],
    )


def _torch(c: StepContext) -> PlanStep:
    stack = c.knowledge.torch_stacks[c.info.torch]
    reqs = [f"torch=={c.info.torch}", *stack.companions]
    index = c.knowledge.torch_index.get(c.arch)
    argv = ["install", *reqs, *(["--index-url", index] if index else [])]
    source = f"the CPU wheel index {index}" if index else "PyPI (its aarch64 wheels are the CPU build)"
    return PlanStep(
        id="torch",
        stage="env_setup",
        title=f"torch {c.info.torch} (CPU build) for {c.arch}",
        why=f"torch_npu extends the CPU build of torch {c.info.torch}; on {c.arch} it comes from {source}.",
        commands=[c.pip(*argv)],
        verify=[requirements_check(c.layout.python, reqs)],
    )


def _torch_npu(c: StepContext) -> PlanStep:
    wheel = c.knowledge.torch_npu.get(c.info.id)
    if wheel is None:
        return PlanStep(
            id="torch-npu",
            stage="env_setup",
            title=f"torch_npu for torch {c.info.torch}",
            why=f"mm-agent has no torch_npu wheel on record for MindSpeed-MM {c.info.id}.",
            verify=[requirements_check(c.layout.python, ["torch-npu"])],
            manual=True,
            instructions=[
                f"Install the torch_npu wheel built for torch {c.info.torch}, Python {c.python}, {c.arch} and your "
                "CANN from https://gitcode.com/Ascend/pytorch/releases."
            ],
        )
    req = f"torch-npu=={wheel.version}"
    return PlanStep(
        id="torch-npu",
        stage="env_setup",
        title=f"torch_npu {wheel.version} (TorchNPU {c.info.torch_npu})",
        why=f"MindSpeed-MM {c.info.id} pairs torch {c.info.torch} with TorchNPU {c.info.torch_npu} "
        f"(manylinux_2_28 {c.arch} wheel, also on gitcode.com/Ascend/pytorch release {wheel.release_tag}).",
        commands=[c.pip("install", req)],
        verify=[requirements_check(c.layout.python, [req])],
        notes=["Importing torch_npu needs CANN; the check reads installed metadata instead."],
    )


def _mm_ref(version: str) -> str:
    return "master" if version == "master" else f"v{version}"


def _head_check(repo: str, ref: str) -> Check:
    """HEAD is `ref`: a commit (prefix), a tag (exact match) or a branch name."""
    if _COMMIT.match(ref):
        return Check(argv=["git", "-C", repo, "rev-parse", "HEAD"], expect=ref)
    if ref.startswith(("v", "core_v")):  # release tags (v26.0.0, core_v0.12.1); core_r0.8.0 is a branch
        return Check(argv=["git", "-C", repo, "describe", "--tags", "--exact-match"], expect=ref)
    return Check(argv=["git", "-C", repo, "rev-parse", "--abbrev-ref", "HEAD"], expect=ref)


def _mm_source(c: StepContext) -> PlanStep:
    ref, mm = _mm_ref(c.info.id), c.layout.mm_root
    return PlanStep(
        id="mm-source",
        stage="env_setup",
        title=f"MindSpeed-MM {ref} checkout",
        why=f"Entry scripts, example configs and the per-model requirements files come from the {ref} tree.",
        commands=[
            Command(argv=["git", "clone", c.knowledge.repos.mindspeed_mm, mm], unless_exists=f"{mm}/.git"),
            Command(argv=["git", "checkout", ref], cwd=mm),
        ],
        verify=[_head_check(mm, ref)],
    )


def _wants_megatron(c: StepContext) -> bool:
    """The README decides: its install.sh line, or an overlay that says it runs without Megatron; otherwise
    the manual guide always copies Megatron in."""
    if c.overlay is None:
        return True
    if "megatron" in c.overlay.omit:
        return False
    return c.overlay.install_sh is None or bool(c.overlay.install_sh_option("--megatron"))


def _omits(c: StepContext, step: str) -> bool:
    return c.overlay is not None and step in c.overlay.omit


def _megatron(c: StepContext) -> PlanStep:
    tag = (c.overlay.megatron_ref if c.overlay else None) or c.info.megatron
    checkout = c.layout.src("Megatron-LM")
    return PlanStep(
        id="megatron",
        stage="env_setup",
        title=f"Megatron-LM {tag} copied into the checkout",
        why="MindSpeed-MM imports `megatron` from its own root (No module named 'megatron' otherwise); "
        + (f"{c.entry.name}'s README checks out {tag}." if tag != c.info.megatron else f"it pins {tag}."),
        commands=[
            Command(
                argv=["git", "clone", "--depth", "1", "--branch", tag, c.knowledge.repos.megatron, checkout],
                unless_exists=f"{checkout}/.git",
            ),
            Command(argv=["git", "-C", checkout, "checkout", tag]),
            Command(argv=["cp", "-rT", f"{checkout}/megatron", c.layout.mm("megatron")]),
        ],
        verify=[
            _head_check(checkout, tag),
            Check(argv=["test", "-f", c.layout.mm("megatron", "core", "__init__.py")]),
        ],
    )


def _mindspeed_ref(c: StepContext) -> tuple[str | None, str]:
    """(ref, where it comes from): the model's pinned commit, its install.sh branch, else the version's branch."""
    if c.overlay is not None:
        if c.overlay.mindspeed_commit:
            how = "install.sh --msid" if c.overlay.install_sh_option("--msid") else "the model README"
            return c.overlay.mindspeed_commit, f"the commit {c.entry.name} pins ({how})"
        branch = c.overlay.install_sh_option("--msbranch")
        if isinstance(branch, str):
            return branch, f"the branch {c.entry.name}'s install.sh line names"
        if c.overlay.mindspeed_branch:
            return c.overlay.mindspeed_branch, f"the branch {c.entry.name}'s README clones"
    if c.info.mindspeed_branch:
        return c.info.mindspeed_branch, f"the MindSpeed branch of MindSpeed-MM {c.info.id}"
    return None, ""


def _mindspeed(c: StepContext) -> PlanStep:
    repo = c.layout.mm("MindSpeed")
    ref, how = _mindspeed_ref(c)
    installed = requirements_check(c.layout.python, ["mindspeed"])
    if ref is None:
        return PlanStep(
            id="mindspeed",
            stage="env_setup",
            title="MindSpeed (acceleration library)",
            why=f"No MindSpeed commit or branch is on record for {c.entry.name} on MindSpeed-MM {c.info.id}.",
            verify=[installed],
            manual=True,
            instructions=[
                f"git clone {c.knowledge.repos.mindspeed} {shlex.quote(repo)}",
                f"check out the MindSpeed commit named in examples/{c.entry.id}/README.md of MindSpeed-MM "
                f"{_mm_ref(c.info.id)}, then pip install -r requirements.txt and pip install -e . in it",
            ],
        )
    if c.overlay is not None and c.overlay.mindspeed_install == "copy":
        package = c.layout.mm("mindspeed")
        return PlanStep(
            id="mindspeed",
            stage="env_setup",
            title=f"MindSpeed at {ref}, its package copied into the checkout",
            why=f"{c.entry.name}'s README copies MindSpeed's `mindspeed/` package into the MindSpeed-MM checkout "
            f"(`cp -r mindspeed ../MindSpeed-MM/`) instead of installing it; the code is {how}.",
            commands=[
                Command(
                    argv=["git", "clone", c.knowledge.repos.mindspeed, repo], unless_exists=f"{repo}/.git"
                ),
                Command(argv=["git", "-C", repo, "checkout", ref]),
                Command(argv=["cp", "-rT", f"{repo}/mindspeed", package]),
            ],
            verify=[_head_check(repo, ref), Check(argv=["test", "-f", f"{package}/__init__.py"])],
        )
    return PlanStep(
        id="mindspeed",
        stage="env_setup",
        title=f"MindSpeed at {ref}",
        why=f"Every entry script starts with `import mindspeed.megatron_adaptor`; the tested code is {how}.",
        commands=[
            Command(argv=["git", "clone", c.knowledge.repos.mindspeed, repo], unless_exists=f"{repo}/.git"),
            Command(argv=["git", "-C", repo, "checkout", ref]),
            c.pip("install", "-r", f"{repo}/requirements.txt"),
            c.pip("install", "-e", repo),
        ],
        verify=[_head_check(repo, ref), installed],
    )


def _mm_install(c: StepContext) -> PlanStep:
    return PlanStep(
        id="mindspeed-mm",
        stage="env_setup",
        title="pip install -e MindSpeed-MM",
        why="Installs the base pins of pyproject.toml and registers the `mm-convert` command.",
        commands=[c.pip("install", "-e", ".", cwd=c.layout.mm_root)],
        verify=[
            requirements_check(c.layout.python, ["mindspeed-mm"]),
            Check(argv=["test", "-x", f"{c.layout.env_path}/bin/mm-convert"]),
        ],
    )


def _checkout_path(c: StepContext, name: str) -> str:
    """Where a checkout named in the overlay's steps lives (`mm` or an earlier clone)."""
    if name == "mm":
        return c.layout.mm_root
    assert c.overlay is not None
    for action in c.overlay.steps:
        if action.clone is not None and action.clone.name == name:
            return c.layout.mm(name) if action.clone.at == "mm" else c.layout.src(name)
    raise KeyError(name)  # the overlay validator rules this out


def _path(c: StepContext, loc: str) -> str:
    where, rel = split_loc(loc)
    root = _checkout_path(c, where)
    return f"{root}/{rel}" if rel else root


def _unique(step_id: str, seen: dict[str, int]) -> str:
    seen[step_id] = seen.get(step_id, 0) + 1
    return step_id if seen[step_id] == 1 else f"{step_id}-{seen[step_id]}"


def _action_step(c: StepContext, action: ModelAction, step_id: str) -> PlanStep:
    """One README command of the overlay's `steps` as a verified plan step."""
    name = c.entry.name
    why = action.why or f"{name}'s README runs it at this point of its install section."
    notes = [BEYOND_README + action.beyond_readme] if action.beyond_readme else []
    if action.pip:
        extra = ["--extra-index-url", action.index] if action.index else []
        return PlanStep(
            id=step_id,
            stage="model_deps",
            title=f"pip install {' '.join(action.pip)}",
            why=why,
            commands=[c.pip("install", *action.pip, *extra)],
            verify=[requirements_check(c.layout.python, list(action.pip))],
            notes=notes,
        )
    if action.requirements or action.editable:
        loc = action.requirements or action.editable
        assert loc is not None
        where, rel = split_loc(loc)
        flag = "-r" if action.requirements else "-e"
        return PlanStep(
            id=step_id,
            stage="model_deps",
            title=f"pip install {flag} {rel or '.'} in {where}",
            why=why,
            commands=[c.pip("install", flag, rel or ".", cwd=_checkout_path(c, where))],
            verify=[requirements_check(c.layout.python, list(action.holds))] if action.holds else [],
            notes=notes,
        )
    if action.clone:
        src = action.clone
        path = _checkout_path(c, src.name)
        commands = [Command(argv=["git", "clone", src.url, path], unless_exists=f"{path}/.git")]
        if src.ref:
            commands.append(Command(argv=["git", "-C", path, "checkout", src.ref]))
        return PlanStep(
            id=step_id,
            stage="model_deps",
            title=f"{src.name} source" + (f" at {src.ref}" if src.ref else " (default branch)"),
            why=action.why
            or f"{name}'s README works in a {src.name} checkout"
            + (f" at {src.ref}." if src.ref else "; it pins no commit."),
            commands=commands,
            verify=[_head_check(path, src.ref) if src.ref else Check(argv=["test", "-d", f"{path}/.git"])],
            notes=notes,
        )
    if action.copy_:
        source, target = _path(c, action.copy_.source), _path(c, action.copy_.to)
        made = _path(c, action.copy_.creates) if action.copy_.creates else target
        return PlanStep(
            id=step_id,
            stage="model_deps",
            title=f"copy {action.copy_.source} to {action.copy_.to}",
            why=why,
            commands=[Command(argv=["cp", "-rT", source, target])],
            verify=[Check(argv=["test", "-e", made])],
            notes=notes,
        )
    if action.script:
        script = action.script
        verify = [requirements_check(c.layout.python, list(script.installs))] if script.installs else []
        if script.done_when:
            verify.append(Check(argv=["test", "-e", _path(c, script.done_when)]))
        return PlanStep(
            id=step_id,
            stage="model_deps",
            title=f"bash {script.path}",
            why=why,
            commands=[Command(argv=["bash", _path(c, script.path)], cwd=_checkout_path(c, script.cwd))],
            verify=verify,
            notes=[*notes, "Run with the environment's bin/ first on PATH so the script's pip targets it."],
        )
    manual = action.manual
    assert manual is not None
    return PlanStep(
        id=step_id,
        stage="model_deps",
        title=manual.title,
        why=manual.why,
        verify=[requirements_check(c.layout.python, list(manual.check))] if manual.check else [],
        manual=True,
        instructions=[*manual.instructions, *(f"$ {line}" for line in manual.commands)],
        manual_commands=list(manual.commands),
        notes=notes,
    )


def _action_id(action: ModelAction) -> str:
    if action.clone:
        return f"model-source-{action.clone.name.lower()}"
    if action.manual:
        return f"model-{action.manual.id}"
    if action.editable:
        return f"model-editable-{split_loc(action.editable)[0].lower()}"
    return {"pip": "model-packages", "requirements": "model-requirements", "copy": "model-copy"}.get(
        action.kind, "model-script"
    )


def _model_steps(c: StepContext) -> list[PlanStep]:
    overlay = c.overlay
    if overlay is None:
        return []
    if overlay.steps:
        seen: dict[str, int] = {}
        return [_action_step(c, a, _unique(_action_id(a), seen)) for a in overlay.steps]
    steps: list[PlanStep] = []
    if overlay.requirements_file or overlay.pip:
        commands = []
        if overlay.requirements_file:
            commands.append(c.pip("install", "-r", overlay.requirements_file, cwd=c.layout.mm_root))
        if overlay.pip:
            commands.append(c.pip("install", *overlay.pip))
        source = " and ".join(
            p for p in (overlay.requirements_file, "the README's pins" if overlay.pip else None) if p
        )
        steps.append(
            PlanStep(
                id="model-packages",
                stage="model_deps",
                title=f"{c.entry.name} packages",
                why=f"{c.entry.name} on MindSpeed-MM {c.info.id} needs {source} on top of the base install.",
                commands=commands,
                verify=[requirements_check(c.layout.python, list(overlay.pip))] if overlay.pip else [],
                notes=list(overlay.notes),
            )
        )
    for src in overlay.git_sources:
        checkout = c.layout.src(src.name)
        steps.append(
            PlanStep(
                id=f"model-source-{src.name.lower()}",
                stage="model_deps",
                title=f"{src.name} at {src.ref}",
                why=f"{c.entry.name}'s README installs {src.name} from source at {src.ref}.",
                commands=[
                    Command(argv=["git", "clone", src.url, checkout], unless_exists=f"{checkout}/.git"),
                    Command(argv=["git", "-C", checkout, "checkout", src.ref]),
                    c.pip("install", "-e", checkout),
                ],
                verify=[_head_check(checkout, src.ref)],
            )
        )
    if overlay.scripts:
        steps.append(
            PlanStep(
                id="model-scripts",
                stage="model_deps",
                title=f"{c.entry.name} install scripts",
                why=f"{c.entry.name}'s README runs these scripts from the MindSpeed-MM root.",
                commands=[Command(argv=["bash", script], cwd=c.layout.mm_root) for script in overlay.scripts],
                notes=["Run with the environment's bin/ first on PATH so the scripts' pip targets it."],
            )
        )
    return steps


def _decord(c: StepContext) -> list[PlanStep]:
    d = c.knowledge.decord
    check = Check(argv=[c.layout.python, "-c", "import decord; print(decord.__version__)"], expect=d.version)
    why_needed = "DecordVideo is the default video_reader_type of the video data.json files"
    if c.arch == "x86_64":
        return [
            PlanStep(
                id="decord",
                stage="env_setup",
                title=f"decord {d.version} (wheel)",
                why=f"{why_needed}; PyPI has a manylinux2010 x86_64 wheel.",
                commands=[c.pip("install", f"decord=={d.version}")],
                verify=[check],
            )
        ]
    src = d.source
    spm = c.knowledge.system_packages[c.os_family]
    packages = src.packages[c.os_family]
    checkout = c.layout.src("decord")
    build = f"{checkout}/build"
    return [
        PlanStep(
            id="decord-deps",
            stage="system",
            title="decord build dependencies (FFmpeg 4.x dev libraries)",
            why="decord has no aarch64 wheel; building it needs cmake and FFmpeg's dev libraries, libavfilter "
            "included (else cmake stops at FFMPEG_LIBAVFILTER-NOTFOUND).",
            commands=[
                *([Command(argv=list(spm.refresh))] if spm.refresh else []),
                Command(argv=[*spm.install, *packages]),
            ],
            verify=[Check(argv=[*spm.query, *packages])],
            requires_root=True,
            notes=list(src.notes),
        ),
        PlanStep(
            id="decord",
            stage="env_setup",
            title=f"decord {d.version} built from source",
            why=f"{why_needed}; on aarch64 pip finds no decord wheel (from versions: none), so it is built "
            "from source.",
            commands=[
                Command(
                    argv=["git", "clone", "--recursive", "--branch", src.ref, src.url, checkout],
                    unless_exists=f"{checkout}/.git",
                ),
                Command(argv=["cmake", "-S", checkout, "-B", build, *src.cmake_defines]),
                Command(argv=["cmake", "--build", build, "--parallel", str(src.build_jobs)]),
                c.pip("install", f"{checkout}/python"),
            ],
            verify=[check],
        ),
    ]


def _triton_ascend(c: StepContext) -> list[PlanStep]:
    """The install guide's last step at versions that have it (26.1.0: Triton-Ascend from its own index)."""
    pin = c.knowledge.triton_ascend.get(c.info.id)
    if pin is None:
        return []
    req = f"triton-ascend=={pin.version}"
    mine = [Requirement(r) for r in (c.overlay.pins() if c.overlay else [])]
    if any(canonicalize_name(r.name) == "triton-ascend" and r.specifier.contains(pin.version) for r in mine):
        return []  # the model's README installs this Triton-Ascend itself, at its own place in its steps
    return [
        PlanStep(
            id="triton-ascend",
            stage="env_setup",
            title=f"Triton-Ascend {pin.version}",
            why=f"MindSpeed-MM {c.info.id}'s install guide ends with Triton-Ascend {pin.version} from its own "
            f"index ({pin.source}); Triton-Ascend is bound to the CANN version.",
            commands=[c.pip("install", req, "--extra-index-url", pin.index)],
            verify=[requirements_check(c.layout.python, [req])],
            notes=list(pin.notes),
        )
    ]


def build_steps(c: StepContext) -> list[PlanStep]:
    """All steps in execution order (system, then the base stack, then the model's overlay).

    An overlay can leave base steps out (`omit`), install MindSpeed-MM after its own steps
    (`mm_install_last`) and put MindSpeed or Megatron at other refs, as its README does. Triton-Ascend (the
    install guide's last step, where the version has one) follows the model's steps, as in the READMEs that
    show it, and goes with the MindSpeed-MM install.
    """
    decord = _decord(c)
    system = [_system_packages(c), *(s for s in decord if s.stage == "system"), _cann(c), _create_env(c)]
    stack = [_torch(c), _torch_npu(c), _mm_source(c), *([_megatron(c)] if _wants_megatron(c) else [])]
    stack += [] if _omits(c, "mindspeed") else [_mindspeed(c)]
    mm = [] if _omits(c, "mindspeed-mm") else [_mm_install(c)]
    triton = _triton_ascend(c) if mm else []
    model = _model_steps(c)
    last = c.overlay is not None and c.overlay.mm_install_last
    # installed after the model's own steps, MindSpeed-MM's install belongs with them (route_model shows it there)
    ordered = [*model, *(s.model_copy(update={"stage": "model_deps"}) for s in mm)] if last else [*mm, *model]
    return [*system, *stack, *ordered, *triton, *(s for s in decord if s.stage != "system")]


def plan_context(
    entry: ModelEntry,
    info: VersionInfo,
    layout: Layout,
    *,
    arch: Arch,
    os_family: OsFamily = "debian",
    env: EnvKind = "venv",
    python: str | None = None,
    registry: Registry | None = None,
) -> StepContext:
    """Everything the step builders read; the model's overlay is the one for `info.id` (None if it has none)."""
    reg = registry or get_registry()
    return StepContext(
        entry=entry,
        info=info,
        overlay=entry.deps_for(info.id),
        knowledge=load_install_knowledge(reg),
        arch=arch,
        os_family=os_family,
        env=env,
        python=python or info.python,
        layout=layout,
    )

"""Typed shape of `registry/data/install.yaml`: where each part of the MindSpeed-MM stack comes from.

Every value here ends up in an argv (and in a rendered script), so each string has a strict token type from
`registry/tokens.py`; the loader also cross-checks the file against `versions.yaml` so that, for example, a
torch_npu wheel cannot be listed for a torch it was not built for.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.registry import DATA_DIR, Registry, read_yaml, validation_error
from mm_agent.registry.deps import ReadmeDeviation
from mm_agent.registry.tokens import CmakeDefine, GitRef, HttpsUrl, PipRequirement, SystemPackage

Arch = Literal["x86_64", "aarch64"]
OsFamily = Literal["debian", "rhel"]
CommandWord = Annotated[str, StringConstraints(pattern=r"^(?:[a-z][a-z0-9-]*|-[a-z])$")]
_VERSION = r"^\d+(\.\d+)*(\.post\d+)?$"

# Packages that have a dedicated plan step; an overlay pin on them would bypass the arch-specific wheel.
MANAGED_PACKAGES = frozenset({"torch", "torch-npu", "decord"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Repos(_Frozen):
    mindspeed_mm: HttpsUrl
    mindspeed: HttpsUrl
    megatron: HttpsUrl


class TorchStack(_Frozen):
    companions: list[PipRequirement] = Field(description="torchvision/torchaudio built for this torch")


class TorchNpuWheel(_Frozen):
    version: str = Field(pattern=_VERSION, description="PyPI torch-npu version")
    release_tag: GitRef = Field(description="gitcode.com/Ascend/pytorch release holding the same wheels")


class SystemPackages(_Frozen):
    install: list[CommandWord] = Field(min_length=1, description="argv prefix installing non-interactively")
    refresh: list[CommandWord] | None = Field(default=None, description="argv refreshing the package index")
    query: list[CommandWord] = Field(min_length=1, description="argv prefix failing unless all are installed")
    packages: list[SystemPackage]
    venv_packages: list[SystemPackage] = Field(
        default_factory=list, description="what `python -m venv` needs; {python} is the Python version"
    )


class DecordSource(_Frozen):
    url: HttpsUrl
    ref: GitRef
    cmake_defines: list[CmakeDefine]
    build_jobs: int = Field(ge=1, le=256)
    packages: dict[OsFamily, list[SystemPackage]]
    notes: list[str] = Field(default_factory=list)


class Decord(_Frozen):
    version: str = Field(pattern=_VERSION)
    source: DecordSource


class Cann(_Frozen):
    docs: HttpsUrl
    notes: list[str]


class InstallSh(_Frozen):
    path: str = Field(pattern=r"^[a-z_/]+\.sh$")
    notes: list[str] = Field(default_factory=list)


class TritonAscend(_Frozen):
    version: str = Field(pattern=_VERSION)
    index: HttpsUrl = Field(description="pip --extra-index-url holding the Triton-Ascend wheels")
    source: str = Field(min_length=10, description="where the install guide says so (path:line)")
    notes: list[str] = Field(default_factory=list)


class ReadmeFidelity(_Frozen):
    """What tests/fidelity/test_install_readme.py accepts in a plan beyond a model README's install section."""

    plan_only: dict[str, str] = Field(
        default_factory=dict,
        description="plan step id -> why the plan has it (or more commands in it) though READMEs do not show them",
    )
    guide_deviations: dict[str, list[ReadmeDeviation]] = Field(
        default_factory=dict,
        description="MindSpeed-MM version -> install-guide commands the base plan does not follow as written, and why",
    )


class InstallKnowledge(_Frozen):
    repos: Repos
    torch_index: dict[Arch, HttpsUrl | None]
    torch_stacks: dict[str, TorchStack]
    torch_npu: dict[str, TorchNpuWheel]
    system_packages: dict[OsFamily, SystemPackages]
    decord: Decord
    cann: Cann
    install_sh: InstallSh
    triton_ascend: dict[str, TritonAscend] = Field(
        default_factory=dict, description="MindSpeed-MM version -> the install guide's Triton-Ascend step"
    )
    readme: ReadmeFidelity = ReadmeFidelity()


def _cross_check(knowledge: InstallKnowledge, registry: Registry, path: Path) -> None:
    """install.yaml must agree with versions.yaml, and overlays must leave managed packages to their steps."""
    for info in registry.versions.versions:
        if info.torch not in knowledge.torch_stacks:
            raise MMAgentError(
                f"no torch stack for torch {info.torch} (MindSpeed-MM {info.id})",
                file=str(path),
                field="torch_stacks",
                fix=f"add torch_stacks.{info.torch} with its torchvision/torchaudio pins",
            )
    for version, wheel in knowledge.torch_npu.items():
        release = registry.versions.get(version)
        if release is None or release.torch_npu is None:
            raise MMAgentError(
                f"torch_npu wheel for {version!r}, which versions.yaml lists without a TorchNPU release",
                file=str(path),
                field=f"torch_npu.{version}",
                fix="use a version id from versions.yaml that has torch_npu set",
            )
        if not wheel.version.startswith(release.torch + "."):
            raise MMAgentError(
                f"torch_npu {wheel.version} is not built for torch {release.torch}",
                file=str(path),
                field=f"torch_npu.{version}.version",
                fix=f"use a {release.torch}.postN wheel",
            )
    for version in knowledge.triton_ascend:
        if registry.versions.get(version) is None:
            raise MMAgentError(
                f"triton_ascend names version {version!r}, which versions.yaml does not list",
                file=str(path),
                field=f"triton_ascend.{version}",
                fix="use a version id from versions.yaml",
            )
    for entry in registry.models.values():
        for overlay in entry.deps:
            for text in overlay.pins():
                if canonicalize_name(Requirement(text).name) in MANAGED_PACKAGES:
                    raise MMAgentError(
                        f"{text!r} is installed by its own step (arch-specific wheel or source build)",
                        file=f"models/{entry.id}.yaml",
                        field="deps.pip",
                        fix="drop it from the overlay",
                    )


@functools.lru_cache(maxsize=4)
def _load(data_dir: str, registry: Registry) -> InstallKnowledge:
    path = Path(data_dir) / "install.yaml"
    try:
        knowledge = InstallKnowledge.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise validation_error(path, exc) from exc
    _cross_check(knowledge, registry, path)
    return knowledge


def load_install_knowledge(registry: Registry) -> InstallKnowledge:
    """The validated install.yaml next to the registry data (MM_AGENT_REGISTRY_DIR overrides both)."""
    return _load(os.environ.get("MM_AGENT_REGISTRY_DIR", str(DATA_DIR)), registry)

"""Dependency conflicts between models that would share one Python environment.

Derived only from data: each model's overlay requirements (registry `deps.pip`) are compared with the other
models' overlays and with the base stack of the MindSpeed-MM version (pyproject pins from versions.yaml, the
torch/torch_npu wheels from install.yaml) using `packaging` specifiers. No pair of models is hard-coded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from mm_agent.install.schema import InstallKnowledge
from mm_agent.registry.schema import ModelEntry, VersionInfo


class RequirementSource(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    requirement: str


class Conflict(BaseModel):
    """Two requirements on one package that no single installed version satisfies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    package: str
    kind: Literal["cross_model", "overrides_base"]
    models: list[str]
    requirements: list[RequirementSource]
    explanation: str
    advice: str


@dataclass(frozen=True)
class _Pin:
    source: str
    model: str | None
    text: str

    @property
    def req(self) -> Requirement:
        return Requirement(self.text)

    @property
    def name(self) -> str:
        return canonicalize_name(self.req.name)


def base_requirements(info: VersionInfo, knowledge: InstallKnowledge) -> list[str]:
    """What every environment of this MindSpeed-MM version holds: pyproject pins plus the torch stack."""
    reqs = [
        f"{name}{spec}" if spec[0] in "<>=!~" else f"{name}=={spec}"
        for name, spec in info.base_pins.items()
        if canonicalize_name(name) != "torch"
    ]
    reqs += [f"torch=={info.torch}", *knowledge.torch_stacks[info.torch].companions]
    wheel = knowledge.torch_npu.get(info.id)
    if wheel is not None:
        reqs.append(f"torch-npu=={wheel.version}")
    return reqs


def _candidates(spec: SpecifierSet) -> list[str]:
    """Versions worth testing against a combined specifier: every bound and its next neighbours."""
    out: list[str] = []
    for s in spec:
        text = s.version.removesuffix(".*")
        try:
            release = Version(text).release
        except InvalidVersion:
            continue
        out.append(text)
        out.append(f"{text}.post1")
        for i in range(len(release)):
            bumped = [*release[:i], release[i] + 1, *([0] * (len(release) - i - 1))]
            out.append(".".join(map(str, bumped)))
    return out


def compatible(a: Requirement, b: Requirement) -> bool:
    """True when one installed version can satisfy both (approximate for open ranges on both sides)."""
    if a.url or b.url:
        if a.url and b.url:
            return a.url == b.url
        other = b if a.url else a
        return not other.specifier  # a git checkout has no version a pin could be compared with
    if not a.specifier or not b.specifier:
        return True
    both = a.specifier & b.specifier
    return any(both.contains(v, prereleases=True) for v in _candidates(both))


def _describe(pin: _Pin) -> str:
    req = pin.req
    return f"{req.name} @ {req.url}" if req.url else pin.text


def find_conflicts(
    models: list[ModelEntry], info: VersionInfo, knowledge: InstallKnowledge
) -> list[Conflict]:
    """Conflicts among `models` installed into one environment of MindSpeed-MM `info.id`."""
    base = [_Pin(f"MindSpeed-MM {info.id} base", None, r) for r in base_requirements(info, knowledge)]
    overlays: dict[str, list[_Pin]] = {}
    for entry in models:
        overlay = entry.deps_for(info.id)
        overlays[entry.id] = [
            _Pin(f"{entry.id} overlay", entry.id, r) for r in (overlay.pins() if overlay else [])
        ]

    conflicts: list[Conflict] = []
    for model_id, pins in overlays.items():
        for pin, b in itertools.product(pins, base):
            if pin.name == b.name and not compatible(pin.req, b.req):
                conflicts.append(
                    Conflict(
                        package=pin.name,
                        kind="overrides_base",
                        models=[model_id],
                        requirements=[
                            RequirementSource(source=pin.source, requirement=pin.text),
                            RequirementSource(source=b.source, requirement=b.text),
                        ],
                        explanation=(
                            f"{model_id} installs {_describe(pin)} over the base pin {b.text}; pip then reports "
                            f"that mindspeed-mm wants {b.text}. That is the documented setup for {model_id}, "
                            "but every other model in this environment runs with it too."
                        ),
                        advice=f"Keep this environment for {model_id}; give models that rely on the base "
                        f"{b.text} their own environment.",
                    )
                )
    for (m1, pins1), (m2, pins2) in itertools.combinations(overlays.items(), 2):
        for p1, p2 in itertools.product(pins1, pins2):
            if p1.name == p2.name and not compatible(p1.req, p2.req):
                conflicts.append(
                    Conflict(
                        package=p1.name,
                        kind="cross_model",
                        models=[m1, m2],
                        requirements=[
                            RequirementSource(source=p1.source, requirement=p1.text),
                            RequirementSource(source=p2.source, requirement=p2.text),
                        ],
                        explanation=(
                            f"{m1} needs {_describe(p1)} but {m2} needs {_describe(p2)}: one environment "
                            "cannot hold both, and whichever is installed last breaks the other model."
                        ),
                        advice=f"Use separate environments, e.g. `mm-agent install {m1} --env-path "
                        f"envs/{m1}-{info.id}` and `mm-agent install {m2} --env-path envs/{m2}-{info.id}`.",
                    )
                )
    return sorted(conflicts, key=lambda c: (c.kind != "cross_model", c.package))

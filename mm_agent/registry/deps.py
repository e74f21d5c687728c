"""A model README's install commands as typed data: the ordered `steps:` of a `deps:` overlay.

Each `ModelAction` is one README command (a pip install, a requirements file, a source checkout, an editable
install, a copy, a script) or one step a user does by hand (`manual`, with the README's own commands shown and
never run). Places are `Loc` strings, `<checkout>:<path>`, where the checkout is `mm` (the MindSpeed-MM
checkout) or the `name` of an earlier `clone` in the same overlay; `install/steps.py` turns them into argv
lists with absolute paths. Every string that reaches an argv has a token type (registry/tokens.py): a data
file cannot smuggle in a flag, a URL of another scheme or a path outside its checkout.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mm_agent.registry.tokens import GitRef, HttpsUrl, PipRequirement

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_LOC = re.compile(rf"^(mm|{_NAME}):((?:[A-Za-z0-9_][A-Za-z0-9_.+-]*/?)*)$")


def _loc(value: str) -> str:
    match = _LOC.match(value)
    if not match or ".." in match.group(2).split("/"):
        raise ValueError(f"{value!r} is not <checkout>:<path inside it> (checkout: mm or a clone's name)")
    return value


Loc = Annotated[str, AfterValidator(_loc)]
CheckoutName = Annotated[str, Field(pattern=rf"^{_NAME}$")]


def split_loc(loc: str) -> tuple[str, str]:
    """`diffusers:examples/dreambooth` -> ("diffusers", "examples/dreambooth"); the checkout root is ""."""
    where, _, path = loc.partition(":")
    return where, path.rstrip("/")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Clone(_Frozen):
    """`git clone <url>` (+ `git checkout <ref>`): a source checkout the README works in."""

    name: CheckoutName = Field(description="its folder name, and how later steps refer to it")
    url: HttpsUrl
    ref: GitRef | None = Field(default=None, description="None: the README clones the default branch")
    at: Literal["src", "mm"] = Field(
        default="src", description="src: beside MindSpeed-MM (src_dir); mm: inside the MindSpeed-MM checkout"
    )


class Copy(_Frozen):
    """`cp -r`: a folder's contents (or a file) copied to a place; the target is the copy's own path."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    source: Loc = Field(alias="from")
    to: Loc
    creates: Loc | None = Field(
        default=None,
        description="a file the copy brings (its check; default: `to`, which must then be new, not an existing folder)",
    )


class Script(_Frozen):
    """`bash <script>` run in a checkout (e.g. a patch script that swaps in NPU-adapted files)."""

    path: Loc
    cwd: CheckoutName = Field(default="mm", description="the checkout it is run in")
    installs: list[PipRequirement] = Field(
        default_factory=list, description="what the script pip-installs (read from it): checks and conflicts"
    )
    done_when: Loc | None = Field(
        default=None, description="a path the script creates: when it exists the script is not run again"
    )


class Manual(_Frozen):
    """A README step mm-agent does not run (it needs a choice, a tool outside the environment, or an edit)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", description="step id after `model-`")
    title: str = Field(min_length=3)
    why: str = Field(min_length=10, description="why it is not run by mm-agent")
    instructions: list[str] = Field(min_length=1, description="what to do, in the user's words")
    commands: list[str] = Field(
        default_factory=list,
        description="the README's commands for it, from the folder that holds MindSpeed-MM (shown, never run)",
    )
    check: list[PipRequirement] = Field(
        default_factory=list, description="installed packages that show it is done"
    )


ACTION_KINDS = ("pip", "requirements", "clone", "editable", "copy", "script", "manual")


class ModelAction(_Frozen):
    """One README install command, in README order (set exactly one of the kinds)."""

    pip: list[PipRequirement] = Field(default_factory=list, description="pip install <these>")
    index: HttpsUrl | None = Field(default=None, description="pip's --extra-index-url for `pip`")
    requirements: Loc | None = Field(default=None, description="pip install -r <file>")
    editable: Loc | None = Field(default=None, description="pip install -e <folder>")
    holds: list[PipRequirement] = Field(
        default_factory=list,
        description="what a `requirements` file or `editable` folder installs (checks and conflicts only)",
    )
    clone: Clone | None = None
    copy_: Copy | None = Field(default=None, alias="copy")
    script: Script | None = None
    manual: Manual | None = None
    why: str | None = Field(default=None, description="why the README does it, when it is not obvious")
    beyond_readme: str | None = Field(
        default=None,
        min_length=10,
        description="set when the README's install section does not show this step: why the plan has it",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @property
    def kind(self) -> str:
        set_kinds = [k for k in ACTION_KINDS if getattr(self, "copy_" if k == "copy" else k)]
        return set_kinds[0]

    @model_validator(mode="after")
    def _one_kind(self) -> ModelAction:
        set_kinds = [k for k in ACTION_KINDS if getattr(self, "copy_" if k == "copy" else k)]
        if len(set_kinds) != 1:
            raise ValueError(
                f"an install step sets exactly one of {list(ACTION_KINDS)}; this one sets {set_kinds}"
            )
        if self.index is not None and not self.pip:
            raise ValueError("index is pip's --extra-index-url: it goes with `pip`")
        if self.holds and not (self.requirements or self.editable):
            raise ValueError("holds describes a `requirements` file or an `editable` folder")
        return self

    def summary(self) -> str:
        """The step as one short line (the skills' dependency tables)."""
        if self.pip:
            return (
                "pip install "
                + " ".join(self.pip)
                + (f" --extra-index-url {self.index}" if self.index else "")
            )
        if self.requirements:
            return f"pip install -r {self.requirements}"
        if self.editable:
            return f"pip install -e {self.editable}"
        if self.clone:
            return f"git clone {self.clone.url}" + (f" @ {self.clone.ref}" if self.clone.ref else "")
        if self.copy_:
            return f"cp -r {self.copy_.source} {self.copy_.to}"
        if self.script:
            return f"bash {self.script.path} (in {self.script.cwd})"
        assert self.manual is not None
        return f"by hand: {self.manual.title}"

    def places(self) -> list[str]:
        """Checkout names this step refers to (each must be `mm` or an earlier clone)."""
        locs = [self.requirements, self.editable]
        if self.copy_:
            locs += [self.copy_.source, self.copy_.to, self.copy_.creates]
        if self.script:
            locs += [self.script.path, self.script.done_when, f"{self.script.cwd}:"]
        return [split_loc(loc)[0] for loc in locs if loc]


class ReadmeDeviation(_Frozen):
    """A README install command the plan does not follow as written, and why (checked by the fidelity test)."""

    readme: str = Field(min_length=3, description="the README's command, as written")
    reason: str = Field(min_length=20, description="why the plan differs (upstream evidence as path:line)")


BaseStep = Literal["megatron", "mindspeed", "mindspeed-mm"]

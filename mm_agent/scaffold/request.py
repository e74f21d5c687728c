"""The request and answer of `scaffold_model` / `mm-agent new-model`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.fields import Name, PathText


class ScaffoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="new model id: lower-case letters, digits, _")
    base: Name = Field(
        default="wan2.1",
        description="Wan DiT whose VAE, text encoder and sizes it reuses: wan2.1, wan2.1-14b, wan2.2-5b, "
        "wan2.2-a14b",
    )
    mm_version: Name = Field(default="26.1.0", description="26.1.0 or master")
    layers: int | None = Field(default=None, gt=0, le=512, description="default: the base's (so below)")
    heads: int | None = Field(default=None, gt=0, le=1024)
    head_dim: int | None = Field(default=None, gt=0, le=4096, description="even")
    hidden: int | None = Field(default=None, gt=0, le=65536, description="= heads x head_dim")
    ffn_dim: int | None = Field(default=None, gt=0, le=262144)
    freq_dim: int | None = Field(default=None, gt=0, le=4096)
    text_dim: int | None = Field(default=None, gt=0, le=65536, description="text encoder width")
    patch: list[int] | None = Field(
        default=None, min_length=3, max_length=3, description="frames, height, width"
    )
    npus_per_node: int = Field(default=8, gt=0, le=16)
    checkout: PathText | None = Field(default=None, description="MindSpeed-MM checkout to write into")
    out: PathText | None = Field(
        default=None, description="else an overlay folder (default new_models/<name>)"
    )
    confirm: bool = Field(default=False, description="write the files (false: dry run)")


class ScaffoldFile(BaseModel):
    path: str = Field(description="relative to the checkout (or overlay) root")
    role: str
    action: Literal["create", "edit", "unchanged"]
    bytes: int
    differs: str | None = Field(default=None, description="where this file departs from the guide, and why")


class ScaffoldResult(BaseModel):
    name: str
    cls: str = Field(description="the DiT class, registered as PREDICTOR_MODEL_MAPPINGS[name]")
    model_class: str
    dataset_class: str
    base: str
    mm_version: str
    arch: dict[str, object]
    mode: Literal["checkout", "overlay"]
    root: str = Field(description="where the files go: the checkout, or the overlay folder")
    status: Literal["dry_run", "written", "unchanged"]
    files: list[ScaffoldFile]
    registry_file: str = Field(description="the model's registry entry in the workspace")
    copy_commands: list[list[str]] = Field(
        default_factory=list, description="overlay: argv lists that copy it into a checkout"
    )
    register_lines: list[str] = Field(
        default_factory=list, description="overlay: the lines to add to predict_model.py"
    )
    next_steps: list[str]

"""What mm-agent knows about MindSpeed-MM's FSDP2 new-model flow (registry/data/new_model.yaml), validated.

Data, not code: the releases that document the flow, the interfaces the scaffolded files import, where each file
goes (with the guide's own words), the registration, the guide's config values and the Wan bases whose VAE, text
encoder and sizes a new model starts from. `tests/fidelity/test_scaffold_data.py` re-finds all of it upstream.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.registry import DATA_DIR, load_data

Role = Literal[
    "dit", "model", "dataset", "entry", "model_config", "data_config", "fsdp2_config", "launch", "readme"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Refusal(_Strict):
    versions: list[str]
    reason: str = Field(description="why; {version} is replaced")
    fix: str


class FileSpec(_Strict):
    role: Role
    path: str = Field(description="relative to the checkout root; {name} is the model's name")
    template: str = Field(description="under templates/new_model/")
    guide: str = Field(description="the guide's own words for this file (re-found in it by a fidelity test)")
    differs: str | None = Field(default=None, description="where and why the scaffold departs from the guide")


class Registration(_Strict):
    file: str
    mapping: str
    guide: str


class DataDefaults(_Strict):
    num_frames: int
    max_height: int
    max_width: int
    model_max_length: int
    dataloader_param: dict[str, Any]


class Arch(_Strict):
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn_dim: int = Field(gt=0)
    freq_dim: int = Field(gt=0)
    text_dim: int = Field(gt=0)
    in_channels: int = Field(gt=0)
    out_channels: int = Field(gt=0)
    patch_size: tuple[int, int, int]
    rope_max_seq_len: int = Field(gt=0)


class Stock(_Strict):
    predictor: str
    encoders: str


class Base(_Strict):
    id: str
    aliases: list[str] = Field(default_factory=list)
    model: str = Field(description="the registered model this base is")
    size: str
    hf_id: str
    stock: Stock
    arch: Arch
    ae: dict[str, Any]
    text_encoder: dict[str, Any]


class NewModelSpec(_Strict):
    guide: str
    versions: list[str] = Field(min_length=1)
    refused: list[Refusal]
    interfaces: dict[str, list[str]]
    files: list[FileSpec]
    registration: Registration
    data: DataDefaults
    fsdp2: dict[str, Any]
    bases: list[Base] = Field(min_length=1)
    diffusion: dict[str, Any]

    def base(self, name: str) -> Base | None:
        key = name.strip().lower()
        return next((b for b in self.bases if key == b.id or key in b.aliases), None)

    def refusal(self, version: str) -> Refusal | None:
        return next((r for r in self.refused if version in r.versions), None)


@functools.lru_cache(maxsize=1)
def load_spec() -> NewModelSpec:
    return load_data(NewModelSpec, DATA_DIR / "new_model.yaml", schema="mm_agent/scaffold/spec.py")

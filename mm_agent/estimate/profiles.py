"""How a training runtime keeps memory (`registry/data/memory_profiles.yaml`): bytes per parameter for the
weights, gradients and optimizer, and per token for a layer's activations.

MindSpeed-MM follows Megatron's published formula; mm-agent's bundled runtime keeps more per token (plain
torch, fp32 norms and RoPE copies) and trains in fp32 on CPU, so it has measured profiles of its own.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import DATA_DIR, load_data

PROFILES_FILE = DATA_DIR / "memory_profiles.yaml"
Precision = Literal["bf16", "fp32"]
Runtime = Literal["mindspeed-mm", "bundled"]


class MemoryProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    runtime: Runtime
    precision: Precision
    weight_bytes: float = Field(gt=0, le=16)
    grad_bytes: float = Field(gt=0, le=16)
    optimizer_bytes: float = Field(ge=0, le=32)
    cast_weight_bytes: float = Field(
        default=0, ge=0, le=4, description="autocast's low-precision weight copies, kept through the forward"
    )
    per_hidden: float = Field(gt=0, le=1024, description="activation bytes per token per hidden unit")
    per_ffn: float = Field(ge=0, le=1024, description="activation bytes per token per MLP unit")
    cross_per_hidden: float = Field(ge=0, le=1024, description="cross-attention blocks, per token per hidden")
    per_text_hidden: float = Field(ge=0, le=1024, description="cross-attention, per text token per hidden")
    kept_per_hidden: float = Field(gt=0, le=64, description="a layer's input kept under full recompute")
    source: str = Field(min_length=10)


class ProfileTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    profiles: list[MemoryProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_each(self) -> ProfileTable:
        seen: set[tuple[str, str]] = set()
        for p in self.profiles:
            if (p.runtime, p.precision) in seen:
                raise ValueError(f"two profiles for {p.runtime} in {p.precision}")
            seen.add((p.runtime, p.precision))
        return self

    def find(self, runtime: Runtime, precision: Precision) -> MemoryProfile:
        for p in self.profiles:
            if (p.runtime, p.precision) == (runtime, precision):
                return p
        raise MMAgentError(
            f"no memory profile for the {runtime} runtime in {precision}",
            field="device",
            fix="pick a device whose precision the runtime has a profile for (mm_agent/registry/data/"
            "memory_profiles.yaml)",
        )


def load_profiles_file(path: Path) -> ProfileTable:
    return load_data(ProfileTable, path, schema="mm_agent/estimate/profiles.py")


@functools.lru_cache(maxsize=1)
def load_profiles() -> ProfileTable:
    return load_profiles_file(PROFILES_FILE)

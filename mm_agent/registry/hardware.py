"""Hardware names a request may mention (`registry/data/hardware.yaml`), validated at load.

route_model consumes these words before it reads counts and model sizes: "8 Ascend 910B NPUs" is 8 NPUs on
Ascend 910B, never a model of size 910b.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mm_agent.registry import DATA_DIR, load_data

HARDWARE_FILE = DATA_DIR / "hardware.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HardwareName(_Strict):
    name: str = Field(min_length=1, description="canonical name reported back, e.g. 'Ascend 910B'")
    kind: Literal["npu", "gpu", "server"]
    words: list[str] = Field(min_length=1, description="spellings in requests (case and separators ignored)")

    @field_validator("words")
    @classmethod
    def _non_blank(cls, words: list[str]) -> list[str]:
        if any(not w.strip() for w in words):
            raise ValueError("a hardware word is blank")
        return words


class HardwareTable(_Strict):
    hardware: list[HardwareName] = Field(min_length=1)

    @field_validator("hardware")
    @classmethod
    def _unique_words(cls, items: list[HardwareName]) -> list[HardwareName]:
        seen: dict[str, str] = {}
        for item in items:
            for word in item.words:
                key = "".join(ch for ch in word.lower() if ch not in " \t-_.")
                if key in seen:
                    raise ValueError(f"word {word!r} is listed for both {seen[key]!r} and {item.name!r}")
                seen[key] = item.name
        return items


def load_hardware_file(path: Path) -> HardwareTable:
    return load_data(HardwareTable, path, schema="mm_agent/registry/hardware.py")


@functools.lru_cache(maxsize=1)
def load_hardware() -> HardwareTable:
    return load_hardware_file(HARDWARE_FILE)

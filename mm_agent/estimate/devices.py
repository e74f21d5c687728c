"""Accelerator figures (`registry/data/devices.yaml`): memory, dense bf16 peak, typical MFU, runtime workspace.

Kept as data with a source per entry, so a figure can be checked and corrected without touching the estimator.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import DATA_DIR, load_data

DEVICES_FILE = DATA_DIR / "devices.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Device(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str = Field(min_length=2)
    aliases: list[str] = Field(default_factory=list)
    memory_gb: float = Field(gt=0, le=4096)
    bf16_tflops: float = Field(gt=0, le=100_000, description="dense, no sparsity")
    mfu: float = Field(gt=0, le=1, description="model FLOPs utilisation a training run typically reaches")
    workspace_gb: float = Field(
        ge=0, le=64, description="runtime context, collective buffers, allocator slack"
    )
    source: str = Field(min_length=10, description="datasheet URL or document; 'unverified' where none")
    precision: Literal["bf16", "fp32"] = Field(
        default="bf16",
        description="how training runs there: bf16 mixed precision, or fp32 (the bundled runtime on CPU)",
    )


class DeviceTable(_Strict):
    default: str
    devices: list[Device] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> DeviceTable:
        seen: set[str] = set()
        for device in self.devices:
            for key in (_key(device.id), *(_key(a) for a in device.aliases)):
                if key in seen:
                    raise ValueError(f"device name {key!r} is listed twice")
                seen.add(key)
        if _key(self.default) not in seen:
            raise ValueError(f"default device {self.default!r} is not listed")
        return self

    def find(self, name: str) -> Device:
        """The device named by id or alias (case, spaces and hyphens ignored), or a clear error."""
        key = _key(name)
        for device in self.devices:
            if key == _key(device.id) or key in {_key(a) for a in device.aliases}:
                return device
        raise MMAgentError(
            f"unknown device {name!r}",
            field="device",
            fix=f"use one of {', '.join(d.id for d in self.devices)}",
        )


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in " -_")


def load_devices_file(path: Path) -> DeviceTable:
    return load_data(DeviceTable, path, schema="mm_agent/estimate/devices.py")


@functools.lru_cache(maxsize=1)
def load_devices() -> DeviceTable:
    return load_devices_file(DEVICES_FILE)

"""Request and answer of `estimate_resources`: the contract the CLI (`mm-agent estimate --json`) and the MCP
tool share. The answer's keys `fits`, `per_device_gb`, `device_gb`, `breakdown`, `step_seconds` and `levers`
are kept stable (issue 18); the rest explains where the numbers come from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Recompute = Literal["full", "none"]
# what is sharded over the data-parallel ranks: distributed-optimizer (ZeRO-1) the optimizer states, zero2 also the
# gradients (DeepSpeed stage 2), zero3 / layerzero / fsdp2 the weights too (DeepSpeed, MindSpeed, torch)
Sharding = Literal["none", "distributed-optimizer", "zero2", "zero3", "layerzero", "fsdp2"]
FULL_SHARDING = ("zero3", "layerzero", "fsdp2")


class EstimateRequest(BaseModel):
    """A model + size + layout + input shape + device, or a rendered job directory (its job.yaml and configs)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, max_length=100, description="registry id")
    size: str | None = Field(default=None, max_length=40)
    task: str | None = Field(default=None, max_length=20)
    job_dir: str | None = Field(default=None, max_length=4096, description="rendered job instead")
    npus: int | None = Field(default=None, ge=1, le=100_000)
    tp: int | None = Field(default=None, ge=1, le=1024)
    cp: int | None = Field(default=None, ge=1, le=1024)
    frames: int | None = Field(default=None, ge=1, le=10_001, description="4n+1")
    height: int | None = Field(default=None, ge=16, le=16_384)
    width: int | None = Field(default=None, ge=16, le=16_384)
    text_len: int | None = Field(default=None, ge=1, le=1_000_000)
    recompute: Recompute | None = None
    sharding: Sharding | None = None
    lora: bool | None = None
    device: str | None = Field(default=None, max_length=60, description="910b (default), h100...")
    train_iters: int | None = Field(default=None, ge=1, le=1_000_000_000)
    dataset_size: int | None = Field(default=None, ge=1, le=10**12, description="samples")


class Lever(BaseModel):
    """One change that lowers the per-device memory, with the estimate it gives."""

    change: str = Field(description="what to change, in words a user can act on")
    per_device_gb: float
    fits: bool
    args: dict[str, str | int | bool] = Field(description="the request fields this lever sets")


class EstimateResult(BaseModel):
    model: str
    size: str
    task: str
    backend: str
    device: str = Field(description="device id of devices.yaml")
    fits: bool = Field(description="per_device_gb <= device_gb")
    per_device_gb: float
    device_gb: float
    breakdown: dict[str, float] = Field(
        description="GB per device: weights, gradients, optimizer, activations..."
    )
    step_seconds: float | None = Field(
        description="one optimizer step of the global batch; None when unknown"
    )
    run_hours: float | None = Field(default=None, description="train_iters x step_seconds")
    epoch_hours: float | None = Field(default=None, description="dataset_size / global batch x step_seconds")
    levers: list[Lever] = Field(
        default_factory=list, description="best first; only changes that lower memory"
    )
    npus: int
    tp: int
    pp: int
    cp: int
    dp: int
    global_batch: int
    recompute: Recompute
    sharding: Sharding
    lora: bool
    runtime: str = Field(description="whose memory profile: mindspeed-mm, or mm-agent's bundled runtime")
    params_b: float = Field(description="parameters of the trained model, billions (MoE: total)")
    active_params_b: float = Field(description="parameters each token passes through, billions")
    params_source: str = Field(
        description="registry arch, size id, Hugging Face id or shapes.yaml (with source)"
    )
    frames: int
    height: int
    width: int
    text_len: int
    seq_tokens: int = Field(description="tokens per sample the DiT/LLM attends over")
    vision_tokens: int = Field(default=0, description="VLM: ViT patches per sample (before merge)")
    tflops_per_step: float
    notes: list[str] = Field(default_factory=list)

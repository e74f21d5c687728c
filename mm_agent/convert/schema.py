"""Typed contract of `convert_weights`: request, plan (dry run), report, manifest.

These models import no torch: the MCP server and the CLI plan conversions and read reports without the
heavy stack; the conversion itself runs in a worker process (`python -m mm_agent.convert.worker`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.fields import Name, PathText

# MindSpeed-MM's names, so commands read like the upstream docs (`mm-convert WanConverter hf_to_mm ...`).
ConverterName = str
Method = str
Status = Literal["dry_run", "started", "converted", "unchanged", "failed"]
Layers = Annotated[int, Field(ge=0, le=100_000)]
StageLayers = Annotated[list[Layers], Field(max_length=1024)]  # layers per PP stage
VppLayers = Annotated[list[StageLayers], Field(max_length=64)]  # per VPP chunk, layers per PP stage


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConvertRequest(_Model):
    """One conversion. Paths are confined to the workspace over MCP."""

    converter: Name = Field(description="MindSpeed-MM converter class, e.g. WanConverter")
    method: Name = Field(description="converter method, e.g. hf_to_mm, mm_to_hf, resplit")
    source: PathText = Field(description="HF dir (hf_to_mm), MM checkpoint dir (mm_to_hf, resplit)")
    target: PathText = Field(description="output dir (may equal source: Wan in place)")
    hf_dir: PathText | None = Field(
        default=None, description="mm_to_hf: original HF dir (config.json, index files)"
    )
    tp: int = Field(default=1, ge=1, le=1024, description="TP of the MM layout")
    pp_layers: StageLayers | VppLayers | None = Field(
        default=None,
        description="layers per PP stage, e.g. [7,8,8,7]; nested = VPP; VLM: LLM layers",
    )
    vit_pp_layers: StageLayers | VppLayers | None = Field(
        default=None, description="VLM: ViT layers per PP stage (ViT layers come first)"
    )
    source_tp: int | None = Field(
        default=None, ge=1, le=1024, description="resplit: TP of the source (read from it if None)"
    )
    lora_path: PathText | None = Field(default=None, description="merge_lora_to_base: LoRA checkpoint")
    lora_rank: int | None = Field(default=None, ge=0, le=65536, description="LoRA merge rank (8)")
    lora_alpha: int | None = Field(default=None, ge=0, le=65536, description="LoRA merge alpha (16)")
    converter_version: str | None = Field(
        default=None,
        max_length=32,
        pattern=r"^[A-Za-z0-9._-]{1,32}$",
        description="mm-convert --version (CogVideoX, OpenSora-Plan)",
    )
    verify: bool = Field(default=False, description="compare source and result numerically")
    confirm: bool = Field(default=False, description="convert (false: dry run, the plan)")

    @model_validator(mode="after")
    def _vit_only_for_lists(self) -> ConvertRequest:
        if self.vit_pp_layers is not None and self.pp_layers is None:
            raise ValueError("vit_pp_layers needs pp_layers (the LLM layers per stage) as well")
        return self


class RankFile(_Model):
    """One file of the MM layout: `release/mp_rank_TT[_PPP]/model_optim_rng.pt`."""

    path: str = Field(description="relative to the target dir")
    tp_rank: int
    pp_rank: int | None = Field(description="None when PP == 1 (no _PPP suffix)")
    keys: int = Field(description="tensors in the file (all VPP chunks together)")
    bytes: int = Field(description="tensor bytes in the file")
    layers: list[list[int]] = Field(
        default_factory=list, description="global layer ids held, per VPP chunk (blocks renumbered from 0)"
    )


class Estimate(_Model):
    source_bytes: int
    output_bytes: int
    peak_memory_bytes: int = Field(description="peak anonymous host memory the conversion needs")
    free_memory_bytes: int
    free_disk_bytes: int = Field(description="free space where the target is written")
    fits: bool
    reason: str | None = Field(default=None, description="why it does not fit, with the fix")


class ConvertPlan(_Model):
    """What a conversion will do, before it does it (the dry-run answer)."""

    native: bool = Field(description="True: mm-agent converts; False: runs MindSpeed-MM's mm-convert")
    converter: ConverterName
    method: Method
    source: str
    target: str
    layout: list[RankFile] = Field(
        default_factory=list, description="files it will write (keys/bytes filled when known)"
    )
    estimate: Estimate | None = None
    mm_convert_argv: list[str] = Field(description="the equivalent MindSpeed-MM command")
    notes: list[str] = Field(default_factory=list)
    download: str | None = Field(
        default=None,
        description="the source is not downloaded yet: the command that downloads it, to run first (the plan "
        "then comes from the registry; keys, bytes and the estimate once the weights are there)",
    )


class Manifest(_Model):
    """Sidecar `mm_agent_manifest.json` written next to every converted checkpoint."""

    format: Literal["mm-agent-convert/1"] = "mm-agent-convert/1"
    converter: ConverterName
    method: Method
    direction: Literal["hf_to_mm", "mm_to_hf", "resplit", "merge_lora_to_base", "lora_hf_to_mm"]
    mm_agent_version: str
    source_files: dict[str, str] = Field(description="relative path -> 'size:sha256' of every source file")
    tp: int
    pp_layers: list[int] | list[list[int]] | None
    vit_pp_layers: list[int] | list[list[int]] | None = None
    vpp: int = 1
    lora_rank: int | None = Field(default=None, description="merge_lora_to_base: the scaling's rank")
    lora_alpha: int | None = Field(default=None, description="merge_lora_to_base: the scaling's alpha")
    key_count: int
    files: list[RankFile]
    created: str = Field(description="ISO timestamp")
    source_mtimes: dict[str, int] = Field(
        default_factory=dict, description="mtime_ns per source file: hashes are reused while size+mtime hold"
    )
    hf_config: dict[str, Any] | None = Field(
        default=None, description="config.json of the original HF model (mm_to_hf restores it)"
    )
    hf_index: str | None = Field(
        default=None,
        description="index file name of the original HF dir; None when it had one unsharded file",
    )
    hf_weight_map: dict[str, str] | None = Field(
        default=None, description="HF key -> file name in the original (mm_to_hf reproduces the sharding)"
    )


class KeyChange(_Model):
    source: str
    target: str | None = Field(description="None = dropped")
    reason: str | None = None


class ConvertReport(_Model):
    status: Status
    run_id: str | None = None
    plan: ConvertPlan
    message: str
    keys_converted: int = 0
    keys_dropped: list[KeyChange] = Field(default_factory=list, description="dropped keys and why")
    files: list[RankFile] = Field(default_factory=list, description="what was written, per stage/rank")
    bytes_written: int = 0
    seconds: float = 0.0
    peak_rss_bytes: int | None = None
    verify: VerifyReport | None = None
    warnings: list[str] = Field(
        default_factory=list,
        description="what converted but looks wrong (NaN/Inf in the weights, naming the tensors)",
    )


class VerifyReport(_Model):
    ok: bool
    round_trip_bitwise: bool | None = Field(default=None, description="hf_to_mm -> mm_to_hf identical")
    max_abs_diff: float | None = Field(default=None, description="forward outputs, source vs converted")
    dtype: str | None = None
    details: list[str] = Field(default_factory=list)


ConvertReport.model_rebuild()

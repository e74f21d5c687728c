"""Request and result of `prepare_dataset` (MCP) / `mm-agent dataset` (CLI): a folder of clips or images (or
an index file) -> a checked MindSpeed-MM dataset index."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.fields import Name, PathText

IndexKind = Literal["video-text", "image-text", "mllm"]


class DatasetRequest(BaseModel):
    """What `prepare_dataset` takes. Left out, the limits are the job's (`job_dir`) or the stock ones that
    `render_job` would write for the model, task and size."""

    model_config = ConfigDict(extra="forbid")

    dir: PathText = Field(description="folder of videos or images (recursive)")
    model: Name = Field(description="e.g. wan2.1, qwen2.5vl")
    task: Name | None = None  # (checked against the registry where it is used: render_job's own error)
    size: Name | None = None
    mm_version: Name | None = None
    runtime: Literal["mindspeed-mm", "bundled"] | None = Field(default=None, description="default: the job's")
    job_dir: PathText | None = Field(default=None, description="rendered job whose limits apply")
    index: PathText | None = Field(
        default=None, description="CSV/JSONL/JSON of paths + captions or conversations"
    )
    path_column: Name | None = None
    caption_column: Name | None = None
    # (CogVideoX and Step-Video: <dir>/data.jsonl, the file their reader reads)
    out: PathText | None = Field(default=None, description="default: <dir>/data.json")
    num_frames: int | None = Field(default=None, ge=1, le=10001)
    frame_interval: int | None = Field(default=None, ge=1, le=100)
    max_height: int | None = Field(default=None, ge=16, le=16384)
    max_width: int | None = Field(default=None, ge=16, le=16384)
    text_len: int | None = Field(default=None, ge=1, le=4096)
    confirm: bool = False


class Rejected(BaseModel):
    path: str = Field(description="relative to the dataset root (or the index line)")
    reason: str
    fix: str


class Distribution(BaseModel):
    """Summary of one measured quantity over the accepted items."""

    count: int
    min: float | None = None
    p50: float | None = None
    max: float | None = None
    mean: float | None = None


class DatasetStats(BaseModel):
    found: int = Field(description="media files (or index records) seen")
    accepted: int
    rejected: int
    probed: int = Field(description="files decoded this run (the rest came from the probe cache)")
    cached: int
    duplicates: int = Field(description="exact duplicates by content hash (all but the first rejected)")
    reasons: dict[str, int] = Field(default_factory=dict, description="rejections by reason code")
    duration_s: Distribution | None = None
    frames: Distribution | None = None
    fps: Distribution | None = None
    caption_words: Distribution | None = None
    images_per_record: Distribution | None = Field(default=None, description="VLM records")
    resolutions: dict[str, int] = Field(default_factory=dict, description="'WxH' -> clips, the 12 commonest")
    sample_sizes: dict[str, int] = Field(
        default_factory=dict, description="what MindSpeed-MM groups by: 'frames x height x width' -> clips"
    )
    seconds: float


class DatasetResult(BaseModel):
    ok: bool = Field(description="at least one item accepted")
    status: Literal["dry_run", "written", "unchanged"] = Field(
        description="unchanged: the index already held exactly these records"
    )
    written: str | None = Field(description="the index written; null on a dry run")
    kind: IndexKind
    dir: str
    index: str = Field(description="the index file (written, or that would be)")
    reader: str | None = Field(default=None, description="the model's dataset reader and what it reads")
    data_txt: str | None = Field(default=None, description="video-text: the `root,json` line file")
    plot: str | None = Field(default=None, description="PNG of the distributions (written with the index)")
    accepted: int
    rejected: list[Rejected]
    stats: DatasetStats
    limits: dict[str, float | int | bool | str | None] = Field(
        default_factory=dict, description="what the items were checked against, and where it came from"
    )
    warnings: list[str] = Field(default_factory=list)
    next_steps: list[str] = Field(default_factory=list)

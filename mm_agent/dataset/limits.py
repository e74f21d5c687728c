"""What a clip must be for MindSpeed-MM to use it: limits read from a job's dataset config, and the per-clip
and per-dataset decisions its video processor makes (`OpensoraplanVideoProcessor.select_valid_data`:
caption, resolution, temporal sampling, the final sample-size filter).

These are mm-agent's own reading of the rules, checked against MindSpeed-MM's code in
`tests/fidelity/test_dataset_upstream.py`. Pure functions over numbers: the scan, validation and the
bundled demo all decide the same way.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

OPENSORAPLAN = "OpensoraplanVideoProcessor"


class ClipLimits(BaseModel):
    """The numbers of a dataset config's `preprocess_parameters` that decide which clips are used. A key the
    config leaves out takes MindSpeed-MM's own default (`AbstractVideoProcessor` and
    `OpensoraplanVideoProcessor.__init__`), as MindSpeed-MM does."""

    processor: str = Field(default=OPENSORAPLAN, description="video_processor_type")
    num_frames: int = 16
    min_num_frames: int = 29
    frame_interval: int = 1
    auto_interval: bool = True
    train_fps: float = 24.0
    drop_short_ratio: float = 1.0
    force_resolution: bool = True
    max_height: int = 480
    max_width: int = 640
    max_hxw: int | None = None
    min_hxw: int | None = None
    hw_stride: int = 32
    hw_aspect_thr: float = 1.5
    ae_stride_t: int = 4
    sp_size: int = 1
    text_len: int = 512
    global_batch_size: int | None = Field(default=None, description="of the extraction run (final filter)")
    source: str = Field(default="defaults", description="where the numbers came from")


def limits_from_config(data_cfg: dict[str, Any], *, source: str, **extra: Any) -> ClipLimits:
    """ClipLimits from a parsed dataset config (`{"dataset_param": {"preprocess_parameters": ...}}`)."""
    ds = data_cfg.get("dataset_param", data_cfg) if isinstance(data_cfg, dict) else {}
    pre = ds.get("preprocess_parameters", {}) if isinstance(ds, dict) else {}
    tok = ds.get("tokenizer_config", {}) if isinstance(ds, dict) else {}
    tok = tok[0] if isinstance(tok, list) and tok else tok
    values: dict[str, Any] = {}
    for name in ClipLimits.model_fields:
        key = "video_processor_type" if name == "processor" else name
        if isinstance(pre, dict) and pre.get(key) is not None:
            values[name] = pre[key]
    scale = pre.get("vae_scale_factor") if isinstance(pre, dict) else None
    if isinstance(scale, list) and scale:
        values["ae_stride_t"] = scale[0]
    if isinstance(tok, dict) and isinstance(tok.get("model_max_length"), int):
        values["text_len"] = tok["model_max_length"]
    limits = ClipLimits.model_validate({**values, **{k: v for k, v in extra.items() if v is not None}})
    if limits.max_hxw is not None and limits.min_hxw is None:
        limits = limits.model_copy(update={"min_hxw": limits.max_hxw // 4})
    return limits.model_copy(update={"source": source})


class ClipPlan(BaseModel):
    """How MindSpeed-MM will sample an accepted clip: the frames it takes and the size it trains at."""

    sample_num_frames: int
    sample_height: int
    sample_width: int

    @property
    def sample_size(self) -> str:
        return f"{self.sample_num_frames}x{self.sample_height}x{self.sample_width}"


class Refusal(BaseModel):
    code: str
    reason: str
    fix: str


def _closest_4n1(count: int, lim: ClipLimits) -> int:
    """The largest frame count <= `count` the video VAE encodes exactly ((y - 1) % stride_t == 0, and the
    latent frames divide by the sequence-parallel size), at least `min_num_frames`; -1 when none."""
    for y in range(count, lim.min_num_frames - 1, -1):
        if (y - 1) % lim.ae_stride_t == 0 and ((y - 1) // lim.ae_stride_t + 1) % lim.sp_size == 0:
            return y
    return -1


def _resolution(height: int, width: int, lim: ClipLimits) -> tuple[int, int] | Refusal:
    if height <= 0 or width <= 0:
        return Refusal(
            code="no_resolution", reason="no frame size", fix="re-encode the file; it has no video frames"
        )
    thr = lim.hw_aspect_thr or 1.5
    if lim.force_resolution:
        aspect = lim.max_height / lim.max_width
        low, high = aspect / thr, aspect * thr
        sample = (lim.max_height, lim.max_width)
    else:
        h, w = height, width
        if lim.max_hxw is not None and h * w > lim.max_hxw:
            scale = math.sqrt(lim.max_hxw / (h * w))
            h, w = int(h * scale), int(w * scale)
        sh, sw = h // lim.hw_stride * lim.hw_stride, w // lim.hw_stride * lim.hw_stride
        if sh <= 0 or sw <= 0:
            return Refusal(
                code="resolution_too_small",
                reason=f"{width}x{height} is below the {lim.hw_stride}-pixel stride",
                fix=f"use clips at least {lim.hw_stride}x{lim.hw_stride} pixels",
            )
        if lim.min_hxw is not None and sh * sw < lim.min_hxw:
            return Refusal(
                code="resolution_too_small",
                reason=f"{width}x{height} trains at {sw}x{sh}, under min_hxw {lim.min_hxw} pixels",
                fix=f"use clips of at least {lim.min_hxw} pixels (e.g. {lim.max_width // 2}x{lim.max_height // 2})",
            )
        low, high = 1 / thr, thr
        sample = (sh, sw)
        height, width = sh, sw
    ratio = height / width
    if not low <= ratio <= high:
        return Refusal(
            code="aspect_mismatch",
            reason=f"height/width {ratio:.2f} is outside [{low:.2f}, {high:.2f}] (hw_aspect_thr {thr:g})",
            fix="crop the clip nearer the training aspect, or raise hw_aspect_thr in the dataset config",
        )
    return sample


def plan_clip(frames: int, fps: float, height: int, width: int, lim: ClipLimits) -> ClipPlan | Refusal:
    """What MindSpeed-MM's video processor makes of a clip of `frames` at `fps`, `width`x`height`: the
    sampled frames and training size, or why it leaves the clip out (or fails on it)."""
    if frames <= 0 or fps <= 0:
        return Refusal(
            code="no_frames",
            reason="no decodable frames",
            fix="re-encode the file (ffmpeg -i in.mp4 out.mp4)",
        )
    need = lim.num_frames
    if (
        lim.processor != OPENSORAPLAN
    ):  # a fixed window of num_frames x frame_interval, else "Insufficient frames"
        taken = math.ceil(frames / lim.frame_interval)
        if taken < need:
            return Refusal(
                code="too_short",
                reason=f"{frames} frames at frame_interval {lim.frame_interval} give {taken}, fewer than {need}",
                fix=f"use clips of at least {need * lim.frame_interval} frames, or lower num_frames",
            )
        return ClipPlan(sample_num_frames=need, sample_height=lim.max_height, sample_width=lim.max_width)
    size = _resolution(height, width, lim)
    if isinstance(size, Refusal):
        return size
    # OpenSora-Plan's processor ignores frame_interval: with auto_interval it resamples to train_fps
    interval = fps / lim.train_fps if lim.auto_interval and abs(fps - lim.train_fps) >= 0.1 else 1.0
    taken = math.ceil(frames / interval)
    if taken < need and lim.drop_short_ratio >= 1:
        return Refusal(
            code="too_short",
            reason=f"{frames} frames at {fps:g} fps give {taken} samples, fewer than num_frames {need}",
            fix=f"use clips of at least {math.ceil(need * interval)} frames, or lower num_frames",
        )
    usable = _closest_4n1(min(taken, need), lim)
    if usable == -1:
        return Refusal(
            code="too_short",
            reason=f"{min(taken, need)} sampled frames hold no 4n+1 count of at least {lim.min_num_frames}",
            fix=f"use clips of at least {max(lim.min_num_frames, 1 + lim.ae_stride_t)} frames",
        )
    return ClipPlan(sample_num_frames=usable, sample_height=size[0], sample_width=size[1])


def small_groups(sizes: Counter[str], lim: ClipLimits) -> dict[str, int]:
    """Sample sizes MindSpeed-MM's final filter drops: fewer clips than 4 x global batch size share them."""
    if not lim.global_batch_size or lim.processor != OPENSORAPLAN:
        return {}
    floor = 4 * lim.global_batch_size
    return {size: n for size, n in sizes.items() if n < floor}


def frames_rule(num_frames: int, stride_t: int = 4) -> str | None:
    """The 4n+1 rule of a video VAE with temporal stride `stride_t`, as a message (None when it holds)."""
    if (num_frames - 1) % stride_t == 0:
        return None
    low = (num_frames - 1) // stride_t * stride_t + 1
    return f"num_frames {num_frames} is not {stride_t}n+1 (the VAE's temporal stride): use {low} or {low + stride_t}"

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
COGVIDEOX = "CogVideoXProcessor"


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
    skip_frame_num: int | None = Field(
        default=None, description="CogVideoXProcessor: frames skipped at each end"
    )
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
    if lim.processor == COGVIDEOX:
        return _cogvideox(frames, fps, lim)
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


def _cogvideox(frames: int, fps: float, lim: ClipLimits) -> ClipPlan | Refusal:
    """CogVideoXProcessor.__call__ (CogVideoX, Step-Video; video_processor.py:176-228 at 26.0.0): every clip trains
    at num_frames (a short one padded with its last frame) and max_height x max_width (resized, centre-cropped),
    and select_valid_data keeps every record. Some clips fail inside `getitem`, where T2VDataset's handler then
    trains a random other record: a clip longer than num_frames at train_fps is resampled over a window of
    int(num_frames / train_fps x fps) frames from frame skip_frame_num, which fails when its step
    `window // num_frames` is 0 (fps under train_fps) or the window runs past the clip's end; a shorter clip
    fails when no frame is left between the skip_frame_num frames cut at each end."""
    skip = lim.skip_frame_num or 0
    need, train_fps = lim.num_frames, lim.train_fps
    if frames / fps * train_fps > need:
        window = int(need / train_fps * fps)
        if window // need == 0:
            return Refusal(
                code="low_fps",
                reason=f"{fps:g} fps is under train_fps {train_fps:g}: CogVideoXProcessor resamples "
                f"{frames} frames with step {window} // {need} = 0 and the clip fails at load",
                fix=f"re-encode the clip at {train_fps:g} fps or more (ffmpeg -i in.mp4 -r {train_fps:g} out.mp4)",
            )
        step = window // need
        last = skip + step * (-(-window // step) - 1)  # the last of np.arange(skip, skip + window, step)
        if last >= frames:
            return Refusal(
                code="too_short",
                reason=f"CogVideoXProcessor samples frames {skip}..{last} (every {step} from skip_frame_num {skip}) "
                f"of a {frames}-frame clip and fails past its end",
                fix=f"use clips of at least {last + 1} frames, or of at most {need} frames at {train_fps:g} fps",
            )
    elif frames - 2 * skip < 1:
        return Refusal(
            code="too_short",
            reason=f"{frames} frames leave none after skip_frame_num {skip} at each end",
            fix=f"use clips of more than {2 * skip} frames",
        )
    return ClipPlan(sample_num_frames=need, sample_height=lim.max_height, sample_width=lim.max_width)


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


# ---- MindSpeed-MM's feature extraction over several ranks (get_sora_feature.py and its Wan/HunyuanVideo/...
# subclasses, 26.0.0 = 26.1.0): rank 0 writes data.jsonl once from the dataset (one record per sample); every
# rank writes the features of the samples its sampler gives it with torch.save straight to
# features/<file name>.pt, no temp file and rename. Judged against the real samplers in
# tests/fidelity/test_dataset_readers.py.
_PADS = "mindspeed_mm/data/dataloader/sampler.py:62-89"
_SEQUENTIAL = "mindspeed_mm/data/dataloader/dataloader.py:449-488"
_SAVE = "mindspeed_mm/tools/feature_extraction/get_sora_feature.py:215-243"
_NAME = "mindspeed_mm/tools/feature_extraction/get_sora_feature.py:286-298"


def extraction_split(samples: int, dp: int, mbs: int, loader: dict[str, Any]) -> Refusal | None:
    """What the extraction's sampler (`dataloader_param`) does with `samples` on `dp` ranks x micro batch `mbs`
    when they do not divide (None when every sample is taken once):
    - `samples_dropped`: some samples get no feature file, yet data.jsonl lists them (SequentialSampler with
      drop_last; a DistributedSampler rank's last partial micro batch under drop_last);
    - `duplicate_writes`: samples repeated to fill the last step, one file written by two ranks at once;
    - `uneven_split`: both, or LengthGroupedSampler at micro batch > 1, whose rank slicing of its padded order
      repeats some samples and leaves others out."""
    dp, mbs = max(dp, 1), max(mbs, 1)
    sampler = loader.get("sampler_type", "stateful_distributed_sampler")
    drop_last = bool(loader.get("drop_last", False))
    grouped = sampler == "LengthGroupedSampler" and any(
        loader.get(k) for k in ("group_data", "group_frame", "group_resolution")
    )
    where = f"{samples} samples on {dp} rank(s) x micro batch {mbs}"
    step = dp * mbs
    if sampler == "SequentialSampler":  # one global batch of dp x mbs per step, sliced per rank
        rest = samples % step
        # without drop_last the last batch is sliced per rank; a rank whose slice starts past its end takes
        # the batch's first sample again (DistributedBatchSampler._batch)
        idle = dp - -(-rest // mbs) if rest else 0
        dropped, repeated = (rest, 0) if drop_last else (0, idle)
        how = f"the SequentialSampler's DistributedBatchSampler ({_SEQUENTIAL})"
    elif grouped and mbs > 1:
        rest = samples % step
        if not rest:
            return None
        return Refusal(
            code="uneven_split",
            reason=f"{where}: LengthGroupedSampler pads the last step with repeated samples and hands each rank every "
            f"{dp}th index of that order cut at {-(-samples // dp) * dp} ({_PADS}, sampler.py:329-358), so some "
            f"samples are taken twice (one file written by two ranks at once, with torch.save straight to its final "
            f"name, {_SAVE}) and others not at all, though data.jsonl lists every sample",
            fix=f"use a multiple of {step} samples, or micro batch 1 (the stock extraction's)",
        )
    else:  # DistributedSampler order (LengthGroupedSampler at micro batch 1 gives the same split)
        rest = samples % dp
        repeated = dp - rest if rest else 0
        per_rank = -(-samples // dp)
        dropped = dp * (per_rank % mbs) if drop_last and mbs > 1 else 0
        how = (
            f"LengthGroupedSampler ({_PADS})"
            if grouped
            else "the DistributedSampler (which repeats samples from the start of its order)"
        )
    if not dropped and not repeated:
        return None
    unit = step if sampler == "SequentialSampler" or dropped else dp
    over = samples % unit
    fix = (
        f"use a multiple of {unit} samples (add {unit - over} or drop {over}), or extract on a number of NPUs "
        f"that divides {samples}"
    )
    if dropped and repeated:
        return Refusal(
            code="uneven_split",
            reason=f"{where}: {how} repeats {repeated} sample(s) to fill the last step and drops the ranks' last "
            "partial micro batches (drop_last), so some samples are taken twice and others get no feature file",
            fix=fix,
        )
    if dropped:
        return Refusal(
            code="samples_dropped",
            reason=f"{where}: {how} drops the last {dropped} (drop_last true), so they get no feature file, while "
            "rank 0 lists every sample in data.jsonl; training stops with FileNotFoundError when it reaches one",
            fix=fix,
        )
    when = "in the same step" if grouped or sampler == "SequentialSampler" else "(in one step or two)"
    return Refusal(
        code="duplicate_writes",
        reason=f"{where}: {how} repeats {repeated} sample(s) to fill the last step, so a feature file is written by "
        f"two ranks {when} with torch.save straight to its final name ({_SAVE}): when the writes overlap the file "
        "is whole only if both ranks' tensors are byte-identical, otherwise a mix of the two (data.jsonl, written "
        "once by rank 0, holds no duplicate record)",
        fix=fix,
    )


def feature_name(path: str) -> str:
    """The feature file MindSpeed-MM's extraction writes for a clip: its file name alone, dots as underscores."""
    return path.replace("\\", "/").rsplit("/", 1)[-1].replace(".", "_") + ".pt"


def name_collision(paths: list[str]) -> Refusal | None:
    """Clips whose file names match write one feature file, and every record of them trains on the last one."""
    names: dict[str, str] = {}
    clashes: list[tuple[str, str]] = []
    for path in paths:
        first = names.setdefault(feature_name(path), path)
        if first != path:
            clashes.append((first, path))
    if not clashes:
        return None
    a, b = clashes[0]
    return Refusal(
        code="name_collision",
        reason=f"{len(clashes)} sample(s) share a file name with another ({a!r} and {b!r}): MindSpeed-MM names a "
        f"feature file by the clip's file name alone ({_NAME}), so both write features/{feature_name(b)} and "
        "every record of them trains on whichever was written last",
        fix="give every clip a unique file name (e.g. prefix it with its folder's name)",
    )

"""Reading training clips the way MindSpeed-MM's Wan feature extraction does, without torchvision.

MindSpeed-MM decodes with decord, picks frames with `OpensoraplanVideoProcessor` (every `frame_interval`-th
frame, at most `num_frames`, cut down to the longest 4n+1 count the causal VAE encodes exactly, but not below
`min_num_frames`), then `CenterCropResizeVideo` crops the centre to the target aspect ratio and resizes it
(bilinear, antialiased) to `max_height` x `max_width`. The same steps are reproduced here with plain torch
ops, because torchvision cannot be installed next to a CPU torch (environment notes §2).

Two deliberate differences: the temporal window starts at frame 0 instead of a random offset, so features
are reproducible and a resumed run writes the same tensors; and a source more than twice the target size is
shrunk by the decoder first (decord's `width`/`height`) to twice the target, which cuts decode memory and
time for high-resolution clips while the final antialiased resize still sets the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from runtime.errors import RuntimeFailure

VAE_STRIDE_T = 4  # Wan's causal VAE encodes 1 + 4k frames exactly


def check_num_frames(num_frames: int) -> None:
    """`num_frames` must be 4n+1 (the VAE's temporal stride); anything else is a config error."""
    if num_frames < 1 or (num_frames - 1) % VAE_STRIDE_T:
        raise RuntimeFailure(
            f"num_frames must be 4n+1 (1, 5, 9, ..., 81), got {num_frames}",
            field="dataset_param.preprocess_parameters.num_frames",
            fix=f"use {max(1, (num_frames - 1) // VAE_STRIDE_T * VAE_STRIDE_T + 1)} or another 4n+1 value",
        )


def sample_indices(
    total: int, num_frames: int, *, frame_interval: float = 1.0, min_num_frames: int | None = None
) -> list[int]:
    """Frame indices to decode from a clip of `total` frames (MindSpeed-MM's temporal plan, window at 0).

    Returns at most `num_frames` indices, cut to the longest 4n+1 count; `min_num_frames` (default:
    `num_frames`, i.e. strict) is the shortest count accepted. Too few frames raise `RuntimeFailure`.
    """
    check_num_frames(num_frames)
    minimum = num_frames if min_num_frames is None else max(1, min_num_frames)
    picks = np.arange(0, total, max(frame_interval, 1e-6)).astype(int)
    picks = picks[picks < total][:num_frames]
    usable = len(picks)
    while usable >= minimum and (usable - 1) % VAE_STRIDE_T:
        usable -= 1
    if usable < minimum or usable < 1:
        raise RuntimeFailure(
            f"video too short: {total} frames give {len(picks)} at frame_interval {frame_interval:g}, "
            f"need at least {minimum} (num_frames {num_frames}, a 4n+1 count)",
            fix="drop the clip from the dataset, or lower num_frames / min_num_frames / frame_interval",
        )
    return [int(i) for i in picks[:usable]]


def crop_box(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int, int, int]:
    """(top, left, crop_h, crop_w) of the centred region with the target's aspect ratio (MM center_crop_th_tw)."""
    ratio = target_h / target_w
    if height / width > ratio:
        crop_h, crop_w = int(width * ratio), width
    else:
        crop_h, crop_w = height, int(height / ratio)
    return round((height - crop_h) / 2.0), round((width - crop_w) / 2.0), crop_h, crop_w


def resize_crop(frames: torch.Tensor, target_h: int, target_w: int) -> torch.Tensor:
    """Centre-crop uint8 frames [T,H,W,3] to the target aspect, then antialiased-bilinear resize to it."""
    top, left, crop_h, crop_w = crop_box(frames.shape[1], frames.shape[2], target_h, target_w)
    frames = frames[:, top : top + crop_h, left : left + crop_w]
    if (crop_h, crop_w) == (target_h, target_w):
        return frames.contiguous()
    chw = frames.permute(0, 3, 1, 2).float()
    out = F.interpolate(chw, size=(target_h, target_w), mode="bilinear", align_corners=False, antialias=True)
    return out.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def decode_size(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int] | None:
    """Size to ask the decoder for so the crop is twice the target, or None when the source is not that big."""
    _, _, crop_h, crop_w = crop_box(height, width, target_h, target_w)
    scale = min(2 * target_h / crop_h, 2 * target_w / crop_w)
    if scale >= 1.0:
        return None
    return max(2 * target_h, round(height * scale)), max(2 * target_w, round(width * scale))


@dataclass(frozen=True)
class ClipPlan:
    """What the temporal plan took from one clip: the source's length, fps and frame size, and the frame indices.

    Feature extraction writes it into data.jsonl the way MindSpeed-MM's video processor annotates a sample
    (`num_frames`, `fps`, `resolution`, `sample_frame_index`, ...), because MM's grouped sampler reads it there.
    """

    total: int
    fps: float
    height: int
    width: int
    indices: tuple[int, ...]


def _open(path: str) -> tuple[Any, int, float, np.ndarray]:
    """decord reader, frame count, average fps and the first frame; missing or undecodable → `RuntimeFailure`."""
    import decord

    if not os.path.isfile(path):
        raise RuntimeFailure(
            "video not found", file=path, fix="fix the path in the dataset json or the root in data.txt"
        )
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0))
        total = len(reader)
        fps = reader.get_avg_fps()
        first = reader.next().asnumpy()
    except Exception as exc:  # decord raises bare RuntimeError/DECORDError for any bad input
        raise RuntimeFailure(
            f"cannot decode video: {str(exc).splitlines()[0]}",
            file=path,
            fix="re-encode the file (e.g. ffmpeg -i in.mp4 -c:v libx264 out.mp4) or drop it from the dataset",
        ) from exc
    return reader, total, float(fps), first


def _plan(
    path: str,
    total: int,
    fps: float,
    first: np.ndarray,
    num_frames: int,
    frame_interval: float,
    min_num_frames: int | None,
    train_fps: float | None,
) -> ClipPlan:
    if train_fps is not None and fps > 0 and abs(fps - train_fps) >= 0.1:
        frame_interval = fps / train_fps
    try:
        indices = sample_indices(
            total, num_frames, frame_interval=frame_interval, min_num_frames=min_num_frames
        )
    except RuntimeFailure as exc:
        raise RuntimeFailure(exc.message, file=path, fix=exc.fix) from None
    return ClipPlan(total, fps, int(first.shape[0]), int(first.shape[1]), tuple(indices))


def plan_clip(
    path: str,
    num_frames: int,
    *,
    frame_interval: float = 1.0,
    min_num_frames: int | None = None,
    train_fps: float | None = None,
) -> ClipPlan:
    """The `ClipPlan` `read_clip` would follow, from the container header and first frame only (no full decode)."""
    reader, total, fps, first = _open(path)
    del reader
    return _plan(path, total, fps, first, num_frames, frame_interval, min_num_frames, train_fps)


def read_clip_planned(
    path: str,
    num_frames: int,
    max_height: int,
    max_width: int,
    *,
    frame_interval: float = 1.0,
    min_num_frames: int | None = None,
    train_fps: float | None = None,
) -> tuple[torch.Tensor, ClipPlan]:
    """`read_clip` plus the `ClipPlan` it followed."""
    import decord

    reader, total, fps, first = _open(path)
    plan = _plan(path, total, fps, first, num_frames, frame_interval, min_num_frames, train_fps)
    indices = list(plan.indices)
    try:
        shrink = decode_size(first.shape[0], first.shape[1], max_height, max_width)
        if shrink is not None:
            del reader
            reader = decord.VideoReader(path, ctx=decord.cpu(0), height=shrink[0], width=shrink[1])
        frames = torch.from_numpy(reader.get_batch(indices).asnumpy())
    except Exception as exc:
        raise RuntimeFailure(
            f"cannot decode frames {indices[0]}..{indices[-1]}: {str(exc).splitlines()[0]}",
            file=path,
            fix="the file is truncated or corrupt; re-encode it or drop it from the dataset",
        ) from exc
    return resize_crop(frames, max_height, max_width), plan


def read_clip(
    path: str,
    num_frames: int,
    max_height: int,
    max_width: int,
    *,
    frame_interval: float = 1.0,
    min_num_frames: int | None = None,
    train_fps: float | None = None,
) -> torch.Tensor:
    """Decode, sample and crop one clip to uint8 [T, max_height, max_width, 3] (T = num_frames or a shorter 4n+1).

    `train_fps` set means MindSpeed-MM's `auto_interval`: the interval becomes fps / train_fps. Missing,
    unreadable and too-short videos raise `RuntimeFailure` naming the file.
    """
    frames, _ = read_clip_planned(
        path,
        num_frames,
        max_height,
        max_width,
        frame_interval=frame_interval,
        min_num_frames=min_num_frames,
        train_fps=train_fps,
    )
    return frames


def to_model_input(clips: torch.Tensor, mean: float = 0.5, std: float = 0.5) -> torch.Tensor:
    """uint8 [B,T,H,W,3] → float [B,3,T,H,W]: /255 then MM's norm_fun (x - mean) / std ([-1, 1] for 0.5/0.5)."""
    return clips.permute(0, 4, 1, 2, 3).float().div_(255.0).sub_(mean).div_(std)

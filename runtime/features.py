"""MindSpeed-MM's feature files: names, atomic writes, the checks that decide "done", the index, the training dataset.

Layout, as MindSpeed-MM's `get_wan_feature.py` writes it and its `FeatureDataset` + `LengthGroupedSampler`
read it: `<save_path>/features/<name>.pt` holds `{"video": latents [C,T',H',W'] (ae dtype), "prompt_ids":
text hidden states [1,L,D] (text encoder dtype), "prompt_mask": int64 [1,L]}` (the leading 1 is MM's one
caption per sample, `_extract_prompt_component` of a [B,1,L] tokenisation), and `<save_path>/data.jsonl` lists
one record per extracted clip: the dataset record plus what MM's video processor adds (`num_frames`, `fps`,
`resolution.{height,width,sample_height,sample_width}`, `start_frame_idx`, `sample_frame_index`,
`sample_num_frames`, `sample_size` = "<frames>x<height>x<width>") and `"file": "features/<name>.pt"`. MM's
sampler reads `sample_num_frames` and `sample_size` of every record (group_data groups by `sample_size`).

Three things differ from MindSpeed-MM on purpose. Names: MM uses the bare basename (`clip0000_mp4.pt`), so
`set_a/clip0000.mp4` and `set_b/clip0000.mp4` overwrite each other; here the name is the relative path made
safe plus a short hash of (dataset, relative path), so it is unique, stable across runs, and still readable.
Writes: every file goes to a hidden temp name and is `os.replace`d into place, so a killed run never leaves a
truncated `.pt` that a resume or a training run would take as done. Sizes: MM records the dynamic-resolution
size of the source in `sample_height`/`sample_width` (before its crop to max_height x max_width); here they are
the size the clip was encoded at, which groups the same tensors (every clip is encoded at max_height x max_width).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.atomic import TEMP_MARK, atomic_write_bytes
from runtime.errors import RuntimeFailure
from runtime.mmdata import Sample
from runtime.video import VAE_STRIDE_T, ClipPlan

FEATURE_KEYS = ("video", "prompt_ids", "prompt_mask")
MAX_STEM = 120  # keeps names well under the 255-byte filename limit with the hash and suffix


def feature_names(samples: Sequence[Sample]) -> list[str]:
    """`<safe relative path>-<hash>` per sample; the k-th repeat of one clip (another caption) gets `-k`."""
    seen: dict[tuple[int, str], int] = {}
    names = []
    for sample in samples:
        key = (sample.dataset, sample.rel)
        repeat = seen.get(key, 0)
        seen[key] = repeat + 1
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", sample.rel).strip("_")[-MAX_STEM:] or "clip"
        digest = hashlib.sha1(f"{sample.dataset}\0{sample.rel}".encode()).hexdigest()[:10]
        names.append(f"{stem}-{digest}" + (f"-{repeat}" if repeat else ""))
    return names


def write_feature(path: Path, feature: dict[str, torch.Tensor]) -> None:
    """torch.save `feature` to `path` atomically (each tensor is already its own compact CPU copy)."""
    atomic_write_bytes(path, lambda f: torch.save(feature, f))


def remove_temp_files(folder: Path) -> int:
    """Delete temp files a killed run left behind; returns how many. Only call while no rank is writing."""
    removed = 0
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name.startswith(".") and TEMP_MARK in entry.name and entry.is_file():
                entry.unlink()
                removed += 1
    return removed


@dataclass(frozen=True)
class Expected:
    """What a valid feature file of this run holds: latent channels and size, text length and width, dtypes."""

    channels: int
    max_frames: int
    height: int
    width: int
    text_len: int
    text_width: int
    video_dtype: torch.dtype
    text_dtype: torch.dtype

    def problem(
        self, feature: dict[str, Any], *, check_values: bool, frames: int | None = None
    ) -> str | None:
        """Why `feature` is not a valid sample of this run (None when it is).

        `check_values` also checks NaN/Inf; `frames` (the clip's sampled frame count) also checks the latent length.
        """
        missing = [k for k in FEATURE_KEYS if not isinstance(feature.get(k), torch.Tensor)]
        if missing:
            return f"missing tensors {missing}"
        video, ids, mask = (feature[k] for k in FEATURE_KEYS)
        if (
            video.dim() != 4
            or video.shape[0] != self.channels
            or not 1 <= video.shape[1] <= self.max_frames
            or tuple(video.shape[2:]) != (self.height, self.width)
        ):
            want = f"[{self.channels}, <={self.max_frames}, {self.height}, {self.width}]"
            return f"video latents have shape {list(video.shape)}, expected {want}"
        if frames is not None and video.shape[1] != latent_frames(frames):
            return f"video latents have {video.shape[1]} frames, the clip's {frames} frames give {latent_frames(frames)}"
        if tuple(ids.shape) != (1, self.text_len, self.text_width) or tuple(mask.shape) != (1, self.text_len):
            return (
                f"text features have shapes {list(ids.shape)} / {list(mask.shape)}, expected "
                f"[1, {self.text_len}, {self.text_width}] / [1, {self.text_len}]"
            )
        if video.dtype != self.video_dtype or ids.dtype != self.text_dtype or mask.dtype != torch.int64:
            return (
                f"dtypes {video.dtype}/{ids.dtype}/{mask.dtype}, expected "
                f"{self.video_dtype}/{self.text_dtype}/torch.int64"
            )
        if check_values:
            for key in ("video", "prompt_ids"):
                if not bool(torch.isfinite(feature[key]).all()):
                    return f"non-finite values (NaN/Inf) in {key}"
        return None


def load_feature(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """torch.load a feature file; missing or unreadable → `RuntimeFailure` naming it and the fix."""
    fix = "re-run feature extraction with --skip-existing (it redoes missing and damaged files only)"
    if not path.is_file():
        raise RuntimeFailure(f"feature file not found: {path}", file=str(path), fix=fix)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch.load raises several unrelated types for damaged zips/pickles
        raise RuntimeFailure(f"cannot read feature file {path}: {exc}", file=str(path), fix=fix) from exc
    if not isinstance(data, dict):
        raise RuntimeFailure(f"feature file {path} does not hold a dict", file=str(path), fix=fix)
    return data


def is_done(path: Path, expected: Expected, frames: int | None = None) -> bool:
    """--skip-existing: the file exists, loads, and has this run's keys, shapes and dtypes (and `frames`' latents)."""
    if not path.is_file():
        return False
    try:
        feature = load_feature(path, mmap=True)
    except RuntimeFailure:
        return False
    return expected.problem(feature, check_values=False, frames=frames) is None


def latent_frames(frames: int) -> int:
    """Latent length of a 4n+1-frame clip under Wan's causal VAE."""
    return (frames - 1) // VAE_STRIDE_T + 1


def index_record(
    record: dict[str, Any], plan: ClipPlan, file: str, height: int, width: int
) -> dict[str, Any]:
    """The data.jsonl record of one extracted clip: the dataset record annotated as MM's video processor does.

    Values the dataset record already has (`num_frames`, `fps`, `resolution.height/width`) are kept; missing
    ones come from the decoded clip. `height` x `width` is the size the frames were encoded at.
    """
    out = copy.deepcopy(record)
    out.setdefault("num_frames", plan.total)
    out.setdefault("fps", plan.fps)
    resolution = out.get("resolution")
    resolution = dict(resolution) if isinstance(resolution, dict) else {}
    resolution.setdefault("height", plan.height)
    resolution.setdefault("width", plan.width)
    resolution["sample_height"], resolution["sample_width"] = int(height), int(width)
    out["resolution"] = resolution
    out["start_frame_idx"] = 0  # the temporal window starts at frame 0 (runtime.video)
    out["sample_frame_index"] = [int(i) for i in plan.indices]
    out["sample_num_frames"] = len(plan.indices)
    out["sample_size"] = f"{len(plan.indices)}x{int(height)}x{int(width)}"
    out["file"] = file
    return out


class FeatureDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Training side of the format: `data_path` = data.jsonl, `data_folder` = the save_path root (as MM)."""

    def __init__(self, data_path: str, data_folder: str) -> None:
        self.data_path = Path(data_path)
        self.data_folder = Path(data_folder)
        if not self.data_path.is_file():
            raise RuntimeFailure(
                f"feature index not found: {self.data_path}",
                file=str(self.data_path),
                field="dataset_param.basic_parameters.data_path",
                fix="run feature extraction first (it writes <save_path>/data.jsonl at the end)",
            )
        self.records: list[dict[str, Any]] = []
        for number, line in enumerate(self.data_path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RuntimeFailure(
                    f"line {number} of {self.data_path} is not JSON: {exc.msg}",
                    file=str(self.data_path),
                    fix="re-run feature extraction (data.jsonl is rewritten atomically at the end)",
                ) from exc
            name = record.get("file") if isinstance(record, dict) else None
            if not isinstance(name, str):
                raise RuntimeFailure(
                    f'line {number} of {self.data_path} has no "file" entry',
                    file=str(self.data_path),
                    fix="use the data.jsonl written by feature extraction",
                )
            if not name.endswith(".pt"):
                raise RuntimeFailure(
                    f"Unsupported file format. Only .pt files are currently supported. (line {number}: {name})",
                    file=str(self.data_path),
                    fix="feature files must be the .pt files written by feature extraction",
                )
            self.records.append(record)
        if not self.records:
            raise RuntimeFailure(
                f"{self.data_path} lists no features",
                file=str(self.data_path),
                fix="re-run feature extraction; check extract_report.json for clips that failed",
            )
        first = self.records[0]["file"]
        if not (self.data_folder / first).exists() and (self.data_folder.parent / first).exists():
            raise RuntimeFailure(
                f"data_folder points at the features/ folder itself ({self.data_folder}): paths would double up",
                field="dataset_param.basic_parameters.data_folder",
                fix=f"set data_folder to {self.data_folder.parent} (the sorafeature.save_path root)",
            )

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path = self.data_folder / self.records[index]["file"]
        feature = load_feature(path)
        missing = [k for k in FEATURE_KEYS if k not in feature]
        if missing:
            raise RuntimeFailure(
                f"feature file {path} lacks {missing}",
                file=str(path),
                fix="re-run feature extraction with --skip-existing (it redoes damaged files)",
            )
        return feature

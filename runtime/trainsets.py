"""Training data for the bundled runtime: which samples each rank sees, in which order, and in what form.

Order is a pure function of (seed, consumed samples): epoch e is a seeded permutation of the dataset
(sequential when `dataloader_param.shuffle` is false), and global batch g covers samples
[g*GBS, (g+1)*GBS) of the endless stream, split like Megatron's pretraining sampler (micro batch m, DP
rank r, slot j → position m*MBS*DP + r*MBS + j). Resuming at `consumed_samples` therefore continues the
exact stream an uninterrupted run would have seen, with any number of loader workers.

Two sources: extracted features (`dataset_type: feature` → `runtime.features.FeatureDataset`) or, when
the model config says `load_video_features: false` (Wan2.2 style), raw clips decoded here and encoded
online by the trainer. Per-sample failures inside loader workers travel back as values, so the main
process raises them as a `RuntimeFailure` with the file and the fix, not as a worker traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from runtime.errors import RuntimeFailure
from runtime.mmconfig import require


@dataclass(frozen=True)
class RankSlice:
    """This rank's share of each global batch."""

    micro_batch_size: int
    grad_acc: int
    dp_size: int
    dp_rank: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_acc * self.dp_size


class StreamSampler(Sampler[int]):
    """Endless dataset indices for one rank, starting at `consumed` samples into the global stream."""

    def __init__(self, size: int, ranks: RankSlice, seed: int, consumed: int, shuffle: bool) -> None:
        self.size = size
        self.ranks = ranks
        self.seed = seed
        self.consumed = consumed
        self.shuffle = shuffle
        self._epoch = -1
        self._order: list[int] = []

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, self.size)
        if epoch != self._epoch:
            self._epoch = epoch
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._order = torch.randperm(self.size, generator=gen).tolist()
            else:
                self._order = list(range(self.size))
        return self._order[offset]

    def __iter__(self) -> Iterator[int]:
        r = self.ranks
        gbs = r.global_batch_size
        start = self.consumed
        while True:
            for micro in range(r.grad_acc):
                base = start + micro * r.micro_batch_size * r.dp_size + r.dp_rank * r.micro_batch_size
                for slot in range(r.micro_batch_size):
                    yield self._index(base + slot)
            start += gbs


class Failed:
    """A sample that could not be loaded, carried out of a loader worker as a value."""

    def __init__(self, failure: RuntimeFailure) -> None:
        self.message, self.file, self.field, self.fix = (
            failure.message,
            failure.file,
            failure.field,
            failure.fix,
        )

    def raise_(self) -> None:
        raise RuntimeFailure(self.message, file=self.file, field=self.field, fix=self.fix)


class FeatureSource(Dataset[Any]):
    """Extracted features: items {"video": latents, "prompt_ids": text hidden states}."""

    def __init__(self, data_path: str, data_folder: str) -> None:
        from runtime.features import FeatureDataset

        self.inner = FeatureDataset(data_path, data_folder)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        try:
            item = self.inner[index]
        except RuntimeFailure as exc:
            return Failed(exc)
        text = item["prompt_ids"]
        # MM's files hold [1, L, D] (one caption per sample); older runtime files [L, D]. Wan reads both as [L, D].
        return {"video": item["video"], "prompt_ids": text.reshape(-1, text.shape[-1])}


@dataclass(frozen=True)
class ClipSpec:
    num_frames: int
    max_height: int
    max_width: int
    frame_interval: float
    train_fps: float | None
    clean_text: bool


class ClipSource(Dataset[Any]):
    """Raw clips for online encoding: items {"pixels": uint8 [T,H,W,3], "caption": str}."""

    def __init__(self, data_file: str, data: dict[str, Any], seed: int) -> None:
        from runtime.mmdata import read_samples

        basic = require(data, "dataset_param.basic_parameters", data_file)
        pre = require(data, "dataset_param.preprocess_parameters", data_file)
        auto = bool(pre.get("auto_interval", True))
        methods = data["dataset_param"].get("text_preprocess_methods")
        self.spec = ClipSpec(
            num_frames=int(require(pre, "num_frames", data_file)),
            max_height=int(require(pre, "max_height", data_file)),
            max_width=int(require(pre, "max_width", data_file)),
            frame_interval=float(pre.get("frame_interval", 1)),
            train_fps=float(pre.get("train_fps", 24)) if auto else None,
            clean_text=bool(data["dataset_param"].get("enable_text_preprocessing", True))
            and methods is not None,
        )
        try:
            self.samples = read_samples(
                require(basic, "data_path", data_file), basic.get("data_storage_mode", "combine")
            )
        except RuntimeFailure as exc:
            raise RuntimeFailure(
                exc.message, file=exc.file or data_file, field=exc.field, fix=exc.fix
            ) from None
        self.seed = seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        from runtime.mmdata import whitespace_clean
        from runtime.video import read_clip

        sample = self.samples[index]
        s = self.spec
        try:
            pixels = read_clip(
                sample.path, s.num_frames, s.max_height, s.max_width,
                frame_interval=s.frame_interval, train_fps=s.train_fps,
            )  # fmt: skip
        except RuntimeFailure as exc:
            return Failed(exc)
        caption = sample.caption(self.seed)
        return {"pixels": pixels, "caption": whitespace_clean(caption) if s.clean_text else caption}


def collate(items: list[Any]) -> Any:
    """Stack one micro batch; a failed item or unequal shapes become a `Failed` for the trainer to raise."""
    for item in items:
        if isinstance(item, Failed):
            return item
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            shapes = {tuple(v.shape) for v in values}
            if len(shapes) > 1:
                return Failed(
                    RuntimeFailure(
                        f"samples of one micro batch have different {key} shapes {sorted(shapes)}",
                        field="--micro-batch-size",
                        fix="use --micro-batch-size 1, or extract every clip at the same num_frames/resolution",
                    )
                )
            out[key] = torch.stack(values)
        else:
            out[key] = values
    return out

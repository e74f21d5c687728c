"""runtime.video: MindSpeed-MM's frame sampling and centre crop, on real mp4 files decoded by decord."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.errors import RuntimeFailure
from runtime.synth import make_dataset, write_mp4
from runtime.video import crop_box, decode_size, read_clip, resize_crop, sample_indices, to_model_input


def test_sample_indices_follow_mm_temporal_plan() -> None:
    assert sample_indices(17, 17) == list(range(17))
    assert sample_indices(40, 17) == list(range(17))  # window starts at frame 0
    assert sample_indices(40, 9, frame_interval=2) == list(range(0, 18, 2))
    # MindSpeed-MM keeps a short clip when min_num_frames allows, cut to the longest 4n+1 count.
    assert sample_indices(11, 17, min_num_frames=1) == list(range(9))
    assert sample_indices(5, 17, min_num_frames=5) == list(range(5))


def test_sample_indices_refuse_short_clips_and_bad_num_frames() -> None:
    with pytest.raises(RuntimeFailure, match="too short: 12 frames"):
        sample_indices(12, 17)  # strict (drop_short_ratio >= 1): fewer than num_frames
    with pytest.raises(RuntimeFailure, match="too short"):
        sample_indices(7, 17, min_num_frames=9)
    with pytest.raises(RuntimeFailure, match="4n\\+1") as info:
        sample_indices(40, 16)
    assert info.value.field == "dataset_param.preprocess_parameters.num_frames"


def test_crop_box_matches_mm_center_crop_th_tw() -> None:
    assert crop_box(64, 64, 32, 32) == (0, 0, 64, 64)
    assert crop_box(48, 96, 32, 32) == (0, 24, 48, 48)  # wide: crop the middle columns
    assert crop_box(96, 48, 32, 64) == (36, 0, 24, 48)  # tall source, wide target
    assert decode_size(64, 64, 32, 32) is None  # not more than twice the target: no decoder resize
    assert decode_size(256, 512, 32, 32) == (64, 128)


def test_resize_crop_keeps_the_centre_and_resizes_to_target() -> None:
    frames = torch.zeros(2, 48, 96, 3, dtype=torch.uint8)
    frames[:, :, 24:72] = 200  # the centre square is bright, the sides black
    out = resize_crop(frames, 32, 32)
    assert out.shape == (2, 32, 32, 3) and out.dtype == torch.uint8
    assert int(out.min()) == 200 and int(out.max()) == 200
    upscaled = resize_crop(torch.full((1, 16, 16, 3), 7, dtype=torch.uint8), 32, 48)
    assert upscaled.shape == (1, 32, 48, 3) and int(upscaled.float().mean().round()) == 7


def test_to_model_input_is_channels_first_in_minus_one_one() -> None:
    clips = torch.tensor([0, 255], dtype=torch.uint8).view(1, 2, 1, 1, 1).expand(1, 2, 4, 4, 3)
    video = to_model_input(clips)
    assert video.shape == (1, 3, 2, 4, 4)
    assert float(video[:, :, 0].max()) == -1.0 and float(video[:, :, 1].min()) == 1.0


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    make_dataset(root, 2, frames=17, height=64, width=64)
    rng = np.random.default_rng(0)
    wide = np.zeros((17, 64, 96, 3), dtype=np.uint8)
    wide[:, :, 16:80] = (40, 200, 70)  # a green centre square between black side bands
    write_mp4(root / "wide.mp4", wide, 16)
    write_mp4(root / "big.mp4", rng.integers(0, 255, (9, 256, 256, 3), dtype=np.uint8) // 64 * 64, 16)
    write_mp4(root / "short.mp4", np.zeros((5, 32, 32, 3), dtype=np.uint8), 16)
    (root / "garbage.mp4").write_bytes(rng.integers(0, 255, 4096, dtype=np.uint8).tobytes())
    return root


def test_read_clip_decodes_real_mp4(clips: Path) -> None:
    video = read_clip(str(clips / "videos/set_a/clip0000.mp4"), 17, 64, 64)
    assert video.shape == (17, 64, 64, 3) and video.dtype == torch.uint8
    assert float(video.float().std()) > 5  # real picture content, not a blank
    half = read_clip(str(clips / "videos/set_a/clip0000.mp4"), 9, 32, 32, frame_interval=2)
    assert half.shape == (9, 32, 32, 3)


def test_read_clip_centre_crops_wide_video(clips: Path) -> None:
    video = read_clip(str(clips / "wide.mp4"), 17, 32, 32).float()
    green = torch.tensor([40.0, 200.0, 70.0])
    assert (video.mean(dim=(0, 1, 2)) - green).abs().max() < 20  # the black sides were cropped away


def test_decoder_side_resize_matches_full_decode(clips: Path) -> None:
    import decord

    path = str(clips / "big.mp4")
    fast = read_clip(path, 9, 32, 32).float()  # 256 -> 64 in the decoder, then -> 32
    full = torch.from_numpy(decord.VideoReader(path, ctx=decord.cpu(0)).get_batch(list(range(9))).asnumpy())
    reference = resize_crop(full, 32, 32).float()
    assert fast.shape == reference.shape == (9, 32, 32, 3)
    assert float((fast - reference).abs().mean()) < 12  # same picture; only the filters differ


def test_read_clip_reports_bad_videos_with_the_file(clips: Path) -> None:
    with pytest.raises(RuntimeFailure, match="cannot decode video") as info:
        read_clip(str(clips / "garbage.mp4"), 17, 32, 32)
    assert info.value.file == str(clips / "garbage.mp4")
    with pytest.raises(RuntimeFailure, match="too short: 5 frames") as info:
        read_clip(str(clips / "short.mp4"), 17, 32, 32)
    assert info.value.file == str(clips / "short.mp4")
    with pytest.raises(RuntimeFailure, match="video not found"):
        read_clip(str(clips / "missing.mp4"), 17, 32, 32)
    assert read_clip(str(clips / "short.mp4"), 17, 32, 32, min_num_frames=1).shape == (5, 32, 32, 3)

"""Synthetic inputs for the demo and the tests: tiny Wan2.1-style weights and a small video-caption dataset.

Nothing may be downloaded, so both are made here from configs: the weights are a `WanPipeline` saved in the
diffusers directory layout (transformer, vae, text_encoder, tokenizer, scheduler) with a BPE tokenizer
trained offline on the captions' words; the dataset is real H.264 mp4 files of coloured shapes moving
across a background, with captions that say what moves where, in MindSpeed-MM's raw-dataset `data.json`
format. Two folders reuse the same file names on purpose: feature names must not collide.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 200, 70),
    "blue": (50, 90, 230),
    "yellow": (235, 215, 40),
    "white": (245, 245, 245),
    "purple": (150, 60, 200),
}
BACKGROUNDS = {"black": (10, 10, 10), "grey": (110, 110, 110), "navy": (20, 30, 80)}
SHAPES = ("square", "circle", "bar")
MOTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
SPEEDS = {"slowly": 1, "quickly": 3}


@dataclass(frozen=True)
class TinyWanConfig:
    """Sizes of the tiny model; `text_dim` is the text encoder's width, `z_dim` the VAE's latent channels."""

    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 64
    freq_dim: int = 32
    text_dim: int = 32
    z_dim: int = 16
    vae_base_dim: int = 16
    text_layers: int = 2
    vocab_size: int = 256
    text_len: int = 32


def corpus() -> list[str]:
    """Every word a caption can use, so the trained tokenizer never falls back to <unk>."""
    words = [*COLOURS, *BACKGROUNDS, *SHAPES, *MOTIONS, *SPEEDS, "a", "on", "moving", "background", "the"]
    return [" ".join(words), *(f"a {c} {s} moving {m}" for c in COLOURS for s in SHAPES for m in MOTIONS)]


def build_tiny_wan(out: Path, config: TinyWanConfig | None = None, *, seed: int = 0) -> Path:
    """Write a tiny Wan2.1 t2v pipeline in the diffusers layout to `out` (created); returns `out`."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    cfg = config or TinyWanConfig()
    torch.manual_seed(seed)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=cfg.text_len,
    )
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=cfg.vocab_size,
            d_model=cfg.text_dim,
            d_kv=8,
            d_ff=2 * cfg.text_dim,
            num_layers=cfg.text_layers,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            feed_forward_proj="gated-gelu",
        )
    )
    vae = AutoencoderKLWan(
        base_dim=cfg.vae_base_dim,
        z_dim=cfg.z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * cfg.z_dim,
        latents_std=[1.0] * cfg.z_dim,
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.head_dim,
        in_channels=cfg.z_dim,
        out_channels=cfg.z_dim,
        text_dim=cfg.text_dim,
        freq_dim=cfg.freq_dim,
        ffn_dim=cfg.ffn_dim,
        num_layers=cfg.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
    )
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)  # type: ignore[attr-defined]  # diffusers types miss it
    return out


@dataclass(frozen=True)
class Clip:
    path: str
    cap: str
    num_frames: int
    fps: int
    height: int
    width: int


def _frames(rng: random.Random, frames: int, height: int, width: int) -> tuple[np.ndarray, str]:
    colour, shape, motion, speed, bg = (
        rng.choice(list(COLOURS)),
        rng.choice(SHAPES),
        rng.choice(list(MOTIONS)),
        rng.choice(list(SPEEDS)),
        rng.choice(list(BACKGROUNDS)),
    )
    size = max(4, min(height, width) // 4)
    dx, dy = MOTIONS[motion]
    step = SPEEDS[speed]
    x0, y0 = rng.randrange(0, width - size), rng.randrange(0, height - size)
    yy, xx = np.mgrid[0:height, 0:width]
    video = np.empty((frames, height, width, 3), dtype=np.uint8)
    for t in range(frames):
        x = (x0 + dx * step * t) % (width - size)
        y = (y0 + dy * step * t) % (height - size)
        if shape == "circle":
            r = size / 2
            mask = (xx - x - r) ** 2 + (yy - y - r) ** 2 <= r * r
        elif shape == "bar":
            mask = (xx >= x) & (xx < x + size // 2) & (yy >= y) & (yy < y + size * 2)
        else:
            mask = (xx >= x) & (xx < x + size) & (yy >= y) & (yy < y + size)
        video[t] = BACKGROUNDS[bg]
        video[t][mask] = COLOURS[colour]
    return video, f"a {colour} {shape} moving {motion} {speed} on a {bg} background"


def write_mp4(path: Path, frames: np.ndarray, fps: int) -> None:
    """H.264 mp4 (yuv420p) of uint8 frames shaped (T, H, W, 3), written to a temp name then renamed."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    tmp.replace(path)


def make_dataset(
    out: Path,
    count: int = 8,
    *,
    frames: int = 17,
    height: int = 64,
    width: int = 64,
    fps: int = 16,
    seed: int = 0,
    sidecars: bool = False,
) -> Path:
    """Write `count` clips under `out/videos/{set_a,set_b}/clipNNNN.mp4` and `out/data.json`; returns the json.
    With `sidecars`, each clip's caption goes to `clipNNNN.txt` beside it instead and no index is written
    (what a user's folder looks like: `mm-agent dataset` builds the index); returns `out`.

    Clips alternate between the two folders with the same numbering, so basenames repeat across folders.
    """
    rng = random.Random(seed)
    clips: list[Clip] = []
    for i in range(count):
        video, cap = _frames(rng, frames, height, width)
        rel = f"videos/set_{'ab'[i % 2]}/clip{i // 2:04d}.mp4"
        write_mp4(out / rel, video, fps)
        if sidecars:
            (out / rel).with_suffix(".txt").write_text(cap + "\n", encoding="utf-8")
        clips.append(Clip(rel, cap, frames, fps, height, width))
    if sidecars:
        return out
    records = [
        {
            "path": c.path,
            "cap": c.cap,
            "num_frames": c.num_frames,
            "fps": c.fps,
            "resolution": {"height": c.height, "width": c.width},
        }
        for c in clips
    ]
    index = out / "data.json"
    index.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return index


def write_extract_configs(
    out: Path,
    *,
    dataset_dir: Path,
    weights: Path,
    save_path: Path,
    num_frames: int = 17,
    height: int = 64,
    width: int = 64,
    text_len: int = 32,
    preprocess: dict[str, object] | None = None,
) -> dict[str, Path]:
    """MindSpeed-MM's feature-extraction configs (data.json, data.txt, model_t2v.json, tools.json) in `out`.

    The structure is MindSpeed-MM's `examples/wan2.1/feature_extract` one, with the sizes, paths and the
    `preprocess` overrides given; returns {"data", "model", "tool", "data_txt"} paths.
    """
    out.mkdir(parents=True, exist_ok=True)
    data_txt = out / "data.txt"
    data_txt.write_text(f"{dataset_dir},{dataset_dir / 'data.json'}\n", encoding="utf-8")
    resize = {
        "transform_size": "auto",
        "interpolation_mode": "bilinear",
        "antialias": True,
        "mode": "shortside",
    }
    crop = {"use_short_edge": False, "top_crop": False, "align_corners": False, "antialias": True}
    pre: dict[str, object] = {
        "video_processor_type": "OpensoraplanVideoProcessor",
        "video_reader_type": "DecordVideo",
        "num_frames": num_frames,
        "min_num_frames": 1,
        "frame_interval": 1,
        "auto_interval": False,
        "max_height": height,
        "max_width": width,
        "train_fps": 16,
        "drop_short_ratio": 0.0,
        "train_pipeline": {
            "video_and_first_frame": [
                {"trans_type": "ResizeVideo", "param": resize},
                {"trans_type": "ToTensorVideo"},
            ],
            "video_only": [
                {"trans_type": "CenterCropResizeVideo", "param": {**crop, "transform_size": "auto"}},
                {"trans_type": "norm_fun", "param": {"mean": 0.5, "std": 0.5}},
            ],
        },
        **(preprocess or {}),
    }
    data = {
        "dataset_param": {
            "dataset_type": "t2v",
            "basic_parameters": {"data_path": str(data_txt), "data_storage_mode": "combine"},
            "preprocess_parameters": pre,
            "use_text_processer": True,
            "enable_text_preprocessing": True,
            "text_preprocess_methods": {"method": "whitespace_clean"},
            "tokenizer_config": {
                "autotokenizer_name": "AutoTokenizer",
                "hub_backend": "hf",
                "from_pretrained": str(weights / "tokenizer"),
                "model_max_length": text_len,
            },
        },
        "dataloader_param": {"dataloader_mode": "sampler", "shuffle": False, "drop_last": False},
    }
    model = {
        "ae": {
            "model_id": "wan_video_vae",
            "from_pretrained": str(weights / "vae"),
            "dtype": "fp32",
            "enable_tiling": False,
            "norm_latents": True,
            "norm_mode": "channel_specified_shift_scale",
            "do_sample": False,
        },
        "text_encoder": {
            "model_id": "UMT5",
            "dtype": "fp32",
            "hub_backend": "hf",
            "from_pretrained": str(weights / "text_encoder"),
        },
    }
    paths = {"data": out / "data.json", "model": out / "model_t2v.json", "tool": out / "tools.json"}
    paths["data"].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    paths["model"].write_text(json.dumps(model, indent=2) + "\n", encoding="utf-8")
    paths["tool"].write_text(
        json.dumps({"sorafeature": {"save_path": str(save_path)}}) + "\n", encoding="utf-8"
    )
    return {**paths, "data_txt": data_txt}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.synth", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("weights", help="tiny Wan2.1 t2v weights in the diffusers layout")
    w.add_argument("out", type=Path)
    w.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("dataset", help="mp4 clips of moving shapes + data.json")
    d.add_argument("out", type=Path)
    d.add_argument("--count", type=int, default=8)
    d.add_argument("--frames", type=int, default=17)
    d.add_argument("--height", type=int, default=64)
    d.add_argument("--width", type=int, default=64)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--sidecars", action="store_true", help="captions as clip.txt files, no data.json")
    c = sub.add_parser("configs", help="MindSpeed-MM feature-extraction configs for a dataset + weights")
    c.add_argument("out", type=Path)
    c.add_argument("--dataset", type=Path, required=True, help="folder holding data.json (from `dataset`)")
    c.add_argument("--weights", type=Path, required=True, help="diffusers-layout weights (from `weights`)")
    c.add_argument("--save-path", type=Path, required=True, help="sorafeature.save_path (features go here)")
    c.add_argument("--frames", type=int, default=17)
    c.add_argument("--height", type=int, default=64)
    c.add_argument("--width", type=int, default=64)
    vw = sub.add_parser("vlm-weights", help="tiny Qwen2.5-VL weights + processor in the Hugging Face layout")
    vw.add_argument("out", type=Path)
    vw.add_argument("--seed", type=int, default=0)
    vd = sub.add_parser("vlm-dataset", help="PNGs of coloured shapes + LLaVA train.json / heldout.json")
    vd.add_argument("out", type=Path)
    vd.add_argument("--count", type=int, default=None, help="training images (2 questions each)")
    vd.add_argument("--heldout", type=int, default=None, help="held-out images, never in train")
    vd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.what.startswith("vlm-"):
        from runtime import synth_vlm

        if args.what == "vlm-weights":
            print(synth_vlm.build_tiny_qwen25vl(args.out, seed=args.seed))
        else:
            made = synth_vlm.make_vlm_dataset(
                args.out,
                synth_vlm.TRAIN_IMAGES if args.count is None else args.count,
                synth_vlm.HELDOUT_IMAGES if args.heldout is None else args.heldout,
                args.seed,
            )
            print(f"{made.train}\n{made.heldout}")
    elif args.what == "weights":
        print(build_tiny_wan(args.out, seed=args.seed))
    elif args.what == "configs":
        written = write_extract_configs(
            args.out,
            dataset_dir=args.dataset.resolve(),
            weights=args.weights.resolve(),
            save_path=args.save_path.resolve(),
            num_frames=args.frames,
            height=args.height,
            width=args.width,
        )
        print("\n".join(str(p) for p in written.values()))
    else:
        print(
            make_dataset(
                args.out,
                args.count,
                frames=args.frames,
                height=args.height,
                width=args.width,
                seed=args.seed,
                sidecars=args.sidecars,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

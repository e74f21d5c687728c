"""A tiny Qwen2.5-VL Hugging Face folder and small MLLM datasets for the preprocessing tests (`runtime.vlmdata`).

The model folder is the demo's (`runtime.synth_vlm.build_tiny_qwen25vl`): what MindSpeed-MM's `load_tokenizer`
reads (config.json, a Qwen2 tokenizer with Qwen2.5-VL's special tokens, preprocessor_config.json with small pixel
bounds, so images make a handful of tokens), built offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def tiny_qwen25vl(out: Path) -> Path:
    """A tiny Qwen2.5-VL folder at `out`: weights, config.json, tokenizer, preprocessor_config.json."""
    from runtime.synth_vlm import build_tiny_qwen25vl

    return build_tiny_qwen25vl(out, seed=0)


def write_image(path: Path, size: tuple[int, int], colour: tuple[int, int, int], mode: str = "RGB") -> None:
    """A flat-colour image with a darker square in it (so patches differ), saved by extension."""
    from PIL import Image, ImageDraw

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour)
    w, h = size
    ImageDraw.Draw(image).rectangle((w // 4, h // 4, w // 2, h // 2), fill=tuple(c // 3 for c in colour))
    image.convert(mode).save(path)


def data_config(
    path: Path,
    *,
    model: str,
    dataset: str,
    dataset_dir: str,
    attr: dict[str, Any] | None = None,
    basic: dict[str, Any] | None = None,
    pre: dict[str, Any] | None = None,
) -> Path:
    """MindSpeed-MM's examples/qwen2.5vl/data_3b.json with the given paths and overrides."""
    cfg: dict[str, Any] = {
        "dataset_param": {
            "dataset_type": "huggingface",
            "preprocess_parameters": {
                "model_name_or_path": model,
                "use_fast_tokenizer": True,
                "split_special_tokens": False,
                "image_max_pixels": 262144,
                "image_min_pixels": 0,
                "video_max_pixels": 16384,
                "video_min_pixels": 0,
                "video_fps": 2.0,
                "video_maxlen": 64,
                **(pre or {}),
            },
            "basic_parameters": {
                "template": "qwen2vl",
                "dataset_dir": dataset_dir,
                "dataset": dataset,
                "cache_dir": "./data/cache_dir",
                "train_on_prompt": False,
                "mask_history": False,
                "preprocessing_batch_size": 1000,
                "preprocessing_num_workers": None,
                "max_samples": None,
                "tool_format": None,
                **(basic or {}),
            },
            "attr": {
                "system": None,
                "images": "images",
                "videos": None,
                "messages": "messages",
                "role_tag": "role",
                "content_tag": "content",
                "user_tag": "user",
                "assistant_tag": "assistant",
                "observation_tag": None,
                "function_tag": None,
                "system_tag": None,
                **(attr or {}),
            },
        },
        "dataloader_param": {
            "dataloader_mode": "sampler",
            "drop_last": True,
            "sampler_type": "BaseRandomBatchSampler",
            "collate_param": {"model_name": "qwen2vl", "ignore_pad_token_for_loss": True},
            "pin_memory": True,
            "shuffle": True,
        },
    }
    path.write_text(json.dumps(cfg, indent=2))
    return path


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def shapes_dataset(root: Path) -> list[dict[str, Any]]:
    """Records covering the cases the preprocessing must get right: one image, two images, two turns with the
    image in the second, a text-only record, a grey (mode L) image, a tiny image (sides raised to 28), a large one
    (shrunk under image_max_pixels), a system turn (read when attr.system_tag is "system")."""
    write_image(root / "img" / "red.png", (64, 48), (220, 30, 30))
    write_image(root / "img" / "blue.png", (100, 100), (30, 30, 220))
    write_image(root / "img" / "grey.png", (70, 40), (120, 120, 120), mode="L")
    write_image(root / "img" / "tiny.png", (20, 12), (30, 200, 30))
    write_image(root / "img" / "large.jpg", (300, 200), (200, 200, 30))
    return [
        {
            "messages": [turn("user", "<image>What colour is the shape?"), turn("assistant", "red")],
            "images": ["img/red.png"],
        },
        {
            "messages": [
                turn("user", "<image>\n<image>\nCompare the two pictures."),
                turn("assistant", "The shape is a red circle. It is blue."),
            ],
            "images": ["img/red.png", "img/blue.png"],
        },
        {
            "messages": [
                turn("user", "What shape is it?"),
                turn("assistant", "a square"),
                turn("user", "<image>What colour is the shape?"),
                turn("assistant", "blue"),
            ],
            "images": ["img/blue.png"],
        },
        {"messages": [turn("user", "What colour is red?"), turn("assistant", "red")], "images": []},
        {
            "messages": [turn("user", "<image>What colour?"), turn("assistant", "grey")],
            "images": ["img/grey.png"],
        },
        {
            "messages": [turn("user", "<image>What colour?"), turn("assistant", "green")],
            "images": ["img/tiny.png"],
        },
        {
            "messages": [turn("user", "<image>What colour?"), turn("assistant", "yellow")],
            "images": ["img/large.jpg"],
        },
        {
            "messages": [
                turn("system", "Answer with one word."),
                turn("user", "<image>What shape is it?"),
                turn("assistant", "square"),
            ],
            "images": ["img/blue.png"],
        },
    ]

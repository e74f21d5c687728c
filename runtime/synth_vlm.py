"""Synthetic inputs for the VLM demo and tests: tiny Qwen2.5-VL weights and a coloured-shapes question set.

Nothing may be downloaded, so both are made here. The weights are transformers' real
`Qwen2_5_VLForConditionalGeneration` built from a tiny config that keeps the 3B model's structure (GQA in the
LLM, tied embeddings, a windowed ViT with full-attention blocks, 14-pixel patches merged 2x2, 2-frame temporal
patches), saved in the Hugging Face layout beside a processor: a byte-level BPE tokenizer trained offline on
the questions' words plus Qwen2.5-VL's special tokens (their ids are the ones the config names), Qwen2.5-VL's
own chat template and a `Qwen2VLImageProcessor` whose pixel bounds keep a 112x112 image 64 patches (16
tokens after merging). The dataset is PNG images of one coloured shape on a background with two questions each
("What colour is the shape?", "What shape is it?") in LLaVA form, as `train.json` plus a `heldout.json` whose
images are never in train, so accuracy on it measures learning rather than recall.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from runtime.synth import BACKGROUNDS, COLOURS, SHAPES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Qwen2.5-VL's added tokens in the hub tokenizer's order (its ids 151643..151664); the tiny vocab keeps the
# order and puts them after the trained BPE vocabulary, as the real one does.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
NOT_SPECIAL = ("<tool_call>", "</tool_call>")  # added but not special in the hub tokenizer (kept in decode)

# Qwen2.5-VL-3B-Instruct's chat_template.json, verbatim (what MindSpeed-MM's `qwen2vl` template also renders:
# a default system turn, `<|vision_start|><|image_pad|><|vision_end|>` per image).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2's pre-tokenizer split (tokenizer.json of every Qwen2/2.5 model), before the byte-level mapping.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QUESTIONS = {"colour": "What colour is the shape?", "shape": "What shape is it?"}
SYSTEM_PROMPT = "You are a helpful assistant."

IMAGE_SIZE = 112  # pixels a side: 8x8 patches of 14, 2x2 merged -> 16 image tokens
SHAPE_SIDE = 1 / 3  # of the image side (a bar is half as wide and twice as tall)
VLM_BACKGROUNDS = tuple(BACKGROUNDS)  # backgrounds drawn from
MIN_PIXELS = 28 * 28 * 4  # the processor's bounds: small images stay a handful of patches
MAX_PIXELS = 112 * 112
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
# The demo's defaults, measured (helper B, issue 27) with a plain transformers loop on 2 CPU threads
# (`torch.set_num_threads(2)`): the default TinyQwenVLConfig, AdamW (no weight decay, betas 0.9/0.999), clip-grad
# 1.0, lr warmed up linearly over WARMUP_ITERATIONS then cosine-decayed to MIN_LR, the loss on the answer tokens
# only (`red<|im_end|>\n`, as MindSpeed-MM's qwen2vl template labels it), batches drawn from a seeded shuffle;
# held-out exact match over the 48 held-out questions (greedy, 4 new tokens), before -> after training:
#   112 px, 512 images, 1000 iters, lr 2e-3 cosine: seeds 0/1/2/3 -> 0.0 -> 0.646/0.667/0.646/0.646 (colour
#     0.79-1.0, shape 0.29-0.5: chance is 0.33), final loss 0.17-0.20 from 6.0; 24.7-31 ms per iteration
#     (25-31 s of training) on a machine shared with other jobs;
#   56 px (4 image tokens), 96 images: seeds 0/1/2 -> 0.73/0.65/0.38 after 1000 iters at lr 3e-3 (constant
#     after warm-up), 0.25 with cosine decay at seed 2: memorises the 96 images (train loss 0.02 with lr 1e-3 x
#     2000 at 0.52 held-out); 1024 images at 56 px: 0.67 at seed 0, 0.44 at seed 1 (underfits blue/purple/red);
#   84 px, 512 images, seed 1: 0.42; hidden 128 (lr 2e-3, 500 iters): 0.10; bigger shapes (1/2 side): no better.
# More image tokens (16 at 112 px) is what made learning reliable; colour is learnt, shape stays near chance.
TRAIN_IMAGES = 512  # x2 questions = 1024 training records
HELDOUT_IMAGES = 24  # x2 = 48 held-out questions, on images never in train
ITERATIONS = 1000
BATCH_SIZE = 16  # global batch (samples per optimizer step)
LEARNING_RATE = 2e-3
MIN_LR = 2e-4  # cosine decay's floor (0.1 x LEARNING_RATE)
WARMUP_ITERATIONS = 10
# Qwen2.5-VL-3B-Instruct's preprocessor_config.json with small pixel bounds
PREPROCESSOR = {
    "min_pixels": MIN_PIXELS,
    "max_pixels": MAX_PIXELS,
    "patch_size": PATCH_SIZE,
    "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    "merge_size": MERGE_SIZE,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


@dataclass(frozen=True)
class TinyQwenVLConfig:
    """Sizes of the tiny model. The LLM keeps the 3B's head layout (query heads in KV groups: 16 q / 2 kv
    there, 4 / 2 here) and tied embeddings; `mrope_section` must sum to head_dim / 2."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_intermediate: int = 64
    vision_heads: int = 2
    bpe_vocab: int = 448  # trained BPE entries (256 bytes + merges); the special tokens come after
    max_positions: int = 512
    # The weights' init std. transformers' 0.02 leaves a 64-wide random network passing almost nothing on, so a
    # LoRA adapter on it cannot learn (measured: grad norm 0.005, loss 6.0 -> 4.9 after 300 steps of 16 at lr
    # 2e-3); at 0.3 an adapter's loss falls 8.5 -> 0.26 and a full fine-tune's (ViT frozen) 8.5 -> 0.26 in 300
    # steps: the tiny model then behaves like the trained base a real fine-tune starts from.
    initializer_range: float = 0.3


def corpus() -> list[str]:
    """Every text the tokenizer will see (template words, questions, answers), so common words are single
    tokens: an answer is then one token plus `<|im_end|>`, which a tiny model learns quickly."""
    answers = [*COLOURS, *SHAPES]
    lines = [
        SYSTEM_PROMPT,
        "system\n",
        "user\n",
        "assistant\n",
        *QUESTIONS.values(),
        "Picture 1: ",
        "Video 1: ",
    ]
    return lines * 4 + [f"{a}\n" for a in answers] * 8 + [f" {a}" for a in answers] * 4 + answers * 8


def _tokenizer(cfg: TinyQwenVLConfig) -> PreTrainedTokenizerBase:
    """Qwen2's byte-level BPE (its split regex, NFC, byte-level decoding) trained on `corpus()`, then the
    special tokens appended in the hub's order."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import Qwen2TokenizerFast  # type: ignore[attr-defined,unused-ignore]  # (5.x: an alias)

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.bpe_vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NOT_SPECIAL])
    tokenizer: PreTrainedTokenizerBase = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=cfg.max_positions,
        chat_template=CHAT_TEMPLATE,
    )
    return tokenizer


def build_tiny_qwen25vl(out: Path, config: TinyQwenVLConfig | None = None, *, seed: int = 0) -> Path:
    """Write a tiny Qwen2.5-VL (weights, config, tokenizer, processor, generation config) to `out` (created) in
    the Hugging Face layout `AutoProcessor` / `Qwen2_5_VLForConditionalGeneration.from_pretrained` read and
    mm-agent's `Qwen2_5_VLConverter` converts; returns `out`."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
    )

    cfg = config or TinyQwenVLConfig()
    tokenizer = _tokenizer(cfg)
    ids = {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS}  # type: ignore[arg-type,unused-ignore]
    vocab = -(-len(tokenizer) // 64) * 64  # padded like the real 151936 > 151665 entries
    head_dim = cfg.hidden_size // cfg.num_heads
    if 2 * sum(cfg.mrope_section) != head_dim:
        raise ValueError(f"mrope_section {cfg.mrope_section} must sum to head_dim/2 = {head_dim // 2}")
    text = {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": cfg.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": list(cfg.mrope_section)},
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "use_sliding_window": False,
        "attention_dropout": 0.0,
    }
    vision = {
        "depth": cfg.vision_depth,
        "hidden_size": cfg.vision_hidden,
        "intermediate_size": cfg.vision_intermediate,
        "num_heads": cfg.vision_heads,
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "window_size": 112,
        "out_hidden_size": cfg.hidden_size,
        "fullatt_block_indexes": [cfg.vision_depth - 1],  # the 3B: every 8th block of 32, the last one too
        "tokens_per_second": 2,
    }
    hf_config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    for part in (hf_config, hf_config.text_config, hf_config.vision_config):
        part.initializer_range = cfg.initializer_range  # type: ignore[union-attr]
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(hf_config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # the hub repo's processor files: preprocessor_config.json names the processor class, the template is in
    # chat_template.json (transformers derives the video processor from the image one)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n", encoding="utf-8"
    )
    return out


# ---------------------------------------------------------------------------------------------------------
# dataset


@dataclass(frozen=True)
class VlmDataset:
    """What `make_vlm_dataset` wrote: the two LLaVA-form files (image paths relative to `root`) and counts."""

    root: Path
    train: Path
    heldout: Path
    train_records: int
    heldout_records: int


def _image(rng: random.Random, size: int, taken: set[tuple[object, ...]]) -> tuple[np.ndarray, str, str]:
    """One image never drawn before (colour, shape, background and position all equal count as the same)."""
    side = max(6, int(size * SHAPE_SIDE))
    while True:
        colour, shape, bg = rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.choice(list(VLM_BACKGROUNDS))
        w, h = (side // 2, min(size - 1, side * 2)) if shape == "bar" else (side, side)
        x, y = rng.randrange(0, size - w + 1), rng.randrange(0, size - h + 1)
        key = (colour, shape, bg, x, y)
        if key not in taken:
            taken.add(key)
            break
    yy, xx = np.mgrid[0:size, 0:size]
    if shape == "circle":
        r = side / 2
        mask = (xx - x - r + 0.5) ** 2 + (yy - y - r + 0.5) ** 2 <= r * r
    else:
        mask = (xx >= x) & (xx < x + w) & (yy >= y) & (yy < y + h)
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = BACKGROUNDS[bg]
    img[mask] = COLOURS[colour]
    return img, colour, shape


def _records(prefix: str, index: int, rel: str, colour: str, shape: str) -> list[dict[str, object]]:
    answers = {"colour": colour, "shape": shape}
    return [
        {
            "id": f"{prefix}{index:04d}-{kind}",
            "image": rel,
            "conversations": [
                {"from": "human", "value": f"<image>\n{question}"},
                {"from": "gpt", "value": answers[kind]},
            ],
        }
        for kind, question in QUESTIONS.items()
    ]


def make_vlm_dataset(
    out: Path,
    count: int = TRAIN_IMAGES,
    heldout: int = HELDOUT_IMAGES,
    seed: int = 0,
    *,
    size: int = IMAGE_SIZE,
) -> VlmDataset:
    """Write `count` training and `heldout` held-out PNGs under `out/images/`, and `out/train.json` /
    `out/heldout.json` with two questions per image (its colour, its shape) in LLaVA form; returns the paths.

    Held-out images are drawn from the same distribution but are never equal to a training image, and
    `count`/`heldout` are images: each file holds twice as many records."""
    from PIL import Image

    if count < 1 or heldout < 0:
        raise ValueError("count must be >= 1 and heldout >= 0")
    rng = random.Random(seed)
    taken: set[tuple[object, ...]] = set()
    (out / "images").mkdir(parents=True, exist_ok=True)
    written: dict[str, list[dict[str, object]]] = {"train": [], "heldout": []}
    for split, n in (("train", count), ("heldout", heldout)):
        for i in range(n):
            img, colour, shape = _image(rng, size, taken)
            rel = f"images/{split}_{i:04d}.png"
            Image.fromarray(img).save(out / rel)
            written[split] += _records(f"{split}-", i, rel, colour, shape)
    paths = {}
    for split, records in written.items():
        paths[split] = out / f"{split}.json"
        paths[split].write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return VlmDataset(out, paths["train"], paths["heldout"], len(written["train"]), len(written["heldout"]))

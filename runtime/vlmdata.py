"""MindSpeed-MM's MLLM preprocessing for Qwen2.5-VL, so the bundled runtime trains on exactly the tokens, labels
and image tensors a MindSpeed-MM job would (issue 27, item 2).

What MindSpeed-MM 26.0.0 does with a `dataset_type: huggingface` data config (`data/datasets/qwen2vl_dataset.py`
`get_qwen2vl_dataset`, and what it calls in `data/data_utils/func_utils/`), reproduced here over transformers'
own tokenizer and image processor:

- records: every file of `basic_parameters.dataset` (comma-separated, JSON list or JSON lines, the first
  `max_samples`), read through the sharegpt converter's rules (`convert.py` `SharegptDatasetConverter`): the
  `attr` names the messages/images keys and the role names; a first turn with `system_tag` is the system prompt,
  else the record's `attr.system` key; an image path is joined onto `dataset_dir` when that file exists, else used
  as written (as MindSpeed-MM does, relative to the working directory);
- the `qwen2vl` template (`template.py`): `<|im_start|>system\\n…<|im_end|>\\n` (default system "You are a helpful
  assistant."), user `<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`, assistant `…<|im_end|>\\n`, each
  piece tokenised on its own with `add_special_tokens=False`; EOS replaced by `<|im_end|>`, pad = EOS when the
  tokenizer has none;
- the `qwen2_vl` plugin (`mm_plugin.py` `Qwen2VLPlugin`): each image opened, shrunk (NEAREST) below
  `image_max_pixels` / grown above `image_min_pixels`, made RGB, sides under 28 raised to 28, extreme aspect
  ratios clipped; the image processor gives `pixel_values` and `image_grid_thw`; each `<image>` becomes
  `<|vision_start|>` + `grid.prod() // merge_size**2` × `<|image_pad|>` + `<|vision_end|>`;
- labels (`SupervisedDatasetProcessor`): per (prompt, answer) turn the prompt is -100 unless `train_on_prompt`;
  with `mask_history` only the last answer is trained and turns are kept last-first under the cutoff; the cutoff is
  the job's `--seq-length` (`get_qwen2vl_dataset` sets `cutoff_len = args.seq_length`), shared out per turn by
  `infer_seqlen`;
- batches (`dataloader/data_collator.py` `DataCollatorForQwen2vl` → `MultiModalDataCollatorForSeq2Seq`): right
  padding to a multiple of 8, labels padded with -100 (`ignore_pad_token_for_loss`), the batch's images processed
  together (concatenated patches, one grid row per image); a batch without any image gets a 64×64 white image's
  tokens appended to its first sample under attention mask 0, so every rank runs the vision tower (FSDP).

Where this differs on purpose: a record MindSpeed-MM would skip with a warning (roles out of order, an odd turn
count, an unreadable or missing image) or train on silently (an empty answer, a cutoff that cuts image tokens,
which then fails inside the model) is refused here with a `RuntimeFailure` naming the file, the record and the
field: a rehearsal should stop at the bad record, not train on less than the user gave. Videos and audio (which the
stock Qwen2.5-VL configs do not read) are refused with a fix.

The image processor comes from `AutoImageProcessor` (the processor `AutoProcessor` would build around it; the
tokenizer comes from `AutoTokenizer` in both, as MindSpeed-MM's `load_tokenizer` replaces the processor's own):
with transformers ≥ 5 and no torchvision, `AutoProcessor` cannot build Qwen2.5-VL's video processor at all, while
its image processor falls back to the PIL backend.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from runtime.errors import RuntimeFailure

IGNORE_INDEX = -100  # convert.py / mm_plugin.py IGNORE_INDEX
PAD_MULTIPLE = 8  # DataCollatorForQwen2vl: pad_to_multiple_of=8
# mm_plugin.py reads the placeholders from these variables at import, with these defaults
IMAGE_PLACEHOLDER = os.getenv("IMAGE_PLACEHOLDER", "<image>")
VIDEO_PLACEHOLDER = os.getenv("VIDEO_PLACEHOLDER", "<video>")
AUDIO_PLACEHOLDER = os.getenv("AUDIO_PLACEHOLDER", "<audio>")

# the `qwen2vl` template (template.py) and the qwen2_vl plugin's tokens
_CONTENT = "{{content}}"
SYSTEM_SLOT = "<|im_start|>system\n{{content}}<|im_end|>\n"
ROLE_SLOTS = {
    "user": "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",
    "assistant": "{{content}}<|im_end|>\n",
    "observation": "<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n",
    "function": "{{content}}",  # qwen2vl registers no function formatter: the default "{{content}}"
}
DEFAULT_SYSTEM = "You are a helpful assistant."
EOS_TOKEN = "<|im_end|>"  # stop_words[0], replace_eos=True
VISION_START, VISION_END, IMAGE_TOKEN = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
FAKE_IMAGE_SIZE = 64  # the collator's stand-in image for a batch without images
_MAX_SIDE_RATIO = 200

# the fields of MindSpeed-MM's dataclasses each config block is splatted into (an unknown key is a TypeError there)
_PROCESSOR_FIELDS = (  # ProcessorArguments (model_args.py)
    "model_name_or_path use_fast_tokenizer split_special_tokens image_resolution video_resolution image_max_pixels "
    "image_min_pixels video_max_pixels video_min_pixels video_fps video_maxlen image_do_pan_and_scan "
    "crop_to_patches use_audio_in_video audio_sampling_rate trust_remote_code fix_mistral_regex"
)
_BASIC_FIELDS = (  # DataArguments (convert.py)
    "cache_dir template enable_thinking dataset_dir dataset cutoff_len train_on_prompt mask_history streaming "
    "overwrite_cache preprocessing_batch_size preprocessing_num_workers max_samples tool_format val_dataset "
    "val_max_samples val_rate packing neat_packing preprocess_on_fly async_preprocess use_pmcc_data"
    " async_preprocess_buffer_size"  # (26.1.0 on)
)
_PROCESSOR_KEYS, _BASIC_KEYS = frozenset(_PROCESSOR_FIELDS.split()), frozenset(_BASIC_FIELDS.split())
_ATTR_DEFAULTS: dict[str, Any] = {  # DatasetAttr's fields and defaults
    "packing": False,
    "ranking": False,
    "pretrain": False,
    "system": None,
    "images": None,
    "videos": None,
    "audios": None,
    "prompt": None,
    "query": None,
    "response": None,
    "history": None,
    "messages": "conversations",
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
    "chosen": None,
    "rejected": None,
    "formatting": "sharegpt",
}
_PROCESSOR_DEFAULTS = {"image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32}  # ProcessorArguments
DEFAULT_CUTOFF = 1024  # DataArguments.cutoff_len (and the stock Qwen2.5-VL scripts' --seq-length)


@dataclass(frozen=True)
class DataSettings:
    """What a MindSpeed-MM data config asks of the preprocessing, its paths resolved as MindSpeed-MM resolves them
    (relative to the working directory the job runs in)."""

    file: str
    model: Path
    use_fast: bool
    split_special_tokens: bool
    image_max_pixels: int
    image_min_pixels: int
    datasets: tuple[Path, ...]
    dataset_dir: Path
    train_on_prompt: bool
    mask_history: bool
    max_samples: int | None
    cutoff_len: int
    attr: dict[str, Any]
    ignore_pad_token_for_loss: bool


@dataclass
class Example:
    """One record after the sharegpt converter: system prompt, (role, content) turns, image files."""

    where: str  # "record N of FILE" for messages
    file: str
    index: int
    system: str
    turns: list[tuple[str, str]]
    images: list[Path]
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)


def _fail(
    message: str, *, file: str | None, field: str | None = None, fix: str | None = None
) -> RuntimeFailure:
    return RuntimeFailure(message, file=file, field=field, fix=fix)


def _block(cfg: dict[str, Any], name: str, file: str, keys: frozenset[str] | None) -> dict[str, Any]:
    block = cfg.get(name)
    if not isinstance(block, dict):
        raise _fail(
            f"dataset_param.{name} is missing or not an object",
            file=file,
            field=f"dataset_param.{name}",
            fix="start from MindSpeed-MM's examples/qwen2.5vl/data_3b.json",
        )
    unknown = sorted(set(block) - keys) if keys is not None else []
    if unknown:
        raise _fail(
            f"unknown key(s) {', '.join(unknown)}: MindSpeed-MM passes this block to a dataclass that has no such "
            "field (a TypeError at startup)",
            file=file,
            field=f"dataset_param.{name}.{unknown[0]}",
            fix=f"remove or rename it; known keys: {', '.join(sorted(keys or ()))}",
        )
    return block


def _bool(block: dict[str, Any], key: str, default: bool, file: str, where: str) -> bool:
    value = block.get(key, default)
    if not isinstance(value, bool):
        raise _fail(
            f"{value!r} is not true/false", file=file, field=f"{where}.{key}", fix="set it to true or false"
        )
    return value


def _int(block: dict[str, Any], key: str, default: int | None, file: str, where: str) -> int | None:
    value = block.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise _fail(
            f"{value!r} is not a non-negative integer",
            file=file,
            field=f"{where}.{key}",
            fix="set a whole number",
        )
    return value


def read_settings(
    data_config: str | Path, *, seq_length: int | None = None, base: Path | None = None
) -> DataSettings:
    """The settings of a Qwen2.5-VL data config, or a `RuntimeFailure` naming the key that is wrong."""
    path = Path(data_config)
    file = str(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(
            f"cannot read the data config: {exc}",
            file=file,
            fix="pass the job's data config (a JSON file like MindSpeed-MM's examples/qwen2.5vl/data_3b.json)",
        ) from None
    ds = cfg.get("dataset_param") if isinstance(cfg, dict) else None
    if not isinstance(ds, dict):
        raise _fail(
            "no dataset_param object", file=file, field="dataset_param", fix="use a MindSpeed-MM data config"
        )
    kind = ds.get("dataset_type")
    if kind != "huggingface":
        raise _fail(
            f"dataset_type {kind!r}: the bundled VLM runtime reads MindSpeed-MM's Qwen2.5-VL data (huggingface)",
            file=file,
            field="dataset_param.dataset_type",
            fix='set "dataset_type": "huggingface", as examples/qwen2.5vl/data_3b.json does',
        )
    pre = _block(ds, "preprocess_parameters", file, _PROCESSOR_KEYS)
    basic = _block(ds, "basic_parameters", file, _BASIC_KEYS)
    attr_given = _block(ds, "attr", file, frozenset(_ATTR_DEFAULTS))
    where_pre, where_basic = "dataset_param.preprocess_parameters", "dataset_param.basic_parameters"
    if "cutoff_len" in basic:  # get_qwen2vl_dataset raises on it
        raise _fail(
            "`cutoff_len` is deprecated, please use `seq_length` instead (MindSpeed-MM refuses it)",
            file=file,
            field=f"{where_basic}.cutoff_len",
            fix="remove cutoff_len; the cutoff is the training script's --seq-length",
        )
    if basic.get("template") != "qwen2vl":
        raise _fail(
            f"template {basic.get('template')!r}: the bundled runtime implements MindSpeed-MM's qwen2vl template",
            file=file,
            field=f"{where_basic}.template",
            fix='set "template": "qwen2vl" (Qwen2.5-VL\'s template)',
        )
    if basic.get("use_pmcc_data"):
        raise _fail(
            "use_pmcc_data is not supported by the bundled runtime",
            file=file,
            field=f"{where_basic}.use_pmcc_data",
            fix="set it to false",
        )
    base = base or Path.cwd()
    model = pre.get("model_name_or_path")
    if not isinstance(model, str) or not model:
        raise _fail(
            "no model_name_or_path: the tokenizer and image processor are read from there",
            file=file,
            field=f"{where_pre}.model_name_or_path",
            fix="set it to the Hugging Face Qwen2.5-VL folder (tokenizer + preprocessor_config.json)",
        )
    names = basic.get("dataset")
    if not isinstance(names, str) or not names.strip():
        raise _fail(
            "no dataset file",
            file=file,
            field=f"{where_basic}.dataset",
            fix="set it to the MLLM JSON file prepare_dataset wrote (comma-separated for several)",
        )
    dataset_dir = basic.get("dataset_dir", "data")
    if not isinstance(dataset_dir, str):
        raise _fail(
            f"{dataset_dir!r} is not a path", file=file, field=f"{where_basic}.dataset_dir", fix="set a path"
        )
    attr = {**_ATTR_DEFAULTS, **attr_given}
    for key in ("packing", "ranking", "pretrain"):
        if attr[key]:
            raise _fail(
                f"attr.{key} is set: the bundled runtime trains supervised conversations only",
                file=file,
                field=f"dataset_param.attr.{key}",
                fix=f"set {key} to false (or leave it out)",
            )
    if attr["formatting"] != "sharegpt":
        raise _fail(
            f"formatting {attr['formatting']!r}: the bundled runtime reads sharegpt records (what mm-agent writes)",
            file=file,
            field="dataset_param.attr.formatting",
            fix='set "formatting": "sharegpt" or leave it out',
        )
    for key in ("messages", "role_tag", "content_tag", "user_tag", "assistant_tag"):
        if not isinstance(attr[key], str):
            raise _fail(
                f"{attr[key]!r} is not a key name", file=file, field=f"dataset_param.attr.{key}", fix="set it"
            )
    collate = cfg.get("dataloader_param", {}).get("collate_param", {}) if isinstance(cfg, dict) else {}
    collate = collate if isinstance(collate, dict) else {}
    if collate.get("model_name", "qwen2vl") != "qwen2vl":
        raise _fail(
            f"collate model_name {collate.get('model_name')!r}: Qwen2.5-VL batches with MindSpeed-MM's qwen2vl "
            "collator",
            file=file,
            field="dataloader_param.collate_param.model_name",
            fix='set "model_name": "qwen2vl"',
        )
    ignore_pad = _bool(collate, "ignore_pad_token_for_loss", True, file, "dataloader_param.collate_param")
    max_px = _int(pre, "image_max_pixels", _PROCESSOR_DEFAULTS["image_max_pixels"], file, where_pre)
    min_px = _int(pre, "image_min_pixels", _PROCESSOR_DEFAULTS["image_min_pixels"], file, where_pre)
    assert max_px is not None and min_px is not None
    return DataSettings(
        file=file,
        model=base / model,
        use_fast=_bool(pre, "use_fast_tokenizer", True, file, where_pre),
        split_special_tokens=_bool(pre, "split_special_tokens", False, file, where_pre),
        image_max_pixels=max_px,
        image_min_pixels=min_px,
        datasets=tuple(base / name.strip() for name in names.split(",")),
        dataset_dir=base / dataset_dir,
        train_on_prompt=_bool(basic, "train_on_prompt", False, file, where_basic),
        mask_history=_bool(basic, "mask_history", False, file, where_basic),
        max_samples=_int(basic, "max_samples", None, file, where_basic),
        cutoff_len=seq_length if seq_length is not None else DEFAULT_CUTOFF,
        attr=attr,
        ignore_pad_token_for_loss=ignore_pad,
    )


def _records(settings: DataSettings) -> list[tuple[str, int, Any]]:
    """(file, index in file, record) for every record, in order, the first `max_samples` of all files."""
    out: list[tuple[str, int, Any]] = []
    for path in settings.datasets:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(
                f"cannot read the dataset: {exc}",
                file=str(path),
                field="dataset_param.basic_parameters.dataset",
                fix=f"check the path in {settings.file} (relative paths are read from the job's working directory)",
            ) from None
        try:
            stripped = text.lstrip()
            if stripped.startswith("["):
                rows = json.loads(text)
            else:  # JSON lines, as `datasets`' json loader also reads
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise _fail(
                f"not JSON (a list of records, or one record per line): {exc}",
                file=str(path),
                fix="rewrite it with `mm-agent dataset prepare`",
            ) from None
        out.extend((str(path), i, row) for i, row in enumerate(rows))
    return out[: settings.max_samples] if settings.max_samples is not None else out


def _image_path(settings: DataSettings, value: str) -> Path:
    """DatasetConverter._find_media_files: the dataset_dir join when that file exists, else the path as written."""
    joined = settings.dataset_dir / value
    return joined if joined.is_file() else Path(value)


def _convert(settings: DataSettings, file: str, index: int, record: Any) -> Example:
    """SharegptDatasetConverter + SupervisedDatasetProcessor's checks, refusing what they would skip."""
    attr = settings.attr
    where = f"record {index} of {file}"
    if not isinstance(record, dict):
        raise _fail(f"{where} is not an object", file=file, field=f"[{index}]", fix="rewrite the dataset")
    key = attr["messages"]
    messages = record.get(key)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _fail(
            f"{where} has no list of turns under {key!r}",
            file=file,
            field=f"[{index}].{key}",
            fix=f"each record needs {key!r}: a list of {{{attr['role_tag']!r}, {attr['content_tag']!r}}} turns",
        )
    role_tag, content_tag = attr["role_tag"], attr["content_tag"]
    system: Any = ""
    offset = 0  # the turn number in the record of messages[0] once a system turn is taken off
    if attr["system_tag"] and messages and messages[0].get(role_tag) == attr["system_tag"]:
        system, messages, offset = messages[0].get(content_tag), messages[1:], 1
        system_field = f"[{index}].{key}[0].{content_tag}"
    elif attr["system"]:
        system = record.get(attr["system"])
        system_field = f"[{index}].{attr['system']}"
    else:
        system_field = ""
    if system is not None and not isinstance(system, str):
        raise _fail(
            f"{where}: the system prompt is not text", file=file, field=system_field, fix="make it a string"
        )
    roles = {
        attr["user_tag"]: "user",
        attr["assistant_tag"]: "assistant",
        attr["observation_tag"]: "observation",
        attr["function_tag"]: "function",
    }
    accept = ((attr["user_tag"], attr["observation_tag"]), (attr["assistant_tag"], attr["function_tag"]))
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        at = f"[{index}].{key}[{i + offset}]"
        tag = message.get(role_tag)
        if tag is None or tag not in accept[i % 2]:
            expected = " or ".join(repr(t) for t in accept[i % 2] if t)
            raise _fail(
                f"{where}: turn {i + offset} has role {tag!r} where MindSpeed-MM expects {expected} (it would skip "
                "the record)",
                file=file,
                field=f"{at}.{role_tag}",
                fix="alternate user and assistant turns, starting with the user, ending with the assistant",
            )
        content = message.get(content_tag)
        if not isinstance(content, str):
            raise _fail(
                f"{where}: turn {i + offset} has no text under {content_tag!r}",
                file=file,
                field=f"{at}.{content_tag}",
                fix="give every turn its text as a string",
            )
        role = roles[tag]
        if role in ("assistant", "function") and not content.strip():
            raise _fail(
                f"{where}: turn {i + offset} is an empty answer (MindSpeed-MM would train on the end token alone)",
                file=file,
                field=f"{at}.{content_tag}",
                fix="give the answer's text, or drop the record",
            )
        turns.append((role, content))
    if not turns or len(turns) % 2:
        raise _fail(
            f"{where} has {len(turns)} turn(s): MindSpeed-MM needs prompt/answer pairs (it would skip the record)",
            file=file,
            field=f"[{index}].{key}",
            fix="end every record with the assistant's answer to its last user turn",
        )
    for kind, attr_key, placeholder in (
        ("video", "videos", VIDEO_PLACEHOLDER),
        ("audio", "audios", AUDIO_PLACEHOLDER),
    ):
        column = attr[attr_key]
        listed = record.get(column) if column else None
        if listed or any(placeholder in content for _, content in turns):
            raise _fail(
                f"{where} has a {kind}: the bundled VLM runtime trains on images only",
                file=file,
                field=f"[{index}].{column or key}",
                fix=f"drop the {kind}s (the stock Qwen2.5-VL data configs read images only)",
            )
    images_key = attr["images"]
    listed = record.get(images_key) if images_key else None
    if isinstance(listed, str):
        listed = [listed]
    if listed is None:
        listed = []
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise _fail(
            f"{where}: {images_key!r} is not a list of paths",
            file=file,
            field=f"[{index}].{images_key}",
            fix="list the image paths (relative to dataset_dir)",
        )
    count = sum(content.count(IMAGE_PLACEHOLDER) for _, content in turns)
    if count != len(listed):
        raise _fail(
            f"{where} has {count} {IMAGE_PLACEHOLDER} placeholder(s) for {len(listed)} image(s) (MindSpeed-MM "
            "stops with 'The number of images does not match')",
            file=file,
            field=f"[{index}].{images_key or key}",
            fix=f"put exactly one {IMAGE_PLACEHOLDER} in the turns per listed image",
        )
    images: list[Path] = []
    for j, value in enumerate(listed):
        path = _image_path(settings, value)
        if not path.is_file():
            raise _fail(
                f"{where}: image {value!r} is neither under dataset_dir ({settings.dataset_dir}) nor at that path "
                "(MindSpeed-MM would skip the record)",
                file=file,
                field=f"[{index}].{images_key}[{j}]",
                fix="fix the path (relative to dataset_dir), or set dataset_dir to the folder the paths start from",
            )
        images.append(path)
    return Example(where, file, index, system or "", turns, images)


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """convert.py `infer_seqlen`: how much of a (prompt, answer) turn fits the remaining cutoff."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def _apply(slot: str, **values: str) -> str:
    """StringFormatter.apply: each `{{name}}` replaced once, in keyword order (so text is never re-read)."""
    for name, value in values.items():
        slot = slot.replace("{{" + name + "}}", value, 1)
    return slot


PIXEL_CACHE_BYTES = 512 * 1024**2  # per process (each loader worker keeps its own)


class VLMSource(Dataset[dict[str, torch.Tensor]]):
    """A Qwen2.5-VL job's training records as MindSpeed-MM's preprocessing makes them.

    Token ids and labels are computed for every record when built (so a bad record stops the job before step 1,
    as MindSpeed-MM's `datasets.map` does); images are decoded again per item, as MindSpeed-MM's collator does.
    `seq_length` is the job's `--seq-length` (MindSpeed-MM's cutoff); `base` the folder relative paths in the
    config start from (the job's working directory by default, as in MindSpeed-MM).
    """

    pad_token_id: int
    label_pad_id: int

    def __init__(self, data_config: str, *, seq_length: int | None = None, base: Path | None = None) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer
        from transformers.utils import logging as hf_logging

        self.settings = s = read_settings(data_config, seq_length=seq_length, base=base)
        self._pixel_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pixel_bytes = 0
        if not (s.model / "config.json").is_file() and not (s.model / "tokenizer_config.json").is_file():
            raise _fail(
                f"{s.model} holds no Hugging Face model (no config.json / tokenizer_config.json)",
                file=s.file,
                field="dataset_param.preprocess_parameters.model_name_or_path",
                fix="point it at the Qwen2.5-VL Hugging Face folder (relative to the job's working directory)",
            )
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the use_fast deprecation and backend fallback notes, once per rank
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                str(s.model),
                use_fast=s.use_fast,
                split_special_tokens=s.split_special_tokens,
                padding_side="right",
                local_files_only=True,
            )
            self.image_processor = AutoImageProcessor.from_pretrained(
                str(s.model), use_fast=s.use_fast, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise _fail(
                f"cannot load the tokenizer/image processor from {s.model}: {exc}",
                file=s.file,
                field="dataset_param.preprocess_parameters.model_name_or_path",
                fix="point it at a Qwen2.5-VL Hugging Face folder with tokenizer files and preprocessor_config.json",
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
        self._fix_tokenizer()
        self.merge = int(self.image_processor.merge_size) ** 2
        pad = self.tokenizer.pad_token_id
        assert isinstance(pad, int)
        self.pad_token_id = pad
        # DataCollatorForQwen2vl: labels padded with -100, or with the pad id when ignore_pad_token_for_loss is off
        self.label_pad_id = IGNORE_INDEX if s.ignore_pad_token_for_loss else pad
        self._fake: dict[str, torch.Tensor] | None = None
        self.examples = [_convert(s, *row) for row in _records(s)]
        for example in self.examples:
            self._encode(example)

    # -- tokenizer and template -------------------------------------------------------------------------------

    def _fix_tokenizer(self) -> None:
        """get_template_and_fix_tokenizer for qwen2vl: EOS becomes <|im_end|>; pad falls back to EOS."""
        tok = self.tokenizer
        tok.add_special_tokens({"eos_token": EOS_TOKEN})
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        return ids

    def _encode_turns(self, system: str, turns: list[tuple[str, str]]) -> list[list[int]]:
        """Template._encode: each message's pieces tokenised on their own; the system prompt before turn 0."""
        system = system or DEFAULT_SYSTEM
        encoded = []
        for i, (role, content) in enumerate(turns):
            ids: list[int] = []
            if i == 0 and system:
                ids += self._ids(_apply(SYSTEM_SLOT, content=system))
            if role == "user":
                ids += self._ids(_apply(ROLE_SLOTS[role], content=content, idx=str(i // 2)))
            else:
                ids += self._ids(_apply(ROLE_SLOTS[role], content=content))
            encoded.append(ids)
        return encoded

    # -- images ---------------------------------------------------------------------------------------------

    def _load_image(self, path: Path | None, example: Example | None = None, j: int = 0) -> Any:
        """Qwen2VLPlugin._preprocess_image on a file (or the collator's white stand-in when `path` is None)."""
        from PIL import Image, UnidentifiedImageError

        s = self.settings
        if path is None:
            image = Image.new("RGB", (FAKE_IMAGE_SIZE, FAKE_IMAGE_SIZE), (255, 255, 255))
        else:
            try:
                with Image.open(path) as opened:
                    image = opened.copy()  # decoded now, the file closed (as the plugin's copy does)
            except (OSError, UnidentifiedImageError) as exc:
                assert example is not None
                raise _fail(
                    f"{example.where}: cannot read image {path}: {exc} (MindSpeed-MM would skip the record)",
                    file=example.file,
                    field=f"[{example.index}].{s.attr['images']}[{j}]",
                    fix="re-save the image (PIL can open PNG/JPEG/WebP), or drop the record",
                ) from None
        if image.width * image.height > s.image_max_pixels:
            factor = math.sqrt(s.image_max_pixels / (image.width * image.height))
            size = (int(image.width * factor), int(image.height * factor))
            image = image.resize(size, resample=Image.Resampling.NEAREST)
        if image.width * image.height < s.image_min_pixels:
            factor = math.sqrt(s.image_min_pixels / (image.width * image.height))
            size = (int(image.width * factor), int(image.height * factor))
            image = image.resize(size, resample=Image.Resampling.NEAREST)
        if image.mode != "RGB":
            image = image.convert("RGB")
        if min(image.width, image.height) < 28:
            image = image.resize((max(image.width, 28), max(image.height, 28)))
        if image.width / image.height > _MAX_SIDE_RATIO:
            image = image.resize((image.height * 180, image.height))
        if image.height / image.width > _MAX_SIDE_RATIO:
            image = image.resize((image.width, image.width * 180))
        return image

    def _pixels(self, images: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.image_processor(images, return_tensors="pt")
        return feats["pixel_values"], feats["image_grid_thw"]

    def _example_pixels(self, example: Example) -> tuple[torch.Tensor, torch.Tensor]:
        images = [self._load_image(p, example, j) for j, p in enumerate(example.images)]
        return self._pixels(images)

    def _cached_pixels(self, i: int, example: Example) -> tuple[torch.Tensor, torch.Tensor]:
        """The record's image tensors, kept after their first use up to PIXEL_CACHE_BYTES: the processor is
        deterministic (no augmentation), so a later epoch gets the same tensors without decoding the files again
        (on a tiny model decoding was a fifth of the step: benchmarks/vlm_step.py)."""
        if i in self._pixel_cache:
            return self._pixel_cache[i]
        pixels = self._example_pixels(example)
        size = pixels[0].numel() * pixels[0].element_size()
        if self._pixel_bytes + size <= PIXEL_CACHE_BYTES:
            self._pixel_cache[i] = pixels
            self._pixel_bytes += size
        return pixels

    def _expand(self, text: str, grids: list[int], start: int) -> tuple[str, int]:
        """Qwen2VLPlugin.process_messages on one message: each placeholder -> its image's pad tokens."""
        n = start
        while IMAGE_PLACEHOLDER in text:
            tokens = f"{VISION_START}{IMAGE_TOKEN * grids[n]}{VISION_END}"
            text = text.replace(IMAGE_PLACEHOLDER, tokens, 1)
            n += 1
        return text, n

    def _encode(self, example: Example) -> None:
        """SupervisedDatasetProcessor._encode_data_example: ids and labels under the cutoff."""
        s = self.settings
        grids: list[int] = []
        if example.images:
            _, thw = self._example_pixels(example)
            grids = [int(row.prod()) // self.merge for row in thw]
        turns, n = [], 0
        for role, content in example.turns:
            content, n = self._expand(content, grids, n)
            turns.append((role, content))
        encoded = self._encode_turns(example.system, turns)
        pairs = [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]
        if s.mask_history:
            pairs = pairs[::-1]  # the last turns first under the cutoff
        input_ids: list[int] = []
        labels: list[int] = []
        total = 0
        for turn, (source, target) in enumerate(pairs):
            if total >= s.cutoff_len:
                break
            source_len, target_len = infer_seqlen(len(source), len(target), s.cutoff_len - total)
            source, target = source[:source_len], target[:target_len]
            total += source_len + target_len
            source_label = source if s.train_on_prompt else [IGNORE_INDEX] * source_len
            target_label = [IGNORE_INDEX] * target_len if s.mask_history and turn != 0 else target
            if s.mask_history:
                input_ids = source + target + input_ids
                labels = source_label + target_label + labels
            else:
                input_ids += source + target
                labels += source_label + target_label
        image_id = self.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        assert isinstance(image_id, int)
        kept = input_ids.count(image_id)
        if kept != sum(grids):
            raise _fail(
                f"{example.where}: the cutoff of {s.cutoff_len} tokens keeps {kept} of its {sum(grids)} image "
                "tokens (MindSpeed-MM would keep the record and fail inside the model)",
                file=example.file,
                field=f"[{example.index}]",
                fix=f"raise --seq-length above {s.cutoff_len}, or lower image_max_pixels in the data config so "
                "images take fewer tokens",
            )
        if not any(label != IGNORE_INDEX for label in labels):
            raise _fail(
                f"{example.where}: the cutoff of {s.cutoff_len} tokens leaves no answer token to train on",
                file=example.file,
                field=f"[{example.index}]",
                fix=f"raise --seq-length above {s.cutoff_len}, or shorten the record",
            )
        example.input_ids, example.labels = input_ids, labels

    def fake_image(self) -> dict[str, torch.Tensor]:
        """MultiModalDataCollatorForSeq2Seq's stand-in for a batch without images: a white 64×64 image's tokens
        (`<|vision_start|>`, pads, `<|vision_end|>`) and tensors."""
        if self._fake is None:
            pixels, thw = self._pixels([self._load_image(None)])
            text = f"{VISION_START}{IMAGE_TOKEN * (int(thw[0].prod()) // self.merge)}{VISION_END}"
            ids = torch.tensor(self._ids(text), dtype=torch.long)
            self._fake = {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": thw}
        return self._fake

    # -- Dataset ----------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        example = self.examples[i]
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        item = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": torch.tensor(example.labels, dtype=torch.long),
        }
        if example.images:
            item["pixel_values"], item["image_grid_thw"] = self._cached_pixels(i, example)
        else:
            fake = self.fake_image()
            item["pixel_values"] = fake["pixel_values"][:0]
            item["image_grid_thw"] = fake["image_grid_thw"][:0]
            item.update({f"fake_{k}": v for k, v in fake.items()})
        return item


def collate_vlm(
    items: list[dict[str, torch.Tensor]], pad_token_id: int, label_pad_id: int = IGNORE_INDEX
) -> dict[str, torch.Tensor]:
    """A batch as MindSpeed-MM's qwen2vl collator makes it: right padding to a multiple of 8 (pad id, mask 0,
    labels `label_pad_id`), the batch's image patches concatenated and their grids one row per image; a batch
    without images carries the stand-in image on its first sample, masked out (`VLMSource.fake_image`)."""
    ids = [item["input_ids"] for item in items]
    masks = [item["attention_mask"] for item in items]
    labels = [item["labels"] for item in items]
    if all(item["image_grid_thw"].shape[0] == 0 for item in items) and "fake_input_ids" in items[0]:
        fake = items[0]["fake_input_ids"]
        ids[0] = torch.cat([ids[0], fake])
        masks[0] = torch.cat([masks[0], torch.zeros_like(fake)])
        labels[0] = torch.cat([labels[0], torch.full_like(fake, IGNORE_INDEX)])
        pixel_values, grid = items[0]["fake_pixel_values"], items[0]["fake_image_grid_thw"]
    else:
        pixel_values = torch.cat([item["pixel_values"] for item in items])
        grid = torch.cat([item["image_grid_thw"] for item in items])
    length = -(-max(len(x) for x in ids) // PAD_MULTIPLE) * PAD_MULTIPLE

    def pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
        out = torch.full((len(rows), length), value, dtype=torch.long)
        for r, row in enumerate(rows):
            out[r, : len(row)] = row
        return out

    return {
        "input_ids": pad(ids, pad_token_id),
        "attention_mask": pad(masks, 0),
        "labels": pad(labels, label_pad_id),
        "pixel_values": pixel_values,
        "image_grid_thw": grid,
    }

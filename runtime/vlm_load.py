"""A Qwen2.5-VL checkpoint in MindSpeed-MM's layout as transformers' model, and a LoRA adapter merged into it.

What `runtime.vlm_train` saves is MindSpeed-MM's names and fused tensors (a LoRA run: the adapter only, in
transformers' module names, beside `lora_adapter.json`). Inference, evaluation and the merge read it back
here: the rank files joined, renamed with the converter's own table (`mm_agent.convert.vlm_state`), loaded
strictly into the class config.json builds, and an adapter merged as MindSpeed-MM merges (base + alpha/r *
B @ A, `runtime.lora.merge`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from runtime import checkpoint as ckpt
from runtime import lora
from runtime.errors import RuntimeFailure

CONFIG = "config.json"
CONVERTER = "Qwen2_5_VLConverter"


def hf_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / CONFIG
    if not path.is_file():
        raise RuntimeFailure(
            f"no config.json in {hf_dir}",
            file=str(path),
            field="--model",
            fix="pass the Hugging Face Qwen2.5-VL dir the checkpoint was trained from (config, tokenizer, processor)",
        )
    return dict(json.loads(path.read_text(encoding="utf-8")))


def merge_vlm(found: Any) -> tuple[dict[str, torch.Tensor], str]:
    """A Qwen2.5-VL checkpoint's rank files joined (ViT and LLM each split by their own layers)."""
    from mm_agent.convert.vlm import load_table
    from mm_agent.convert.vlm_io import read_ranks

    ranks, stages, _ = read_ranks(found, load_table(CONVERTER))
    layout = ", ".join(f"{name} {split.describe()}" for name, split in stages.splits.items())
    return ranks[0], layout


def read(load: str) -> ckpt.Loaded:
    """A checkpoint in MindSpeed-MM's layout (a conversion, a training save, a LoRA save), names as stored."""
    return ckpt.load_checkpoint(load, merge=merge_vlm)


def to_hf(
    state: dict[str, torch.Tensor], config: dict[str, Any], where: str, fix: str | None = None
) -> dict[str, torch.Tensor]:
    """A checkpoint's MindSpeed-MM tensors under transformers' names (`convert/vlm_state.py`, the converter's
    table); one it does not know is a `--load` failure naming the checkpoint."""
    from mm_agent.convert import vlm_state
    from mm_agent.errors import MMAgentError

    try:
        return vlm_state.mm_to_hf(state, config)
    except MMAgentError as exc:
        raise RuntimeFailure(exc.message, file=where, field="--load", fix=fix or exc.fix or "") from exc


def merged_state(hf_dir: Path, load: str, base: str | None) -> tuple[dict[str, torch.Tensor], ckpt.Loaded]:
    """transformers' state dict of `load` (a LoRA checkpoint: merged into `base`), and the checkpoint read."""
    config = hf_config(hf_dir)
    loaded = read(load)
    if not lora.is_adapter_state(loaded.model):
        if base is not None:
            raise RuntimeFailure(
                f"{loaded.root} is a full checkpoint, not a LoRA adapter",
                file=str(loaded.root),
                field="--load-base-model",
                fix="drop --load-base-model (it is for LoRA checkpoints)",
            )
        return to_hf(loaded.model, config, str(loaded.root)), loaded
    if base is None:
        raise RuntimeFailure(
            f"{loaded.root} holds a LoRA adapter only",
            file=str(loaded.root),
            field="--load-base-model",
            fix="pass the base it was trained on (finetune.sh's LOAD_PATH) as --load-base-model",
        )
    base_ckpt = read(base)
    base_state = to_hf(base_ckpt.model, config, str(base_ckpt.root))
    scaling = lora.scaling_of(loaded.lora, loaded.args, str(loaded.root))
    return lora.merge(base_state, loaded.model, scaling), loaded


def load_strict(model: Any, state: dict[str, torch.Tensor], where: str, fix: str) -> None:
    """`state` into `model`, every parameter accounted for (a tied output layer is the embedding)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeFailure(
            f"the checkpoint does not fit the model config.json builds: {len(missing)} missing "
            f"({', '.join(missing[:3])}), {len(unexpected)} unexpected ({', '.join(unexpected[:3])})",
            file=where,
            field="--load",
            fix=fix,
        )
    if tied:
        model.tie_weights()


def build(hf_dir: Path, state: dict[str, torch.Tensor], where: str) -> Any:
    """transformers' Qwen2.5-VL from config.json with `state` loaded strictly, for inference."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_pretrained(hf_dir))
    load_strict(model, state, where, "pass the Hugging Face dir the checkpoint was trained from as --model")
    return model.eval()

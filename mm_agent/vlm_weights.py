"""What a downloaded Qwen2.5-VL checkpoint's config.json says about the network, in MindSpeed-MM's terms.

The registry knows the published sizes (3B ... 72B). A bundled job trains whatever `weights_dir` holds (a
tiny rehearsal model, a fine-tuned one), and its model.json must describe that network: the bundled
runtime refuses a model.json that disagrees with config.json. So the size's arch is overlaid with the
config's numbers, mapped to the registry's arch names (the ones templates/megatron_vlm/model.json.j2 reads).
Only config.json is read; a folder without one keeps the registry's size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.paths import read_file

CONFIG = "config.json"
_MAX_CONFIG_BYTES = 1024 * 1024
# registry arch name -> (config side, field)
_ARCH = {
    "vit_layers": ("vision", "depth"),
    "vit_hidden": ("vision", "hidden_size"),
    "vit_ffn": ("vision", "intermediate_size"),
    "vit_heads": ("vision", "num_heads"),
    "projector_out": ("vision", "out_hidden_size"),
    "fullatt_block_indexes": ("vision", "fullatt_block_indexes"),
    "llm_layers": ("text", "num_hidden_layers"),
    "llm_hidden": ("text", "hidden_size"),
    "llm_ffn": ("text", "intermediate_size"),
    "llm_heads": ("text", "num_attention_heads"),
    "num_query_groups": ("text", "num_key_value_heads"),
    "vocab_size": ("text", "vocab_size"),
    "max_position_embeddings": ("text", "max_position_embeddings"),
    "img_context_token_id": ("top", "image_token_id"),
    "vision_start_token_id": ("top", "vision_start_token_id"),
}


def qwen_vl_arch(weights_dir: Path, root: Path | None = None) -> dict[str, Any]:
    """Arch values from `weights_dir/config.json` ({} when the folder has none yet)."""
    path = weights_dir / CONFIG
    if not path.is_file():
        return {}
    try:
        config = json.loads(read_file(path, root, "weights_dir", _MAX_CONFIG_BYTES))
    except ValueError as exc:
        raise MMAgentError(
            f"config.json is not valid JSON: {exc}",
            file=str(path),
            fix="re-download the checkpoint (config.json is written by transformers' save_pretrained)",
        ) from exc
    if not isinstance(config, dict) or not isinstance(config.get("vision_config"), dict):
        raise MMAgentError(
            "config.json has no vision_config: it is not a Qwen2.5-VL checkpoint",
            file=str(path),
            field="vision_config",
            fix="point --weights-dir at a Qwen2.5-VL Hugging Face folder",
        )
    text = {**config, **(config.get("text_config") or {})}
    sides = {"top": config, "vision": config["vision_config"], "text": text}
    arch = {name: sides[side][field] for name, (side, field) in _ARCH.items() if field in sides[side]}
    vision = config["vision_config"]
    if "hidden_size" in vision:  # the merger's MLP: the ViT width times the merged patches (2 x 2)
        arch["projector_ffn"] = int(vision["hidden_size"]) * int(vision.get("spatial_merge_size", 2)) ** 2
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = text.get("rope_theta", rope.get("rope_theta"))
    if theta is not None:
        arch["rope_theta"] = float(theta)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    arch["untie_embeddings_and_output_weights"] = not tied
    section = rope.get("mrope_section")
    overrides: dict[str, Any] = {}
    if section:
        overrides["text_decoder.mrope_section"] = list(section)
    for key in ("window_size", "patch_size", "spatial_merge_size", "temporal_patch_size"):
        if key in config["vision_config"]:
            name = "window_attn_size" if key == "window_size" else key
            overrides[f"image_encoder.vision_encoder.{name}"] = config["vision_config"][key]
    if overrides:
        arch["model_json"] = overrides
    return arch

"""What a downloaded Wan diffusers checkpoint says about the model it holds.

The registry knows the published sizes (1.3B, 14B, 5B); a fine-tuned or tiny checkpoint can have any
other shape, and a predictor config that disagrees with the weights fails only when the checkpoint is
loaded. So when `<weights_dir>/transformer/config.json` exists, the predictor block of the rendered
configs is sized from it (diffusers `WanTransformer3DModel` names mapped to MindSpeed-MM's `wandit`
names), and the VAE strides and tokenizer length come from `vae/config.json` and
`tokenizer/tokenizer_config.json`. Only small JSON files are read; no weights are loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.paths import read_file

WAN_CLASS = "WanTransformer3DModel"
# Tokenizers saved without a length record a huge sentinel (transformers' VERY_LARGE_INTEGER) instead.
_MAX_SANE_TEXT_LEN = 100_000
_MAX_CONFIG_BYTES = 4 * 1024 * 1024  # config.json files are a few KiB; a tokenizer config less than 1 MiB


class WanTransformerConfig(BaseModel):
    """The fields of diffusers' `WanTransformer3DModel` config.json that size MindSpeed-MM's predictor."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    class_name: str = Field(alias="_class_name")
    patch_size: tuple[int, int, int]
    num_attention_heads: int = Field(ge=1)
    attention_head_dim: int = Field(ge=1)
    in_channels: int = Field(ge=1)
    out_channels: int = Field(ge=1)
    text_dim: int = Field(ge=1)
    freq_dim: int = Field(ge=1)
    ffn_dim: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    image_dim: int | None = None
    rope_max_seq_len: int = 1024

    def predictor_arch(self) -> dict[str, Any]:
        """The `predictor` values of pretrain_model.json / inference_model.json (MindSpeed-MM key names)."""
        arch: dict[str, Any] = {
            "patch_size": list(self.patch_size),
            "num_heads": self.num_attention_heads,
            "hidden_size": self.num_attention_heads * self.attention_head_dim,
            "in_dim": self.in_channels,
            "out_dim": self.out_channels,
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "ffn_dim": self.ffn_dim,
            "num_layers": self.num_layers,
            "cross_attn_norm": self.cross_attn_norm,
            "qk_norm": self.qk_norm is not None,
            "eps": self.eps,
            "max_seq_len": self.rope_max_seq_len,
        }
        if self.image_dim is not None:
            arch["img_dim"] = self.image_dim
        return arch


class WanWeights(BaseModel):
    """What the checkpoint folder tells the renderer; None where the file is absent."""

    transformer_config: str | None = None
    arch: dict[str, Any] = Field(default_factory=dict, description="predictor values from config.json")
    spatial_stride: int = Field(default=8, description="VAE spatial downsampling (scale_factor_spatial)")
    temporal_stride: int = Field(default=4, description="VAE temporal downsampling (scale_factor_temporal)")
    text_len: int | None = Field(default=None, description="tokenizer model_max_length, when it is real")


def _read_json(path: Path, root: Path | None) -> dict[str, Any]:
    try:
        data = json.loads(read_file(path, root, field="weights_dir", limit=_MAX_CONFIG_BYTES).decode("utf-8"))
    except MMAgentError as exc:
        raise MMAgentError(
            f"cannot read {path.name}: {exc.message}", file=str(path), field="weights_dir", fix=exc.fix
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise MMAgentError(
            f"cannot read {path.name}: {exc}",
            file=str(path),
            fix="re-download the checkpoint, or point weights_dir at the diffusers folder",
        ) from exc
    if not isinstance(data, dict):
        raise MMAgentError(
            f"{path.name} is not a JSON object",
            file=str(path),
            fix="re-download the checkpoint, or point weights_dir at the diffusers folder",
        )
    return data


def transformer_config(path: Path, root: Path | None = None) -> WanTransformerConfig:
    """Parse `transformer/config.json`; a config of another model class is refused with the fix."""
    data = _read_json(path, root)
    name = data.get("_class_name")
    if name != WAN_CLASS:
        raise MMAgentError(
            f"transformer/config.json is a {name or 'config without _class_name'}, not a {WAN_CLASS}",
            file=str(path),
            field="weights_dir",
            fix="point weights_dir at a Wan diffusers checkpoint (e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers)",
        )
    try:
        return WanTransformerConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise MMAgentError(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}",
            file=str(path),
            field=".".join(map(str, err["loc"])),
            fix="re-download the checkpoint; config.json does not describe a WanTransformer3DModel",
        ) from exc


def read_wan_weights(weights_dir: Path, root: Path | None = None) -> WanWeights:
    """Read what exists of transformer/, vae/ and tokenizer/ configs under `weights_dir` (with `root`, only
    regular files that stay inside the workspace are read)."""
    out = WanWeights()
    cfg_path = weights_dir / "transformer" / "config.json"
    if cfg_path.is_file():
        out.transformer_config = str(cfg_path)
        out.arch = transformer_config(cfg_path, root).predictor_arch()
    vae_path = weights_dir / "vae" / "config.json"
    if vae_path.is_file():
        vae = _read_json(vae_path, root)
        spatial, temporal = vae.get("scale_factor_spatial"), vae.get("scale_factor_temporal")
        if isinstance(spatial, int) and spatial > 0:
            out.spatial_stride = spatial
        if isinstance(temporal, int) and temporal > 0:
            out.temporal_stride = temporal
    tok_path = weights_dir / "tokenizer" / "tokenizer_config.json"
    if tok_path.is_file():
        length = _read_json(tok_path, root).get("model_max_length")
        if isinstance(length, int) and 0 < length <= _MAX_SANE_TEXT_LEN:
            out.text_len = length
    return out

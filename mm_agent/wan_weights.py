"""What a downloaded Wan diffusers checkpoint says about the model it holds.

The registry knows the published sizes (1.3B, 14B, 5B); a fine-tuned or tiny checkpoint can have any
other shape, and a predictor config that disagrees with the weights fails only when the checkpoint is
loaded. So when `weights_dir` holds a checkpoint, the predictor block of the rendered configs is sized
from its `transformer/config.json` (diffusers `WanTransformer3DModel` names mapped to MindSpeed-MM's
`wandit` names), and the VAE strides and tokenizer length come from `vae/config.json` and
`tokenizer/tokenizer_config.json`. Only small JSON files are read; no weights are loaded. A folder not
downloaded yet (missing or empty) keeps the registry's size; one that holds files but no readable
config is an error naming the file, the field and the fix, never a silent fallback.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import read_file

WAN_CLASS = "WanTransformer3DModel"
TRANSFORMER_CONFIG = "transformer/config.json"
WAN_EXAMPLE_REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
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
            f"cannot read {path.name}: not JSON ({exc})",
            file=str(path),
            field="weights_dir",
            fix="re-download the checkpoint, or point weights_dir at the diffusers folder",
        ) from exc
    if not isinstance(data, dict):
        raise MMAgentError(
            f"{path.name} is not a JSON object",
            file=str(path),
            field="weights_dir",
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
            f"{TRANSFORMER_CONFIG}: {'.'.join(map(str, err['loc']))}: {err['msg']}",
            file=str(path),
            field=".".join(map(str, err["loc"])),
            fix="re-download the checkpoint; config.json does not describe a WanTransformer3DModel",
        ) from exc


def _present(path: Path, field: str = "weights_dir") -> bool:
    """Whether `path` exists (a symlink counts, so a dangling one is read and refused, not skipped); a
    folder that cannot be listed is an error, never "absent"."""
    try:
        path.lstat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise os_error(exc, file=str(path), field=field) from None
    return True


def _weights_folder(weights_dir: Path) -> bool:
    """True when `weights_dir` holds files to size the job from; False when it is not there yet (missing
    or empty: the user downloads after rendering). Anything else that cannot be read is an error."""
    if not _present(weights_dir):
        return False
    if not weights_dir.is_dir():
        what = "a symlink to nothing" if not weights_dir.exists() else "not a directory"
        raise MMAgentError(
            f"weights_dir {weights_dir} is {what}",
            file=str(weights_dir),
            field="weights_dir",
            fix=f"point weights_dir at the diffusers checkpoint folder (the one holding {TRANSFORMER_CONFIG}), "
            "or at a path that does not exist yet to download there after rendering",
        )
    try:
        with os.scandir(weights_dir) as entries:
            return next(entries, None) is not None
    except OSError as exc:
        raise os_error(exc, file=str(weights_dir), field="weights_dir") from None


def read_wan_weights(weights_dir: Path, root: Path | None = None, hf_id: str | None = None) -> WanWeights:
    """Read the transformer/, vae/ and tokenizer/ configs under `weights_dir` (with `root`, only regular
    files that stay inside the allowed roots are read).

    A folder that does not exist yet, or is empty, sizes nothing: the registry's size holds and the user
    downloads there after rendering. A folder with files must hold a readable `transformer/config.json`:
    the predictor is sized from it, and falling back to the registry's dimensions would render a job whose
    checkpoint does not load."""
    out = WanWeights()
    if not _weights_folder(weights_dir):
        return out
    cfg_path = weights_dir / "transformer" / "config.json"
    if not _present(cfg_path):
        raise MMAgentError(
            f"weights_dir {weights_dir} holds files but no {TRANSFORMER_CONFIG}, so the model's dimensions "
            "cannot be read from it",
            file=str(cfg_path),
            field="weights_dir",
            fix="finish the download (`"
            + shlex.join(
                ["huggingface-cli", "download", hf_id or WAN_EXAMPLE_REPO, "--local-dir", str(weights_dir)]
            )
            + f"`), or point weights_dir at the diffusers folder that holds "
            f"{TRANSFORMER_CONFIG}, or at an empty or new folder to download into after rendering",
        )
    out.transformer_config = str(cfg_path)
    out.arch = transformer_config(cfg_path, root).predictor_arch()
    vae_path = weights_dir / "vae" / "config.json"
    if _present(vae_path):
        vae = _read_json(vae_path, root)
        for key, attr in (
            ("scale_factor_spatial", "spatial_stride"),
            ("scale_factor_temporal", "temporal_stride"),
        ):
            value = vae.get(key)
            if value is None:
                continue  # older AutoencoderKLWan configs omit the strides: Wan's 8 and 4 hold
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MMAgentError(
                    f"vae/config.json: {key} is {value!r}, not a positive integer",
                    file=str(vae_path),
                    field=key,
                    fix="re-download the checkpoint's vae/ folder (Wan's VAE has scale_factor_spatial 8 and "
                    "scale_factor_temporal 4)",
                )
            setattr(out, attr, value)
    tok_path = weights_dir / "tokenizer" / "tokenizer_config.json"
    if _present(tok_path):
        length = _read_json(tok_path, root).get("model_max_length")
        if isinstance(length, int) and 0 < length <= _MAX_SANE_TEXT_LEN:
            out.text_len = length
    return out

"""The Wan VAE and UMT5 text encoder, built from the `ae` / `text_encoder` blocks of MindSpeed-MM's model json.

Both load from local directories only (`local_files_only=True`: HF_HUB_OFFLINE semantics; a job must
never stall on the network). Latents are normalised the way MindSpeed-MM's `channel_specified_shift_scale`
does, `(z - latents_mean) / latents_std` per channel from the VAE's own config, so features written here
train MindSpeed-MM and features read here came from MindSpeed-MM. Text hidden states are zeroed past the
attention mask, as diffusers' Wan pipelines do, so padding carries no signal whatever the tokenizer pads with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from runtime.errors import RuntimeFailure

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def dtype_of(name: Any, *, field: str, source: str | None = None) -> torch.dtype:
    """MindSpeed-MM's dtype names ("bf16", "fp32", "fp16", also "bfloat16"/"float32"/...) → torch dtype."""
    if name is None:
        return torch.float32
    found = DTYPES.get(str(name).lower())
    if found is None:
        raise RuntimeFailure(
            f"unknown dtype {name!r}", file=source, field=field, fix="use one of bf16, fp16, fp32"
        )
    return found


def compute_dtype(stored: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype encoders run in: the configured one on accelerators, fp32 on the CPU.

    CPU bf16/fp16 kernels are emulated on CPUs without AVX512-BF16/AMX (far slower than fp32) and their
    rounding differs between CPU models; fp32 then a cast to the configured dtype is portable and exact.
    """
    return torch.float32 if device.type == "cpu" else stored


def _local_dir(cfg: dict[str, Any], block: str, source: str | None) -> str:
    path = cfg.get("from_pretrained")
    if not isinstance(path, str) or not os.path.isdir(path):
        raise RuntimeFailure(
            f"{block}.from_pretrained is not a local directory: {path!r}",
            file=source,
            field=f"{block}.from_pretrained",
            fix="point it at the diffusers-layout weights (e.g. <weights>/vae, <weights>/text_encoder); "
            "the runtime never downloads",
        )
    return path


def _quiet_hf_logs() -> None:
    """diffusers/transformers warn on every load about things that do not apply to inference; keep logs readable."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


class VideoEncoder:
    """diffusers `AutoencoderKLWan` with MindSpeed-MM's latent normalisation (model_id `wan_video_vae`)."""

    def __init__(
        self, vae: Any, device: torch.device, dtype: torch.dtype, *, normalise: bool, sample: bool
    ) -> None:
        self.vae = vae
        self.device = device
        self.dtype = dtype
        self.normalise = normalise
        self.sample = sample
        config = vae.config
        self.mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=device).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(config.latents_std, dtype=torch.float32, device=device).view(1, -1, 1, 1, 1)
        self.z_dim = int(config.z_dim)
        self.stride_t = int(getattr(config, "scale_factor_temporal", 4))
        self.stride_hw = int(getattr(config, "scale_factor_spatial", 8))

    @classmethod
    def from_config(
        cls, ae_cfg: dict[str, Any], device: torch.device, dtype: torch.dtype, *, source: str | None = None
    ) -> VideoEncoder:
        """Load from the model json's `ae` block (`source` is that json's path, for error messages)."""
        model_id = ae_cfg.get("model_id")
        if model_id != "wan_video_vae":
            raise RuntimeFailure(
                f"unsupported ae.model_id {model_id!r}",
                file=source,
                field="ae.model_id",
                fix='the bundled runtime runs the Wan family: use "wan_video_vae"',
            )
        normalise = bool(ae_cfg.get("norm_latents", False))
        mode = ae_cfg.get("norm_mode", "channel_specified_shift_scale")
        if normalise and mode != "channel_specified_shift_scale":
            raise RuntimeFailure(
                f"unsupported ae.norm_mode {mode!r}",
                file=source,
                field="ae.norm_mode",
                fix='use "channel_specified_shift_scale" (Wan2.1/2.2 configs)',
            )
        from diffusers import AutoencoderKLWan

        _quiet_hf_logs()
        vae = AutoencoderKLWan.from_pretrained(
            _local_dir(ae_cfg, "ae", source), torch_dtype=dtype, local_files_only=True
        )
        vae = vae.to(device).eval().requires_grad_(False)
        if ae_cfg.get("enable_tiling"):
            scale = int(getattr(vae.config, "scale_factor_spatial", 8))
            tiling = ae_cfg.get("tiling_param") or {}
            size = tiling.get("tile_size") or [32, 32]
            stride = tiling.get("tile_stride") or [24, 24]
            # MindSpeed-MM's tile sizes count latent pixels; diffusers counts image pixels.
            vae.enable_tiling(size[0] * scale, size[1] * scale, stride[0] * scale, stride[1] * scale)
        return cls(vae, device, dtype, normalise=normalise, sample=bool(ae_cfg.get("do_sample", False)))

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """[C, T', H', W'] the encoder produces for a clip of `frames` x `height` x `width`."""
        return (
            self.z_dim,
            (frames - 1) // self.stride_t + 1,
            height // self.stride_hw,
            width // self.stride_hw,
        )

    @torch.no_grad()
    def encode(self, video: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[B,3,T,H,W] in [-1,1] → normalised latents [B,C,T',H',W'] (posterior mode unless `do_sample`)."""
        posterior = self.vae.encode(video.to(self.device, self.dtype)).latent_dist
        z = posterior.sample(generator) if self.sample else posterior.mode()
        z = z.float()
        if self.normalise:
            z = (z - self.mean) / self.std
        return z.to(self.dtype)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents [B,C,T',H',W'] → video [B,3,T,H,W] clamped to [-1,1]."""
        z = latents.to(self.device, torch.float32)
        if self.normalise:
            z = z * self.std + self.mean
        video = self.vae.decode(z.to(self.dtype)).sample
        return video.float().clamp_(-1.0, 1.0)


def _tokenizer_block(tokenizer_cfg: dict[str, Any] | list[Any]) -> dict[str, Any]:
    """data.json has one tokenizer dict; feature_data.json has a list of one — accept both."""
    if isinstance(tokenizer_cfg, list):
        if len(tokenizer_cfg) != 1 or not isinstance(tokenizer_cfg[0], dict):
            raise RuntimeFailure(
                f"expected one tokenizer, got {len(tokenizer_cfg)}",
                field="dataset_param.tokenizer_config",
                fix="Wan uses one UMT5 tokenizer: give a single tokenizer_config block",
            )
        return tokenizer_cfg[0]
    return tokenizer_cfg


class TextEncoder:
    """transformers `UMT5EncoderModel` + its tokenizer: prompts → padded hidden states and mask."""

    def __init__(
        self, model: Any, tokenizer: Any, max_length: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.device = device
        self.dtype = dtype
        self.width = int(model.config.d_model)

    @classmethod
    def from_config(
        cls,
        te_cfg: dict[str, Any],
        tokenizer_cfg: dict[str, Any] | list[Any],
        device: torch.device,
        dtype: torch.dtype,
        *,
        source: str | None = None,
    ) -> TextEncoder:
        """Load from the model json's `text_encoder` block and data json's `tokenizer_config`."""
        model_id = te_cfg.get("model_id")
        if model_id != "UMT5":
            raise RuntimeFailure(
                f"unsupported text_encoder.model_id {model_id!r}",
                file=source,
                field="text_encoder.model_id",
                fix='the bundled runtime runs the Wan family: use "UMT5"',
            )
        tok_cfg = _tokenizer_block(tokenizer_cfg)
        tok_dir = tok_cfg.get("from_pretrained")
        if not isinstance(tok_dir, str) or not (Path(tok_dir) / "tokenizer_config.json").is_file():
            raise RuntimeFailure(
                f"tokenizer_config.from_pretrained is not a local tokenizer directory: {tok_dir!r}",
                field="dataset_param.tokenizer_config.from_pretrained",
                fix="point it at <weights>/tokenizer (holding tokenizer_config.json)",
            )
        from transformers import AutoTokenizer, UMT5EncoderModel

        _quiet_hf_logs()
        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        max_length = int(tok_cfg.get("model_max_length") or tokenizer.model_max_length)
        model: Any = UMT5EncoderModel.from_pretrained(
            _local_dir(te_cfg, "text_encoder", source), dtype=dtype, local_files_only=True
        )
        model = model.to(device).eval().requires_grad_(False)
        return cls(model, tokenizer, max_length, device, dtype)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts → (hidden [B, L, D] zeroed past the mask, mask [B, L] int64), L = model_max_length."""
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids = tokens.input_ids.to(self.device)
        mask = tokens.attention_mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        return hidden, mask.long()

"""Input shape -> tokens: what the DiT or the LLM attends over, per sample.

Video: frames and pixels through the VAE stride, then the patch size (Wan2.1 81x480x832: latent 21x60x104,
patch 1x2x2 -> 21 x 30 x 52 = 32,760 tokens; CogVideoX 1.5 37x480x720: latent 10x60x90, patch 2x2x2 -> 5 x 30 x 45
= 6,750; Step-Video's VAE encodes 17-frame chunks into 3 latents each). Image: the same with one frame. VLM: the text plus the image
patches after the 2x2 merge, the ViT seeing every 14x14 patch (video: two frames per temporal patch).

What the request leaves out comes from the model's stock shape (the input MindSpeed-MM's own example trains on,
shapes.yaml `stock_shape`), else from DEFAULT_SHAPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mm_agent.errors import MMAgentError
from mm_agent.estimate.model import ModelShape

VIT_PATCH = 14
VIT_MERGE = 4  # 2x2 patches per LLM token (Qwen2-VL family; InternVL's pixel shuffle is the same ratio)
DEFAULT_SHAPE = {"video": (81, 480, 832), "image": (1, 1024, 1024), "vlm": (1, 448, 448)}


@dataclass(frozen=True)
class Tokens:
    frames: int
    height: int
    width: int
    text: int
    seq: int  # main tower tokens per sample (video/image: latent patches; VLM: text + merged vision)
    vision: int  # ViT patches per sample (VLM only)


def count_tokens(
    shape: ModelShape, frames: int | None, height: int | None, width: int | None, text_len: int | None
) -> Tokens:
    """Tokens per sample; a frame count or resolution the VAE cannot take is an error naming the fix."""
    stock = shape.stock_shape
    f0, h0, w0 = (stock.frames, stock.height, stock.width) if stock else DEFAULT_SHAPE[shape.kind]
    f, h, w = frames or f0, height or h0, width or w0
    text = text_len or shape.default_text_len
    if shape.kind == "vlm":
        vision = math.ceil(h / VIT_PATCH) * math.ceil(w / VIT_PATCH) * max(1, f // 2)
        return Tokens(f, h, w, text, text + vision // VIT_MERGE, vision)
    st, ss = shape.vae_stride[0], shape.vae_stride[1]
    pt, ph, pw = shape.patch
    if shape.kind == "image":
        f = 1
    elif shape.frame_chunk is not None:
        per, latents = shape.frame_chunk
        if f % per:
            low = max(per, f // per * per)
            raise MMAgentError(
                f"frames must be a multiple of {per} (the VAE encodes {per}-frame chunks into {latents} latents "
                f"each); got {f}",
                field="frames",
                fix=f"use {low} or {low + per}",
            )
    elif st > 1 and (f - 1) % st:
        low = (f - 1) // st * st + 1
        raise MMAgentError(
            f"frames must be {st}n+1 (the VAE packs {st} frames per latent after the first); got {f}",
            field="frames",
            fix=f"use {low} or {low + st}",
        )
    for name, value in (("height", h), ("width", w)):
        unit = ss * max(ph, pw)
        if value % unit:
            low = max(unit, value // unit * unit)
            raise MMAgentError(
                f"{name} must be a multiple of {unit} (VAE stride {ss} x patch {max(ph, pw)}); got {value}",
                field=name,
                fix=f"use {low} or {low + unit}",
            )
    latent_t = f // shape.frame_chunk[0] * shape.frame_chunk[1] if shape.frame_chunk else 1 + (f - 1) // st
    # a temporal patch over an odd latent count pads the last one (MindSpeed-MM v26.0.0
    # mindspeed_mm/models/predictor/dits/sat_dit.py:270, CogVideoX 1.5's 2x2x2 patch): ceil, not floor
    seq = max(1, -(-latent_t // pt)) * (h // ss // ph) * (w // ss // pw)
    return Tokens(f, h, w, text, seq, 0)

"""A registry model and size as the estimator sees it: parameter counts and the transformer shape that
activation memory and FLOPs need, from the best source there is.

Order of sources: the size's `arch` where it has the dimensions (Wan-family DiT: hidden_size, ffn_dim,
num_layers; Qwen2.5-VL: llm_*/vit_*), else the parameter count in the size id ("14b", "a14b": 14B per expert),
else in a Hugging Face id ("CogVideoX-5b", "Qwen3.5-35B-A3B": 3B active), else `shapes.yaml`. Where the
layer count and width are not in the registry they follow the usual aspect ratio (width = 128 x layers).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import load_data
from mm_agent.registry.schema import ModelEntry, SizeSpec

SHAPES_FILE = Path(__file__).with_name("shapes.yaml")
Kind = Literal["video", "image", "vlm"]
_COUNT = re.compile(r"(?<![a-z0-9.])(a?)(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")
_ACTIVE = re.compile(r"-a(\d+(?:\.\d+)?)b(?![a-z0-9])")


class StockShape(BaseModel):
    """The input shape MindSpeed-MM's stock training data config uses, and that config's path (under
    MindSpeed-MM/v26.0.0/), so a test can read the number back from upstream."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frames: int = Field(ge=1)
    height: int = Field(ge=16)
    width: int = Field(ge=16)
    origin: str = Field(alias="from", min_length=5)


class StockPatch(BaseModel):
    """A size's own [t, h, w] patch and the stock model config (under MindSpeed-MM/<version>/) whose `predictor`
    builds it, so a test can read it back from upstream."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    patch: list[int] = Field(min_length=3, max_length=3)
    origin: str = Field(alias="from", min_length=5)


class ShapeData(BaseModel):
    """What shapes.yaml says about one model (see the file's header)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    params_b: float | None = Field(default=None, gt=0)
    active_b: float | None = Field(default=None, gt=0)
    layers: int | None = Field(default=None, gt=0, description="layers of the released model params_b counts")
    vae_stride: list[int] = Field(default=[4, 8, 8], min_length=3, max_length=3)
    patch: list[int] = Field(default=[1, 2, 2], min_length=3, max_length=3)
    # the stock model config whose predictor builds `patch` (None: the example folder has none, `source` says where
    # the value comes from); a size whose stock config builds another patch has its own (CogVideoX 1.5: 2x2x2)
    patch_from: str | None = Field(default=None, min_length=5)
    patch_by_size: dict[str, StockPatch] = Field(default_factory=dict)
    stride_by_size: dict[str, list[int]] = Field(default_factory=dict)
    # a VAE that encodes fixed chunks of frames instead of 1 + stride x n: [frames per chunk, latents per chunk]
    frame_chunk: tuple[int, int] | None = None
    encoders_b: float = Field(default=0, ge=0)
    stock_shape: StockShape | None = None
    stock_shape_by_size: dict[str, StockShape] = Field(default_factory=dict)
    source: str = Field(min_length=5)

    @model_validator(mode="after")
    def _stock_fits_kind(self) -> ShapeData:
        """A VLM's input is text plus images of any size (no stock shape); an image model's is one frame."""
        shapes = [s for s in (self.stock_shape, *self.stock_shape_by_size.values()) if s is not None]
        if shapes and self.kind == "vlm":
            raise ValueError("a vlm takes no stock_shape")
        if self.kind == "image" and any(s.frames != 1 for s in shapes):
            raise ValueError("an image model's stock_shape has frames: 1")
        return self

    def patch_for(self, size_id: str) -> list[int]:
        """The size's own patch where its stock model config builds another one, else the model's."""
        own = self.patch_by_size.get(size_id)
        return own.patch if own is not None else self.patch

    def stock_for(self, size_id: str) -> StockShape | None:
        """The size's own stock shape where its example trains on another one, else the model's."""
        return self.stock_shape_by_size.get(size_id, self.stock_shape)


class ShapeTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ShapeData]


@functools.lru_cache(maxsize=1)
def load_shapes() -> ShapeTable:
    return load_data(ShapeTable, SHAPES_FILE, schema="mm_agent/estimate/model.py")


@dataclass(frozen=True)
class Tower:
    """One transformer stack: what memory and FLOPs need of it."""

    params: float  # every parameter (MoE: all experts)
    active: float  # parameters one token passes through
    layers: int
    hidden: int
    ffn: int

    def scaled(self, share: float) -> Tower:
        """The same stack at `share` of its depth (a config that builds fewer layers): parameters follow."""
        layers = max(1, round(self.layers * share))
        return Tower(self.params * share, self.active * share, layers, self.hidden, self.ffn)


@dataclass(frozen=True)
class ModelShape:
    kind: Kind
    main: Tower  # the DiT or the LLM
    vit: Tower | None  # VLM vision encoder, trained with the LLM
    cross_attention: bool  # DiT attends to text tokens in every block
    vocab: int  # LLM logits width (0: none)
    encoders: float  # frozen VAE/text encoder parameters (counted only when the job encodes online)
    vae_stride: tuple[int, int, int]
    patch: tuple[int, int, int]
    default_text_len: int
    frame_chunk: tuple[int, int] | None  # shapes.yaml frame_chunk
    # the input a request without frames/height/width gets (None: tokens.py's DEFAULT_SHAPE)
    stock_shape: StockShape | None
    source: str


def _derived(params: float, active: float) -> Tower:
    """A tower of `params` with the usual aspect ratio: 12 x layers x width^2 = active params, width = 128 x L."""
    layers = max(2, round((active / (12 * 128**2)) ** (1 / 3)))
    hidden = max(256, round(math.sqrt(active / (12 * layers)) / 64) * 64)
    return Tower(params, active, layers, hidden, 4 * hidden)


def parse_count(text: str) -> tuple[float, bool] | None:
    """Billions of parameters in a size or model id ("1.3b", "a14b", "1600M"), and whether it is per expert."""
    match = _COUNT.search(text.lower())
    if match is None:
        return None
    value = float(match.group(2)) / (1000 if match.group(3) == "m" else 1)
    return value, bool(match.group(1))


def _active_in(hf_ids: list[str]) -> float | None:
    for hf_id in hf_ids:
        match = _ACTIVE.search(hf_id.lower())
        if match:
            return float(match.group(1))
    return None


def wan_tower(arch: dict[str, Any], experts: int = 1) -> Tower:
    """Wan DiT parameters from its config: per block self- and cross-attention (4 h^2 each), FFN (2 h f),
    modulation and norms; plus patch, text and time embeddings and the head."""
    h, f, layers = int(arch["hidden_size"]), int(arch["ffn_dim"]), int(arch["num_layers"])
    patch = math.prod(arch.get("patch_size", [1, 2, 2]))
    block = 8 * h * h + 2 * h * f + 10 * h + f + 6 * h
    embed = int(arch.get("in_dim", 16)) * patch * h + int(arch.get("text_dim", 4096)) * h + h * h
    embed += int(arch.get("freq_dim", 256)) * h + h * h + 6 * h * h + h * int(arch.get("out_dim", 16)) * patch
    one = float(layers * block + embed)
    return Tower(one * experts, one, layers, h, f)


def _qwen_vlm(arch: dict[str, Any]) -> tuple[Tower, Tower]:
    """Qwen2.5-VL: LLM with grouped-query attention and SwiGLU, untied embeddings; ViT with SwiGLU blocks."""
    h, f, layers = int(arch["llm_hidden"]), int(arch["llm_ffn"]), int(arch["llm_layers"])
    head = h // int(arch["llm_heads"])
    kv = int(arch.get("num_query_groups", arch["llm_heads"])) * head
    llm = float(layers * (2 * h * h + 2 * h * kv + 3 * h * f) + 2 * int(arch.get("vocab_size", 152064)) * h)
    vh, vf, vl = int(arch["vit_hidden"]), int(arch["vit_ffn"]), int(arch["vit_layers"])
    vit = float(vl * (4 * vh * vh + 3 * vh * vf))
    return Tower(llm, llm, layers, h, f), Tower(vit, vit, vl, vh, vf)


def model_shape(entry: ModelEntry, size: SizeSpec, arch: dict[str, Any] | None = None) -> ModelShape:
    """The shape of `entry`'s `size` (`arch`: dimensions a job's own model config builds, over the size's);
    an error names the model when nothing gives its parameter count."""
    data = load_shapes().models.get(entry.id)
    kind: Kind = data.kind if data else ("vlm" if entry.family == "vlm" else "video")
    arch = {**size.arch, **arch} if arch else size.arch
    experts = int(arch.get("experts", 2 if size.id.startswith("a") and entry.family == "generative" else 1))
    vit: Tower | None = None
    if {"hidden_size", "ffn_dim", "num_layers"} <= set(arch):
        main, source = wan_tower(arch, experts), "registry arch (DiT dimensions)"
    elif {"llm_hidden", "llm_ffn", "llm_layers", "vit_hidden"} <= set(arch):
        (main, vit), source = _qwen_vlm(arch), "registry arch (LLM and ViT dimensions)"
    else:
        main, source = _counted(entry, size, data, experts)
    if kind == "vlm" and vit is None:
        vit = _derived(0.6e9, 0.6e9)  # a ~600M ViT, as Qwen2/2.5/3-VL, InternViT-300M..6B sit around it
        source += "; ViT assumed 0.6B"
    vocab = int(arch.get("vocab_size", 151936)) if kind == "vlm" else 0
    stride = (data.stride_by_size.get(size.id) if data else None) or (data.vae_stride if data else [4, 8, 8])
    patch = data.patch_for(size.id) if data else [1, 2, 2]
    if data is not None and source.startswith(("shapes.yaml", "size id", "Hugging Face")):
        source += f" ({data.source})"
    return ModelShape(
        kind=kind,
        main=main,
        vit=vit,
        cross_attention=kind != "vlm",
        vocab=vocab,
        encoders=(data.encoders_b if data else 0) * 1e9,
        vae_stride=(stride[0], stride[1], stride[2]),
        frame_chunk=data.frame_chunk if data else None,
        patch=(patch[0], patch[1], patch[2]),
        default_text_len=int(arch.get("text_len", 512 if kind != "vlm" else 1024)),
        stock_shape=data.stock_for(size.id) if data else None,
        source=source,
    )


def _counted(entry: ModelEntry, size: SizeSpec, data: ShapeData | None, experts: int) -> tuple[Tower, str]:
    """A tower from a parameter count: the size id, a Hugging Face id, or shapes.yaml."""
    found = parse_count(size.id)
    source = f"size id {size.id!r}"
    if found is None:
        for hf_id in size.hf_ids:
            found = parse_count(hf_id.rsplit("/", 1)[-1].replace("_", "-"))
            if found is not None:
                source = f"Hugging Face id {hf_id}"
                break
    if found is None and data is not None and data.params_b is not None:
        found, source = (data.params_b, False), "shapes.yaml"
    if found is None:
        raise MMAgentError(
            f"no parameter count for {entry.id} size {size.id}",
            field="size",
            fix="add params_b for the model to mm_agent/estimate/shapes.yaml",
        )
    billions, per_expert = found
    total = billions * (experts if per_expert else 1) * 1e9
    active_b = _active_in(size.hf_ids) or (data.active_b if data else None)
    active = billions * 1e9 if per_expert else (active_b * 1e9 if active_b else total)
    trained = size.arch.get("num_layers")
    if data is not None and data.layers and isinstance(trained, int) and trained < data.layers:
        share = trained / data.layers  # the stock model config builds only the first `trained` layers
        total, active = total * share, active * share
        source += f"; the stock config builds {trained} of its {data.layers} layers"
    return _derived(total, active), source + "; layers and width derived (width = 128 x layers)"

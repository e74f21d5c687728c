"""The Wan2.1 text-to-video DiT (`wandit`) in plain torch, with MindSpeed-MM's parameter names.

Names follow MindSpeed-MM's `WanDiT` (reference mindspeed-mm.md §2.4) so a checkpoint converted by
mm-convert / `mm_agent.convert` loads with `strict=True`, and a trained state dict goes back to diffusers
through `mm_to_hf`. The arithmetic follows diffusers' `WanTransformer3DModel` operation for operation
(fp32 sinusoidal timestep table, fp32 layer norms, RMSNorm over all heads, 3-axis RoPE from a float64
table, tanh-GELU FFN, fp32 modulation), so both give the same output for the same weights; a test checks it.
The model is sized from the `predictor` block of pretrain_model.json / inference_model.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtime.checkpoint import state_mismatch
from runtime.errors import RuntimeFailure
from runtime.mmconfig import require


@dataclass(frozen=True)
class WanDiTConfig:
    """The `predictor` fields that size the network (the rest of the block is MindSpeed-MM tuning)."""

    hidden_size: int
    num_heads: int
    ffn_dim: int
    freq_dim: int
    text_dim: int
    in_dim: int
    out_dim: int
    num_layers: int
    patch_size: tuple[int, int, int]
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    max_seq_len: int = 1024

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_predictor(cls, predictor: dict[str, Any], file: str) -> WanDiTConfig:
        """Read and check the `predictor` block; anything this runtime cannot build is refused by name."""
        block = {"predictor": predictor}
        model_id = require(block, "predictor.model_id", file)
        if model_id != "wandit":
            raise RuntimeFailure(
                f"predictor.model_id is {model_id!r}; the bundled runtime implements only 'wandit' (Wan)",
                file=file,
                field="predictor.model_id",
                fix="set model_id to wandit, use MindSpeed-MM for its other predictors, or for a DiT of your own "
                "pass its file and class: `python -m runtime.user_train` / `runtime.sample` --predictor-file F "
                "--predictor-class C",
            )
        model_type = predictor.get("model_type", "t2v")
        if model_type != "t2v":
            raise RuntimeFailure(
                f"predictor.model_type {model_type!r} is not supported by the bundled runtime (t2v only)",
                file=file,
                field="predictor.model_type",
                fix="train i2v/flf2v models with MindSpeed-MM; the bundled runtime trains Wan t2v",
            )
        ints = {}
        for name in (
            "hidden_size",
            "num_heads",
            "ffn_dim",
            "freq_dim",
            "text_dim",
            "in_dim",
            "out_dim",
            "num_layers",
        ):
            value = require(block, f"predictor.{name}", file)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RuntimeFailure(
                    f"predictor.{name} must be a positive integer, got {value!r}",
                    file=file,
                    field=f"predictor.{name}",
                    fix="use the value from the model's transformer/config.json",
                )
            ints[name] = value
        patch = require(block, "predictor.patch_size", file)
        if not (
            isinstance(patch, list) and len(patch) == 3 and all(isinstance(p, int) and p > 0 for p in patch)
        ):
            raise RuntimeFailure(
                f"predictor.patch_size must be three positive integers, got {patch!r}",
                file=file,
                field="predictor.patch_size",
                fix="use [1, 2, 2] for Wan2.1",
            )
        if ints["hidden_size"] % ints["num_heads"] or (ints["hidden_size"] // ints["num_heads"]) % 2:
            raise RuntimeFailure(
                f"hidden_size {ints['hidden_size']} must split into num_heads {ints['num_heads']} heads of "
                "even size (RoPE rotates pairs)",
                file=file,
                field="predictor.num_heads",
                fix="hidden_size = num_heads x attention_head_dim from transformer/config.json",
            )
        return cls(
            **ints,
            patch_size=(patch[0], patch[1], patch[2]),
            qk_norm=bool(predictor.get("qk_norm", True)),
            cross_attn_norm=bool(predictor.get("cross_attn_norm", True)),
            eps=float(predictor.get("eps", 1e-6)),
            max_seq_len=int(predictor.get("max_seq_len", 1024)),
        )


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the input dtype (Wan keeps its norms in fp32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


def timestep_table(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal timestep features, [cos | sin], computed in fp32 as diffusers' `Timesteps` does."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


def rope_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_seq_len, head_dim] for the time/height/width axes, built in float64 then cast."""
    h_dim = w_dim = 2 * (head_dim // 6)
    t_dim = head_dim - h_dim - w_dim
    cos, sin = [], []
    positions = torch.arange(max_seq_len, dtype=torch.float64)
    for dim in (t_dim, h_dim, w_dim):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim))
        angles = torch.outer(positions, freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1).float())
        sin.append(angles.sin().repeat_interleave(2, dim=1).float())
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [B, S, H, D] by the per-position angles."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


class Attention(nn.Module):
    """Multi-head attention with Wan's q/k RMSNorm over all heads; self-attention gets RoPE."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.proj_q = nn.Linear(dim, dim)
        self.proj_k = nn.Linear(dim, dim)
        self.proj_v = nn.Linear(dim, dim)
        self.proj_out = nn.Linear(dim, dim)
        self.q_norm: nn.Module = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(
        self, x: torch.Tensor, context: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        q = self.q_norm(self.proj_q(x)).unflatten(2, (self.num_heads, -1))
        k = self.k_norm(self.proj_k(context)).unflatten(2, (self.num_heads, -1))
        v = self.proj_v(context).unflatten(2, (self.num_heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj_out(out.transpose(1, 2).flatten(2, 3).type_as(q))


class WanDiTBlock(nn.Module):
    """Self-attention, cross-attention to the text, FFN; shift/scale/gate from the timestep (`modulation`)."""

    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        dim = cfg.hidden_size
        self.norm1 = FP32LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.self_attn = Attention(dim, cfg.num_heads, cfg.qk_norm, cfg.eps)
        self.norm3: nn.Module = (
            FP32LayerNorm(dim, cfg.eps, elementwise_affine=True) if cfg.cross_attn_norm else nn.Identity()
        )
        self.cross_attn = Attention(dim, cfg.num_heads, cfg.qk_norm, cfg.eps)
        self.norm2 = FP32LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self, x: torch.Tensor, context: torch.Tensor, e: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        shift, scale, gate, c_shift, c_scale, c_gate = (self.modulation + e.float()).chunk(6, dim=1)
        h = (self.norm1(x.float()) * (1 + scale) + shift).type_as(x)
        x = (x.float() + self.self_attn(h, h, rope) * gate).type_as(x)
        h = self.norm3(x.float()).type_as(x)
        x = x + self.cross_attn(h, context, None)
        h = (self.norm2(x.float()) * (1 + c_scale) + c_shift).type_as(x)
        return (x.float() + self.ffn(h).float() * c_gate).type_as(x)


class TextEmbedding(nn.Module):
    def __init__(self, text_dim: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(text_dim, dim)
        self.act = nn.GELU(approximate="tanh")
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class Head(nn.Module):
    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        dim = cfg.hidden_size
        self.norm = FP32LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(dim, cfg.out_dim * math.prod(cfg.patch_size))
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation + temb.unsqueeze(1)).chunk(2, dim=1)
        return self.head((self.norm(x.float()) * (1 + scale) + shift).type_as(x))


class WanDiT(nn.Module):
    """`forward(latents [B,C,T,H,W], timestep [B] in [0, num_train_timesteps], text [B,L,text_dim])`."""

    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.hidden_size
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = TextEmbedding(cfg.text_dim, dim)
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(WanDiTBlock(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.recompute = False  # activation checkpointing per block (--recompute-granularity full)
        self.recompute_layers: int | None = (
            None  # only the first N blocks (--recompute-num-layers); None: all
        )
        self.init_weights()

    def init_weights(self) -> None:
        """Wan's initialisation (xavier linears, small embeddings, zero head) for training from scratch."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        for m in [*self.text_embedding.modules(), *self.time_embedding.modules()]:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.head.head.weight)

    def rope(self, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [1, F*H*W, 1, head_dim] for a post-patch grid (frames, height, width)."""
        f, h, w = grid
        if max(grid) > self.cfg.max_seq_len:
            raise RuntimeFailure(
                f"latent grid {grid} exceeds predictor.max_seq_len {self.cfg.max_seq_len}",
                field="predictor.max_seq_len",
                fix="raise max_seq_len or train on smaller clips",
            )
        hd = self.cfg.head_dim
        h_dim = w_dim = 2 * (hd // 6)
        sizes = [hd - h_dim - w_dim, h_dim, w_dim]
        out = []
        tables: tuple[torch.Tensor, torch.Tensor] = (self.rope_cos, self.rope_sin)  # type: ignore[assignment]
        for table in tables:
            t_part, h_part, w_part = table.split(sizes, dim=1)
            full = torch.cat(
                [
                    t_part[:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                    h_part[:h].view(1, h, 1, -1).expand(f, h, w, -1),
                    w_part[:w].view(1, 1, w, -1).expand(f, h, w, -1),
                ],
                dim=-1,
            )
            out.append(full.reshape(1, f * h * w, 1, -1))
        return out[0], out[1]

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        b, _, t, h, w = latents.shape
        pt, ph, pw = self.cfg.patch_size
        grid = (t // pt, h // ph, w // pw)
        rope = self.rope(grid)
        x = self.patch_embedding(latents).flatten(2).transpose(1, 2).contiguous()
        freq = timestep_table(timestep, self.cfg.freq_dim)
        first: nn.Linear = self.time_embedding[0]  # type: ignore[assignment]
        temb = self.time_embedding(freq.to(first.weight.dtype)).type_as(text)
        e = self.time_projection(temb).unflatten(1, (6, -1))
        context = self.text_embedding(text)
        recomputed = len(self.blocks) if self.recompute_layers is None else self.recompute_layers
        for index, block in enumerate(self.blocks):
            if self.recompute and index < recomputed and torch.is_grad_enabled():
                x = checkpoint(block, x, context, e, rope, use_reentrant=False)
            else:
                x = block(x, context, e, rope)
        x = self.head(x, temb)
        x = x.reshape(b, *grid, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        # reshape of the permuted grid copies: FSDP2 must not see a view as the root's output
        return x.reshape(b, x.shape[1], grid[0] * pt, grid[1] * ph, grid[2] * pw)


def load_weights(model: WanDiT, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Strict load with a readable diff: a checkpoint for another size or family must not half-load."""
    parts = state_mismatch(model.state_dict(), state_dict)
    if parts:
        raise RuntimeFailure(
            f"the checkpoint does not match the wandit model: {'; '.join(parts)}",
            file=source,
            fix="size predictor in the model json like the checkpoint's transformer/config.json "
            "(hidden_size, num_heads, ffn_dim, num_layers, ...), or --load a wandit checkpoint",
        )
    model.load_state_dict(state_dict, strict=True)

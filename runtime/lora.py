"""LoRA for the bundled runtime: MindSpeed-MM's `--lora-*` flags, PEFT adapters on MindSpeed-MM's module names.

MindSpeed-MM (`mindspeed_mm/tasks/finetune/lora/lora_patch.py`) wraps the predictor with PEFT `LoraConfig(r,
lora_alpha, target_modules, lora_dropout, bias="none")`; a target matches a module whose name equals it or
ends with `.<target>` (PEFT's rule), and the checkpoint keeps only the keys holding `lora`, under the
predictor's own names: `blocks.0.self_attn.proj_q.lora_A.default.weight` ([r, in]) and `...lora_B.default.weight`
([out, r]). `checkpoint/common/merge_base_lora_weight.py` merges them as `W += (alpha / r) * B @ A`. This
module does the same with PEFT's `inject_adapter_in_model` (the model stays a `WanDiT`, so names need no
prefix), refuses settings MindSpeed-MM would silently accept (a target that matches nothing, a module PEFT
cannot merge with `addmm_`), and describes the adapter (`manifest`) so a checkpoint says which base it belongs to.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runtime.errors import RuntimeFailure

ADAPTER = "default"  # PEFT's adapter name, part of MindSpeed-MM's key names (`lora_A.default.weight`)
STOCK_TARGETS = ("ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out")  # Wan2.1 finetune_lora.sh
# MindSpeed-MM's default for --lora-register-forward-hook (LLM names; nothing in a Wan DiT carries them)
STOCK_HOOKS = ("word_embeddings", "input_layernorm", "final_layernorm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """MindSpeed-MM's LoRA flags (mindspeed_mm/arguments.py `_add_lora_args`), same names and defaults.

    `--lora-r` has no default here: it is what turns LoRA on (MindSpeed-MM keys on `--lora-target-modules`,
    whose default is empty; an empty target list is refused below instead of silently training in full).
    """
    group = parser.add_argument_group("lora (MindSpeed-MM's flags)")
    group.add_argument("--lora-r", type=int, default=None, help="LoRA rank; set it to train an adapter only")
    group.add_argument("--lora-alpha", type=int, default=16, help="scaling is alpha / r")
    group.add_argument("--lora-dropout", type=float, default=0.0)
    group.add_argument(
        "--lora-target-modules", nargs="+", default=list(STOCK_TARGETS), help="module names or name suffixes"
    )
    group.add_argument(
        "--lora-register-forward-hook",
        nargs="+",
        default=list(STOCK_HOOKS),
        help="modules whose output is made to require grad (MindSpeed-MM's recompute workaround)",
    )
    group.add_argument(
        "--load-base-model",
        default=None,
        help="base checkpoint when --load holds a LoRA checkpoint (to continue it); default: --load is the base",
    )


@dataclass(frozen=True)
class LoraSettings:
    """The adapter's shape: what MindSpeed-MM's merge needs (targets, alpha / r) and what training needs."""

    r: int
    alpha: int
    dropout: float
    targets: tuple[str, ...]
    hooks: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return float(self.alpha) / float(self.r)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoraSettings | None:
        """None without `--lora-r`; otherwise checked settings (comma lists split like MindSpeed-MM does)."""
        if args.lora_r is None:
            return None
        targets = tuple(t for item in args.lora_target_modules for t in item.split(",") if t)
        hooks = tuple(h for item in args.lora_register_forward_hook for h in item.split(",") if h)
        if args.lora_r < 1:
            raise RuntimeFailure(
                f"--lora-r must be >= 1, got {args.lora_r}",
                field="--lora-r",
                fix="use a rank such as 16 (MindSpeed-MM's Wan2.1 finetune_lora.sh), or drop --lora-r to train fully",
            )
        if args.lora_alpha < 1:
            raise RuntimeFailure(
                f"--lora-alpha must be >= 1, got {args.lora_alpha}", field="--lora-alpha", fix="use e.g. 16"
            )
        if not 0.0 <= args.lora_dropout < 1.0:
            raise RuntimeFailure(
                f"--lora-dropout must be in [0, 1), got {args.lora_dropout}",
                field="--lora-dropout",
                fix="use 0.0",
            )
        if not targets:
            raise RuntimeFailure(
                "--lora-target-modules is empty",
                field="--lora-target-modules",
                fix=f"e.g. {' '.join(STOCK_TARGETS)}",
            )
        if not args.load and not args.load_base_model:
            raise RuntimeFailure(
                "LoRA trains an adapter on a base model, but no --load was given",
                field="--load",
                fix="pass the converted base checkpoint as --load (mm-agent convert WanConverter hf_to_mm), "
                "or drop --lora-r to train the whole model",
            )
        return cls(args.lora_r, args.lora_alpha, float(args.lora_dropout), targets, hooks)

    def manifest(self, base: str, modules: list[str]) -> dict[str, Any]:
        """What a LoRA checkpoint is: stored in its payload (`lora`) and as `lora_adapter.json`."""
        return {
            "format": "mindspeed-mm-lora",
            "base": str(Path(base).resolve()),
            "r": self.r,
            "alpha": self.alpha,
            "scaling": self.scaling,
            "dropout": self.dropout,
            "target_modules": list(self.targets),
            "wrapped_modules": modules,
        }


def matches(name: str, target: str) -> bool:
    """PEFT's `check_target_module_exists` for a list entry: the full name or a `.`-separated suffix."""
    return name == target or name.endswith("." + target)


def target_modules(model: nn.Module, settings: LoraSettings) -> list[str]:
    """Names of the modules the targets wrap; a target that matches nothing or a non-Linear is refused."""
    found: list[str] = []
    for target in settings.targets:
        hits = [(n, m) for n, m in model.named_modules() if n and matches(n, target)]
        if not hits:
            raise RuntimeFailure(
                f"--lora-target-modules {target!r} matches no module of the wandit model",
                field="--lora-target-modules",
                fix=f"use MindSpeed-MM's Wan names (e.g. {' '.join(STOCK_TARGETS)}); a target is a module name "
                "or the end of one, e.g. proj_q or self_attn.proj_q",
            )
        odd = sorted({type(m).__name__ for _, m in hits if not isinstance(m, nn.Linear)})
        if odd:
            raise RuntimeFailure(
                f"--lora-target-modules {target!r} matches {', '.join(odd)} modules; LoRA here wraps Linear layers "
                "(MindSpeed-MM's merge adds B @ A to 2-D weights)",
                field="--lora-target-modules",
                fix="name Linear layers: ffn.0 ffn.2 proj_q proj_k proj_v proj_out",
            )
        found.extend(n for n, _ in hits if n not in found)
    return found


def _require_grad_hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
    output.requires_grad_(True)


def apply(model: nn.Module, settings: LoraSettings) -> list[str]:
    """Wrap the targets in place (base frozen, adapters trainable) and register the forward hooks.

    Returns the wrapped module names. Call after the base weights are loaded: PEFT moves each target's
    weight to `<name>.base_layer.weight` and only `lora_*` parameters keep requires_grad.
    """
    from peft import LoraConfig, inject_adapter_in_model

    modules = target_modules(model, settings)
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=modules,
        bias="none",
    )
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, module in model.named_modules():  # MindSpeed-MM matches the last name component
        if name.split(".")[-1] in settings.hooks:
            module.register_forward_hook(_require_grad_hook)
    return modules


def is_adapter_key(key: str) -> bool:
    """A key MindSpeed-MM keeps in a LoRA checkpoint (`'lora' in key and 'base_layer' not in key`)."""
    return "lora" in key and "base_layer" not in key


def is_adapter_state(state: dict[str, torch.Tensor]) -> bool:
    return bool(state) and all(is_adapter_key(k) for k in state)


def adapter_state(state: dict[str, Any]) -> dict[str, Any]:
    """The LoRA-only state dict MindSpeed-MM saves: the adapter keys, under the model's own names."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}


def load_adapter(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load a LoRA checkpoint into a wrapped model; every adapter tensor must be present with its shape."""
    expected = adapter_state(model.state_dict())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items() if k in state
              and tuple(state[k].shape) != tuple(v.shape)]  # fmt: skip
    if missing or unexpected or shapes:
        detail = "; ".join(
            part
            for part in (
                f"missing {missing[:3]}" if missing else "",
                f"unexpected {unexpected[:3]}" if unexpected else "",
                f"other shapes {shapes[:2]}" if shapes else "",
            )
            if part
        )
        raise RuntimeFailure(
            f"the LoRA checkpoint does not fit the adapter these flags build: {detail}",
            file=source,
            field="--lora-r",
            fix="use the --lora-r/--lora-target-modules the adapter was trained with (its lora_adapter.json)",
        )
    model.load_state_dict(state, strict=False)


def merge(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """base + scaling * B @ A per wrapped Linear, as MindSpeed-MM's `lora_merge_to_base` (new tensors, fp32 math)."""
    merged = dict(base)
    for key in adapter:
        if not key.endswith(f".lora_A.{ADAPTER}.weight"):
            continue
        layer = key[: -len(f".lora_A.{ADAPTER}.weight")]
        b = adapter.get(f"{layer}.lora_B.{ADAPTER}.weight")
        weight = base.get(f"{layer}.weight")
        if b is None or weight is None:
            raise RuntimeFailure(
                f"LoRA layer {layer!r} has no lora_B or no base weight {layer}.weight",
                field="--load-base-model",
                fix="pass the base checkpoint the adapter was trained on (see its lora_adapter.json)",
            )
        delta = b.float() @ adapter[key].float()
        merged[f"{layer}.weight"] = (weight.float() + scaling * delta).to(weight.dtype)
    return merged


def scaling_of(payload_lora: dict[str, Any] | None, args: argparse.Namespace | None, source: str) -> float:
    """alpha / r of a saved adapter: from its manifest, else from the training args MindSpeed-MM saved."""
    if payload_lora is not None:
        return float(payload_lora["alpha"]) / float(payload_lora["r"])
    r, alpha = getattr(args, "lora_r", None), getattr(args, "lora_alpha", None)
    if r and alpha:
        return float(alpha) / float(r)
    raise RuntimeFailure(
        "the LoRA checkpoint says neither its rank nor its alpha",
        file=source,
        fix="merge it first (mm-agent convert WanConverter merge_lora_to_base with lora_r/lora_alpha) and load "
        "the merged checkpoint",
    )


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts — the adapter's share of the model."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total

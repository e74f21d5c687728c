"""`python -m runtime.export_lora --load LORA_CKPT --out adapter.safetensors`: a diffusers-loadable Wan LoRA.

A LoRA checkpoint (MindSpeed-MM's, or the bundled runtime's) holds `blocks.N.self_attn.proj_q.lora_A.default.weight`
under MindSpeed-MM's names. diffusers' `WanTransformer3DModel.load_lora_adapter` / `WanPipeline.load_lora_weights`
and ComfyUI read PEFT keys under diffusers' names: `transformer.blocks.N.attn1.to_q.lora_A.weight`. Module names
go back through WanConverter's own mapping (`mm_agent/convert/mappings/WanConverter.yaml`, `Mapping.mm_to_hf`),
so export and mm_to_hf can never disagree. The adapter's scale (alpha / r) is folded into `lora_B`, so every
loader's default alpha (= rank, scale 1) reproduces base + alpha / r * B @ A without reading alpha anywhere.
The file is written atomically; see docs/lora.md.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime import checkpoint as ckpt
from runtime import lora
from runtime.errors import RuntimeFailure, run_main

PREFIX = "transformer"  # the pipeline component diffusers' Wan loaders filter on
A_SUFFIX = f".lora_A.{lora.ADAPTER}.weight"
B_SUFFIX = f".lora_B.{lora.ADAPTER}.weight"


@dataclass(frozen=True)
class Exported:
    path: Path
    tensors: int
    rank: int
    scaling: float


def diffusers_module(mm_module: str) -> str:
    """`blocks.0.self_attn.proj_q` -> `blocks.0.attn1.to_q` with WanConverter's mm_to_hf mapping."""
    from mm_agent.convert.mapping import load_mapping

    name = load_mapping("WanConverter").mm_to_hf(f"{mm_module}.weight")
    if not isinstance(name, str):
        raise RuntimeFailure(
            f"LoRA module {mm_module!r} has no diffusers name ({name.reason})",
            field="--load",
            fix="export an adapter on Wan Linear layers (ffn.0 ffn.2 proj_q proj_k proj_v proj_out)",
        )
    return name.removesuffix(".weight")


def diffusers_state(adapter: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """PEFT keys under diffusers' Wan names, alpha / r folded into lora_B (contiguous copies for safetensors)."""
    out: dict[str, torch.Tensor] = {}
    for key in sorted(adapter):
        if key.endswith(A_SUFFIX):
            module, part, scale = key[: -len(A_SUFFIX)], "lora_A", 1.0
        elif key.endswith(B_SUFFIX):
            module, part, scale = key[: -len(B_SUFFIX)], "lora_B", scaling
        else:
            raise RuntimeFailure(
                f"unexpected key {key!r} in the LoRA checkpoint (only lora_A/lora_B weights are exported)",
                field="--load",
                fix="train the adapter with bias none (the default), as MindSpeed-MM does",
            )
        tensor = adapter[key].detach().float() * scale
        out[f"{PREFIX}.{diffusers_module(module)}.{part}.weight"] = tensor.contiguous()
    return out


def export(load_dir: str, out: Path) -> Exported:
    """Read a LoRA checkpoint and write the diffusers LoRA safetensors to `out` (atomically)."""
    from safetensors.torch import save_file

    loaded = ckpt.load_checkpoint(load_dir)
    if not lora.is_adapter_state(loaded.model):
        raise RuntimeFailure(
            f"--load {loaded.root} is not a LoRA checkpoint (it holds full model weights)",
            field="--load",
            fix="pass the --save dir of a --lora-r training run; full weights export with "
            "`mm-agent convert WanConverter mm_to_hf`",
        )
    scaling = lora.scaling_of(loaded.lora, loaded.args, str(loaded.root))
    state = diffusers_state(loaded.model, scaling)
    rank = next(v.shape[0] for k, v in state.items() if k.endswith(".lora_A.weight"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    metadata = {
        "format": "pt",
        "mm_agent.source": str(loaded.root),
        "mm_agent.lora": json.dumps(loaded.lora or {}),
    }
    save_file(state, str(tmp), metadata=metadata)
    os.replace(tmp, out)
    return Exported(out, len(state), rank, scaling)


def main(argv: list[str] | None = None) -> int:
    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise RuntimeFailure(message, fix="see `python -m runtime.export_lora --help`")

    p = _Parser(prog="python -m runtime.export_lora", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--load", required=True, help="LoRA checkpoint dir (the --save of a --lora-r run)")
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise RuntimeFailure(
            f"--out {out} is not a .safetensors file", field="--out", fix="end it in .safetensors"
        )
    done = export(args.load, out)
    print(
        f"wrote {done.tensors} tensors (rank {done.rank}, alpha/r {done.scaling:g} folded into lora_B) to {done.path}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    run_main(main)

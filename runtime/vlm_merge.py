"""`python -m runtime.vlm_merge`: a Qwen2.5-VL LoRA checkpoint merged into its base, as a MindSpeed-MM checkpoint.

The bundled runtime's LoRA checkpoints hold the adapter only. This writes base + alpha/r * B @ A (MindSpeed-MM's
`merge_lora_to_base` arithmetic, `runtime.lora.merge`) in MindSpeed-MM's names and layout (`iter_*` of the
adapter's iteration, tracker last, atomically: `runtime.checkpoint.save_checkpoint`), which `mm-agent convert
Qwen2_5_VLConverter mm_to_hf` exports to the Hugging Face layout. Usage:
`python -m runtime.vlm_merge --model HF_DIR --base BASE_CKPT --lora LORA_SAVE_DIR --out MERGED_DIR`.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

from runtime import checkpoint as ckpt  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.vlm_load import hf_config, merged_state  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RuntimeFailure(message, fix="see `python -m runtime.vlm_merge --help`")


def main(argv: list[str] | None = None) -> int:
    from mm_agent.convert import vlm_state

    p = _Parser(prog="python -m runtime.vlm_merge", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--model", required=True, type=Path, help="the Hugging Face Qwen2.5-VL dir trained from")
    p.add_argument("--base", required=True, help="the base checkpoint (finetune.sh's LOAD_PATH)")
    p.add_argument("--lora", required=True, help="the LoRA training's --save dir (or one iter_* of it)")
    p.add_argument("--out", required=True, type=Path, help="where the merged checkpoint goes (new or empty)")
    args = p.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()) and not (args.out / ckpt.TRACKER).is_file():
        raise RuntimeFailure(
            f"{args.out} holds files and is no checkpoint",
            field="--out",
            fix="pass a new or empty directory (the merge never writes over other files)",
        )
    state, loaded = merged_state(args.model, args.lora, args.base)
    mm = vlm_state.hf_to_mm(state, hf_config(args.model))
    final = ckpt.save_checkpoint(
        args.out,
        loaded.iteration,
        {k: v.contiguous() for k, v in mm.items()},
        {},
        [],
        loaded.consumed_samples,
        argparse.Namespace(merged_from=str(loaded.root), base=args.base),
    )
    print(f"merged {loaded.root} into {args.base}: {len(mm)} tensors -> {final}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)

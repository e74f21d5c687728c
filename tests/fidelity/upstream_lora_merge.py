"""Child process: MindSpeed-MM's own `WanConverter.merge_lora_to_base` on CPU.

Usage: `python upstream_lora_merge.py MM_TREE BASE_DIR LORA_DIR TARGET_DIR RANK ALPHA`. The converter is
MindSpeed-MM's (`checkpoint/sora_model/wan_converter.py` of MM_TREE), called as its CLI calls it, with
`use_npu=False`. Its merge helper (`checkpoint/common/merge_base_lora_weight.py`) imports
`mindspeed.megatron_adaptor` and `torch_npu` at module level without using them on this path, so those two
(and `mindspeed`) are stubs (`stubs.StubModule`), put in place after the converter is imported; everything that reads, merges and writes is upstream's.
Prints one JSON line: {"ok", "error", "checkpoint" (the file `checkpoint` was imported from)}.
"""

from __future__ import annotations

import json
import sys
import traceback

from stubs import StubModule


def main() -> int:
    tree, base, lora, target, rank, alpha = sys.argv[1:7]
    sys.path.insert(0, tree)
    line: dict[str, object] = {"ok": True, "error": None}
    try:
        from checkpoint.sora_model.convert_utils.cfg import ConvertConfig, ParallelConfig
        from checkpoint.sora_model.wan_converter import WanConverter

        # after the converter's own imports (transformers/accelerate probe for torch_npu and must not find it)
        for name in ("torch_npu", "mindspeed", "mindspeed.megatron_adaptor"):
            sys.modules[name] = StubModule(name)
        cfg = ConvertConfig(source_path=base, lora_path=lora, target_path=target,
                            target_parallel_config=ParallelConfig())  # fmt: skip
        WanConverter().merge_lora_to_base(cfg, lora_rank=int(rank), lora_alpha=int(alpha), use_npu=False)
    except Exception:  # reported to the parent, which fails with the traceback
        line.update(ok=False, error=traceback.format_exc())
    line["checkpoint"] = getattr(sys.modules.get("checkpoint"), "__file__", None)
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

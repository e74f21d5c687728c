"""`python -m runtime.vlm_train`: fine-tune Qwen2.5-VL with MindSpeed-MM's configs, flags and checkpoints.

Run it under torchrun like `pretrain_vlm.py` (`--mm-data data.json --mm-model model.json` + Megatron flags).
It trains transformers' own `Qwen2_5_VLForConditionalGeneration` on MindSpeed-MM's MLLM data as MindSpeed-MM
prepares it (`runtime.vlmdata`), with the Wan trainer's machinery (`runtime.train.Trainer`: FSDP2 over every
rank, grad accumulation, Megatron's log lines, resumable checkpoints with optimizer and RNG, the watchdog).
Checkpoints hold MindSpeed-MM's names and fused tensors (`mm_agent.convert.vlm_state`, the converter's own
table), so `--load` takes an `hf_to_mm` conversion and `mm_to_hf` exports what training saved. The model is
built from the Hugging Face config next to the tokenizer (`preprocess_parameters.model_name_or_path`), and
model.json must describe the same network; its `freeze` flags are honoured as MindSpeed-MM honours them (the
stock 3B/7B configs freeze the ViT and the projector).
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()  # before torch: a torch_npu without CANN must not crash `import torch`

import functools  # noqa: E402
import json  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from runtime import checkpoint as ckpt  # noqa: E402
from runtime import lora  # noqa: E402
from runtime import train as base  # noqa: E402
from runtime.dist import log0  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.mmconfig import require  # noqa: E402
from runtime.trainsets import Failed  # noqa: E402
from runtime.vlm_load import load_strict, read, to_hf  # noqa: E402

LORA_TARGETS = (
    Path(__file__).resolve().parents[1] / "mm_agent" / "registry" / "data" / "vlm_lora_targets.yaml"
)
CONVERT_FIX = (
    "convert the Hugging Face weights first (`mm-agent convert Qwen2_5_VLConverter hf_to_mm --source <hf dir> "
    "--target <dir> --yes`) and pass that dir, or the training --save dir to resume"
)
# model.json field -> (HF config side, field): the network model.json describes must be the one built
CHECKED = (
    ("text_decoder.num_layers", "text", "num_hidden_layers"),
    ("text_decoder.hidden_size", "text", "hidden_size"),
    ("text_decoder.ffn_hidden_size", "text", "intermediate_size"),
    ("text_decoder.num_attention_heads", "text", "num_attention_heads"),
    ("text_decoder.num_query_groups", "text", "num_key_value_heads"),
    ("text_decoder.vocab_size", "text", "vocab_size"),
    ("image_encoder.vision_encoder.num_layers", "vision", "depth"),
    ("image_encoder.vision_encoder.hidden_size", "vision", "hidden_size"),
    ("image_encoder.vision_encoder.num_attention_heads", "vision", "num_heads"),
    ("image_encoder.vision_projector.hidden_size", "vision", "out_hidden_size"),
)


def _dotted(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class _Guarded(Dataset[Any]):
    """A bad record leaves a loader worker as a value (`Failed`), so its file/field/fix reach the log."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.inner[index]
        except RuntimeFailure as failure:
            return Failed(failure)


def _collate(items: list[Any], pad_token_id: int, label_pad_id: int) -> Any:
    from runtime.vlmdata import collate_vlm

    for item in items:
        if isinstance(item, Failed):
            return item
    return collate_vlm(items, pad_token_id, label_pad_id)


@functools.cache
def lora_targets() -> dict[str, tuple[str, ...]]:
    """MindSpeed-MM's LoRA target names -> transformers' module suffixes (registry data)."""
    import yaml

    data = yaml.safe_load(LORA_TARGETS.read_text(encoding="utf-8"))["qwen2_5_vl"]["targets"]
    return {str(k): tuple(str(v) for v in vs) for k, vs in data.items()}


def hf_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> tuple[str, ...]:
    """transformers' module suffixes for MindSpeed-MM's `--lora-target-modules` names (registry
    vlm_lora_targets.yaml), those this model has; an unknown name is refused with the known ones."""
    table = lora_targets()
    unknown = [t for t in targets if t not in table]
    if unknown:
        raise RuntimeFailure(
            f"--lora-target-modules {unknown[0]!r} is no Qwen2.5-VL module name MindSpeed-MM uses",
            field="--lora-target-modules",
            fix=f"use MindSpeed-MM's names: {' '.join(table)}",
        )
    names = [n for n, _ in model.named_modules()]
    suffixes = dict.fromkeys(s for t in targets for s in table[t])
    return tuple(s for s in suffixes if any(lora.matches(n, s) for n in names))


class VLMTrainer(base.Trainer):
    """The Wan trainer's loop and checkpoints around transformers' Qwen2.5-VL."""

    def _read_model_config(self, model_cfg: dict[str, Any], data_cfg: dict[str, Any]) -> None:
        self.model_cfg = model_cfg
        model_id = model_cfg.get("model_id")
        if model_id != "qwen2_5vl":
            raise RuntimeFailure(
                f"model_id is {model_id!r}; the bundled VLM runtime trains Qwen2.5-VL (model_id qwen2_5vl)",
                file=self.args.mm_model,
                field="model_id",
                fix="pass a Qwen2.5-VL model.json (render the job with mm-agent render --model qwen2.5vl)",
            )
        # the network is built from the Hugging Face config beside the tokenizer (read before --load)
        pre = require(data_cfg, "dataset_param.preprocess_parameters", self.args.mm_data)
        self.hf_dir = Path(str(require(pre, "model_name_or_path", self.args.mm_data)))
        config_file = self.hf_dir / "config.json"
        if not config_file.is_file():
            raise RuntimeFailure(
                f"no config.json in {self.hf_dir}",
                file=self.args.mm_data,
                field="dataset_param.preprocess_parameters.model_name_or_path",
                fix="point it at the Hugging Face Qwen2.5-VL dir (config, tokenizer, processor)",
            )
        self.hf_config = json.loads(config_file.read_text(encoding="utf-8"))
        self._check_model_json()

    def _dataset(self, data_cfg: dict[str, Any], model_cfg: dict[str, Any]) -> Any:
        from runtime.vlmdata import VLMSource

        source = VLMSource(self.args.mm_data, seq_length=self.args.seq_length)
        self.pad_token_id, self.label_pad_id = source.pad_token_id, source.label_pad_id
        return _Guarded(source)

    def _check_model_json(self) -> None:
        text = {**self.hf_config, **(self.hf_config.get("text_config") or {})}
        sides = {"text": text, "vision": self.hf_config.get("vision_config") or {}}
        wrong = []
        for dotted, side, field in CHECKED:
            want, have = _dotted(self.model_cfg, dotted), sides[side].get(field)
            if want is not None and have is not None and want != have:
                wrong.append(f"{dotted} {want} (config.json {side} {field} {have})")
        if wrong:
            raise RuntimeFailure(
                f"model.json describes another network than {self.hf_dir}/config.json: {'; '.join(wrong[:3])}",
                file=self.args.mm_model,
                field=wrong[0].split(" ")[0],
                fix="render the job again with --weights-dir pointing at these weights (model.json is written "
                "from their config.json), or point model_name_or_path at the weights model.json describes",
            )

    def _load(self, path: str) -> ckpt.Loaded:
        loaded = read(path)
        if not lora.is_adapter_state(loaded.model):
            loaded.model = to_hf(loaded.model, self.hf_config, str(loaded.root), CONVERT_FIX)
        return loaded

    def _build(self, loaded: ckpt.Loaded | None) -> torch.nn.Module:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        log0(self.rank, "building Qwen2.5-VL model ...")
        torch.manual_seed(self.args.seed)
        config = Qwen2_5_VLConfig.from_pretrained(self.hf_dir)
        model = Qwen2_5_VLForConditionalGeneration(config)
        if loaded is not None:
            self._log_loading(loaded)
            fix = "convert the weights these config.json and tokenizer belong to; " + CONVERT_FIX
            load_strict(model, loaded.model, str(loaded.root), fix)
        if self.args.recompute_granularity == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        frozen = self._freeze(model)
        if frozen:
            log0(self.rank, f"frozen by model.json: {', '.join(frozen)}")
        return model

    def _freeze(self, model: Any) -> list[str]:
        """MindSpeed-MM's `freeze: true` on the ViT, the projector and the LLM (requires_grad off)."""
        parts = {
            "image_encoder.vision_encoder": [model.model.visual.patch_embed, model.model.visual.blocks],
            "image_encoder.vision_projector": [model.model.visual.merger],
            "text_decoder": [model.model.language_model, model.lm_head],
        }
        frozen = []
        for dotted, modules in parts.items():
            if _dotted(self.model_cfg, f"{dotted}.freeze"):
                for module in modules:
                    module.requires_grad_(False)
                frozen.append(dotted)
        return frozen

    def _wrap(self, model: torch.nn.Module, adapter: ckpt.Loaded | None) -> None:
        """PEFT on the transformers modules MindSpeed-MM's target names stand for; the manifest keeps its names."""
        assert self.lora is not None
        mm_targets = self.lora.targets
        self.lora = replace(self.lora, targets=hf_targets(model, mm_targets))
        try:
            super()._wrap(model, adapter)
        finally:
            self.lora = replace(self.lora, targets=mm_targets)

    def _fsdp_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        inner: Any = model.model
        return [*inner.visual.blocks, *inner.language_model.layers]

    def _checkpoint_state(self, model_sd: dict[str, Any]) -> dict[str, Any]:
        from mm_agent.convert import vlm_state

        return vlm_state.hf_to_mm(model_sd, self.hf_config)

    def _collate(self) -> Any:
        return functools.partial(_collate, pad_token_id=self.pad_token_id, label_pad_id=self.label_pad_id)

    def _micro_loss(self, batch: Any, iteration: int, micro: int) -> torch.Tensor:
        """Next-token cross entropy over the answer tokens (labels -100 elsewhere), as transformers computes it."""
        if isinstance(batch, Failed):
            batch.raise_()
        if not bool((batch["labels"][:, 1:] != -100).any()):
            raise RuntimeFailure(
                "a micro batch has no answer tokens to learn from (every label is masked)",
                file=self.args.mm_data,
                field="basic_parameters.dataset",
                fix="check that the records have assistant turns and that cutoff_len keeps them",
            )
        dev = self.device.torch_device
        inputs = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        with self._autocast():
            loss = self.model(**inputs).loss
        return loss.float()


def main(argv: list[str] | None = None) -> int:
    return base.main(argv, trainer=VLMTrainer)


if __name__ == "__main__":
    run_main(main)

"""What the training will load, judged by MindSpeed-MM: the report's "parameters loaded M of M" column.

For each case (a registry model, task, backend and size whose converter and model run on CPU) and each
MindSpeed-MM version: a tiny Hugging Face checkpoint is built from the model's own config class (transformers' or
diffusers' as installed, or MindSpeed-MM's own for an FSDP2-native model), the job is rendered by `render_job` with
that checkpoint as its weights (TP 1, PP 1: one rank file), and `upstream_load.py` (a child process per case and
version) runs the conversion command render lists with MindSpeed-MM's own converter CLI, then builds the job's
training model on the meta device with MindSpeed-MM's own code from the rendered launch and model config:
`pretrain_vlm.py` / `pretrain_sora.py` (Megatron), `pretrain_transformers.py` (its YAML launch; a Hugging Face
model under Megatron's torch_dcp load) or the FSDP2-native trainer. The converted tensors are compared with the
parameters the model requests: "N of M parameters would load" (same name and shape). A case whose converter and
model code are the same at both versions may run at one (`only`), as long as every version of its model has a case.

`rows(upstream)` gives one cell per (model, version) of every registered model: "M of M" (`ok`), "N of M:
<why>" (not ok), or, for a model no case covers, why the check does not run on CPU
(`registry/data/load_keys.yaml` `not_run`, `ok: None`). tests/fidelity/test_load_keys.py asserts the cells and
that the static checks (mm_agent/loadcheck.py) agree with them.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fidelity.report_cell import Cell

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
CHILD = HERE / "upstream_load.py"
VERSIONS = ("26.0.0", "26.1.0")
TIMEOUT_S = 300


@dataclass(frozen=True)
class LoadCase:
    id: str
    model: str
    task: str
    backend: str
    size: str
    kind: str  # megatron | fsdp | transformers (pretrain_transformers.py: Megatron + FSDP2 over a Hugging Face model)
    layout: str  # mm | dcp: what the conversion writes
    weights: str  # folder name of the tiny checkpoint (the job's weights_dir)
    # the launch's --mm-model config: dotted key -> value, the tiny checkpoint's dims
    shrink_config: dict[str, Any] = field(default_factory=dict)
    # the launch's own size flags, where it passes them (GPT_ARGS --vocab-size)
    shrink_argv: dict[str, str] = field(default_factory=dict)
    # conversion argv flag -> value: the tiny checkpoint's layer split
    shrink_convert: dict[str, str] = field(default_factory=dict)
    make: dict[str, Any] | None = None  # upstream_load.py `make`: the checkpoint from the native class
    # instead of the rendered command (a wrong one, for contrast)
    converter_argv: tuple[str, ...] | None = None
    # mm-agent counts this load statically (loadcheck: a predictor of load_keys.yaml, or an FSDP2-native model);
    # the VLMs' Megatron load is strict (a mismatch fails at load), so they have no static list
    static: bool = False
    # the versions it runs at (None: every version the task has); a model whose code and converter are the same at
    # both versions runs one of its cases per version, so each version is checked (CI time, test_load_keys.py)
    only: tuple[str, ...] | None = None


# The tiny Qwen2.5-VL of tests/test_convert_qwen.py (tied, as the 3B is): ViT depth 2, hidden 32, MLP 48, 2 heads,
# merger out 64; LLM 4 layers, hidden 64, MLP 96, 4 heads, 2 KV heads, vocab 128.
_QWEN25_TINY = {
    "image_encoder.vision_encoder.num_layers": 2,
    "image_encoder.vision_encoder.hidden_size": 32,
    "image_encoder.vision_encoder.ffn_hidden_size": 48,
    "image_encoder.vision_encoder.intermediate_size": 48,
    "image_encoder.vision_encoder.num_attention_heads": 2,
    "image_encoder.vision_encoder.llm_hidden_size": 32,
    "image_encoder.vision_encoder.pipeline_num_layers": [2],
    "image_encoder.vision_encoder.fullatt_block_indexes": [1],
    "image_encoder.vision_projector.input_size": 32,
    "image_encoder.vision_projector.hidden_size": 64,
    "image_encoder.vision_projector.ffn_hidden_size": 128,
    "text_decoder.num_layers": 4,
    "text_decoder.pipeline_num_layers": [4],
    "text_decoder.hidden_size": 64,
    "text_decoder.ffn_hidden_size": 96,
    "text_decoder.num_attention_heads": 4,
    "text_decoder.num_query_groups": 2,
    "text_decoder.vocab_size": 128,
    "text_decoder.mrope_section": [2, 2, 4],
}
# A tiny Qwen2-VL (transformers' Qwen2VLConfig, tied as the 2B is): ViT depth 2, embed 32, MLP 128, 2 heads, merger
# out 64; LLM as the Qwen2.5-VL above. Its launch names the stock examples/qwen2vl/model_2b.json.
_QWEN2VL_TINY = {
    "image_encoder.vision_encoder.num_layers": 2,
    "image_encoder.vision_encoder.hidden_size": 32,
    "image_encoder.vision_encoder.ffn_hidden_size": 128,
    "image_encoder.vision_encoder.llm_hidden_size": 64,
    "image_encoder.vision_encoder.num_attention_heads": 2,
    "image_encoder.vision_encoder.pipeline_num_layers": [2],
    "image_encoder.vision_projector.input_size": 32,
    "image_encoder.vision_projector.hidden_size": 64,
    "image_encoder.vision_projector.ffn_hidden_size": 128,
    "text_decoder.num_layers": 4,
    "text_decoder.pipeline_num_layers": [4],
    "text_decoder.hidden_size": 64,
    "text_decoder.ffn_hidden_size": 96,
    "text_decoder.num_attention_heads": 4,
    "text_decoder.num_query_groups": 2,
    "text_decoder.vocab_size": 128,
    "text_decoder.mrope_section": [2, 2, 4],
}
# A tiny GLM-4.1V (transformers' Glm4vConfig, untied as the 9B is): ViT depth 2, hidden 32, 2 heads, 28 px images of
# 14 px patches, downsampled to the LLM's 64, merger MLP 96; LLM 4 layers, hidden 64, MLP 96, 4 heads, 2 KV heads,
# vocab 128. Its launch names the stock examples/glm4.1v/model_9b.json.
_GLM41V_TINY = {
    "image_encoder.vision_encoder.num_layers": 2,
    "image_encoder.vision_encoder.pipeline_num_layers": [2],
    "image_encoder.vision_encoder.hidden_size": 32,
    "image_encoder.vision_encoder.out_hidden_size": 64,
    "image_encoder.vision_encoder.ffn_hidden_size": 64,
    "image_encoder.vision_encoder.num_attention_heads": 2,
    "image_encoder.vision_encoder.image_size": 28,
    "image_encoder.vision_projector.out_hidden_size": 64,
    "image_encoder.vision_projector.intermediate_size": 96,
    "text_decoder.num_layers": 4,
    "text_decoder.pipeline_num_layers": [4],
    "text_decoder.hidden_size": 64,
    "text_decoder.ffn_hidden_size": 96,
    "text_decoder.num_attention_heads": 4,
    "text_decoder.num_query_groups": 2,
    "text_decoder.num_key_value_heads": 2,
    "text_decoder.vocab_size": 128,
    "text_decoder.mrope_section": [1, 1, 2],
}
# A tiny Qwen2.5-Omni thinker (transformers' Qwen2_5OmniConfig, untied as the 7B is): ViT as the Qwen2.5-VL above,
# audio encoder 2 layers of width 32 (2 heads, MLP 64, out 64), LLM as above. Its job renders model.json.
_QWEN25_OMNI_TINY = {
    **{
        k: v
        for k, v in _QWEN25_TINY.items()
        if not k.startswith("image_encoder.vision_encoder.llm_hidden_size")
    },
    "image_encoder.vision_encoder.llm_hidden_size": 64,
    "audio_encoder.audio_encoder.num_layers": 2,
    "audio_encoder.audio_encoder.pipeline_num_layers": [2],
    "audio_encoder.audio_encoder.hidden_size": 32,
    "audio_encoder.audio_encoder.d_model": 32,
    "audio_encoder.audio_encoder.ffn_hidden_size": 64,
    "audio_encoder.audio_encoder.num_attention_heads": 2,
    "audio_encoder.audio_encoder.output_dim": 64,
}
_VLM_LAYERS = {"--cfg.parallel_config.llm_pp_layers": "[[4]]", "--cfg.parallel_config.vit_pp_layers": "[[2]]"}
# A tiny Qwen3-VL-MoE (the 30B-A3B's structure): ViT depth 2 with two deepstack mergers, LLM 2 MoE layers of 4
# experts.
_QWEN3VL_MOE_TINY = {
    "model_type": "qwen3_vl_moe",
    "model_id": "qwen3_vl_moe",
    "plugin": "mindspeed_mm/fsdp/models/qwen3vl",
    "config": {
        "text_config": {
            "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4,
            "num_experts_per_tok": 2, "vocab_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2]}, "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
            "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 16, "patch_size": 4,
            "spatial_merge_size": 2,
        },
    },
}  # fmt: skip

# A tiny Qwen3-ASR (the 1.7B's structure: an audio encoder and a Qwen3 LLM whose output head is tied to the input
# embedding, so the checkpoint stores the embedding once), from MindSpeed-MM's own class and config (26.1.0 only).
# The top level says tie_word_embeddings false, as the README's run must have it: with the default (true) 26.1.0's
# trainer cannot re-tie this class (retie_embeddings raises: Qwen3ASRForConditionalGeneration has no
# get_input_embeddings), and the README converts with --tie_weight_mapping so the untied head finds its weights.
_QWEN3_ASR_TINY = {
    "model_type": "qwen3_asr",
    "model_id": "qwen3_asr",
    "plugin": "mindspeed_mm/fsdp/models/qwen3_asr",
    "config": {
        "tie_word_embeddings": False,
        "thinker_config": {
            "audio_config": {
                "num_mel_bins": 16, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 32,
                "d_model": 16, "output_dim": 32, "downsample_hidden_size": 8, "max_source_positions": 64,
            },
            "text_config": {
                "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": True,
            },
        },
    },
}  # fmt: skip

# A tiny Qwen3.5 dense model (the 4B's structure: tied embeddings, linear- and full-attention layers), saved by
# transformers' own Qwen3_5ForConditionalGeneration: MindSpeed-MM pins transformers 5 (5.2.0) for Qwen3.5.
_QWEN35_TINY = {
    "text_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 2, "tie_word_embeddings": True,
    },
    "vision_config": {
        "depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
        "num_position_embeddings": 16, "patch_size": 4, "spatial_merge_size": 2,
    },
    "tie_word_embeddings": True,
}  # fmt: skip
# Wan2.2's transformers (diffusers' WanTransformer3DModel, as the released Diffusers repos' transformer/config.json
# name it): TI2V-5B has 48 latent channels in and out (render then sets the 5B's seperated_timestep), the A14B
# experts 16 (T2V) or 36 = 16 + 16 + 4 (I2V: latents, image latents and mask) in and 16 out; Wan2.2 has no CLIP
# image embedder (image_dim unset). Tiny otherwise: 2 heads of 8, 4 layers.
_WAN22_CHANNELS = {"ti2v": (48, 48), "t2v": (16, 16), "i2v": (36, 16)}
# Wan2.2 jobs encode online: SoRAModel also builds the VAE and the UMT5 encoder, each by from_pretrained from the
# Hugging Face repo's own vae/ and text_encoder/ folders (not from --load: SoRAModel's state_dict and load are the
# predictor's, mindspeed_mm/models/sora_model.py:254-272 at 26.0.0); built as for precomputed features instead,
# the predictor the load fills is the same.
_ONLINE_ENCODERS_OFF = {"load_video_features": True, "load_text_features": True}
# The tiny VACE above as the job's predictor (VACE jobs are not sized from the weights: the rendered 1.3B config,
# its Wan part and its vace_dit part, at the tiny dims)
_VACE_TINY = {
    **{f"predictor.{k}": v for k, v in {"in_dim": 4, "out_dim": 4, "hidden_size": 16, "ffn_dim": 32, "freq_dim": 16,
                                          "text_dim": 16, "num_heads": 2, "num_layers": 4, "pipeline_num_layers": [4],
                                          "max_seq_len": 32}.items()},
    **{f"predictor.vace_dit.{k}": v for k, v in {"in_dim": 24, "out_dim": 4, "hidden_size": 16, "ffn_dim": 32,
                                                   "freq_dim": 16, "text_dim": 16, "num_heads": 2, "max_seq_len": 32,
                                                   "vace_layers": [0, 2], "pipeline_num_layers": [4]}.items()},
}  # fmt: skip
CASES = (
    LoadCase(
        "wan2.1-t2v",
        "wan2.1",
        "t2v",
        "megatron",
        "1.3b",
        "megatron",
        "mm",
        "Wan2.1-T2V-1.3B-Diffusers",
        static=True,
        only=("26.0.0",),  # WanConverter, WanDiT and SoRAModel differ only in whitespace between the versions
    ),
    LoadCase(
        "wan2.1-i2v",
        "wan2.1",
        "i2v",
        "megatron",
        "14b",
        "megatron",
        "mm",
        "Wan2.1-I2V-14B-480P-Diffusers",
        static=True,
        only=("26.1.0",),
    ),
    LoadCase(
        "wan2.2-ti2v",
        "wan2.2",
        "ti2v",
        "megatron+fsdp2",
        "5b",
        "megatron",
        "mm",
        "Wan2.2-TI2V-5B-Diffusers",
        shrink_config=_ONLINE_ENCODERS_OFF,
        static=True,
        only=("26.0.0",),  # as Wan2.1's
    ),
    LoadCase(
        "wan2.2-i2v",
        "wan2.2",
        "i2v",
        "megatron+fsdp2",
        "a14b",
        "megatron",
        "mm",
        "Wan2.2-I2V-A14B-Diffusers",
        shrink_config=_ONLINE_ENCODERS_OFF,
        static=True,
        only=("26.1.0",),
    ),
    LoadCase(
        "vace-v2v",
        "vace",
        "v2v",
        "megatron+fsdp2",
        "1.3b",
        "megatron",
        "mm",
        "Wan2.1-VACE-1.3B",
        shrink_config=_VACE_TINY,
    ),
    LoadCase(
        "qwen2.5vl-sft",
        "qwen2.5vl",
        "sft",
        "megatron",
        "3b",
        "megatron",
        "mm",
        "Qwen2.5-VL-3B-Instruct",
        shrink_config=_QWEN25_TINY,
        shrink_argv={"--vocab-size": "128"},
        shrink_convert=_VLM_LAYERS,
    ),
    LoadCase(
        "qwen2vl-sft",
        "qwen2vl",
        "sft",
        "megatron",
        "2b",
        "megatron",
        "mm",
        "Qwen2-VL-2B-Instruct",
        shrink_config=_QWEN2VL_TINY,
        shrink_argv={"--vocab-size": "128"},
        shrink_convert=_VLM_LAYERS,
    ),
    LoadCase(
        "qwen2.5omni-sft",
        "qwen2.5omni",
        "sft",
        "megatron",
        "7b",
        "megatron",
        "mm",
        "Qwen2.5-Omni-7B",
        shrink_config=_QWEN25_OMNI_TINY,
        shrink_argv={"--vocab-size": "128"},
        shrink_convert={**_VLM_LAYERS, "--cfg.parallel_config.audio_pp_layers": "[[2]]"},
    ),
    LoadCase(
        "glm4.1v-sft",
        "glm4.1v",
        "sft",
        "megatron",
        "9b",
        "megatron",
        "mm",
        "GLM-4.1V-9B-Thinking",
        shrink_config=_GLM41V_TINY,
        shrink_argv={"--vocab-size": "128"},
        shrink_convert=_VLM_LAYERS,
    ),
    LoadCase("glm4.5v-sft", "glm4.5v", "sft", "megatron+fsdp2", "106b", "transformers", "dcp", "GLM-4.5V"),
    LoadCase(
        "magistral-2509-sft",
        "magistral-2509",
        "sft",
        "megatron+fsdp2",
        "default",
        "transformers",
        "dcp",
        "Magistral-Small-2509",
    ),
    LoadCase(  # 26.1.0 has the fsdp2-native case below
        "qwen3omni-sft",
        "qwen3omni",
        "sft",
        "megatron+fsdp2",
        "30b",
        "transformers",
        "dcp",
        "Qwen3-Omni-30B-A3B-Instruct",
        only=("26.0.0",),
    ),
    LoadCase(
        "qwen3omni-native",
        "qwen3omni",
        "sft",
        "fsdp2-native",
        "30b",
        "fsdp",
        "dcp",
        "Qwen3-Omni-30B-A3B-Instruct",
    ),
    LoadCase(
        "qwen3vl-native",
        "qwen3vl",
        "sft",
        "fsdp2-native",
        "30b",
        "fsdp",
        "dcp",
        "Qwen3-VL-30B-A3B-Instruct",
        make=_QWEN3VL_MOE_TINY,
        static=True,
    ),
    LoadCase(
        "qwen3_asr-native",
        "qwen3_asr",
        "asr",
        "fsdp2-native",
        "1.7b",
        "fsdp",
        "dcp",
        "Qwen3-ASR-1.7B",
        make=_QWEN3_ASR_TINY,
        static=True,
    ),
    LoadCase(
        "qwen3_5-native", "qwen3_5", "sft", "fsdp2-native", "4b", "fsdp", "dcp", "Qwen3.5-4B", static=True
    ),
    LoadCase(
        "qwen3_6-native", "qwen3_6", "sft", "fsdp2-native", "27b", "fsdp", "dcp", "Qwen3.6-27B", static=True
    ),
)
# What the Qwen3-VL fsdp2-native job rendered before issue 26 (the megatron+fsdp2 trainer's converter), run for
# contrast: the native model finds none of its names in that checkpoint.
WRONG_QWEN3VL = LoadCase(
    "qwen3vl-native-qwen3vlconverter", "qwen3vl", "sft", "fsdp2-native", "30b", "fsdp", "dcp",
    "Qwen3-VL-30B-A3B-Instruct", make=_QWEN3VL_MOE_TINY, static=True, only=("26.1.0",),
    converter_argv=("mm-convert", "Qwen3VLConverter", "hf_to_dcp", "--hf_dir", "{weights}", "--dcp_dir", "{load}"),
)  # fmt: skip
# What the Qwen3-ASR job rendered before: the README's conversion without its --tie_weight_mapping, so the DCP
# checkpoint lacks the output head the trained model asks for (examples/qwen3_asr/README.md:98-101 at 26.1.0).
WRONG_QWEN3_ASR = LoadCase(
    "qwen3_asr-native-untied", "qwen3_asr", "asr", "fsdp2-native", "1.7b", "fsdp", "dcp", "Qwen3-ASR-1.7B",
    make=_QWEN3_ASR_TINY, static=True,
    converter_argv=("mm-convert", "GenericDCPConverter", "hf_to_dcp", "--hf_dir", "{weights}", "--dcp_dir", "{load}"),
)  # fmt: skip


def _build(case: LoadCase, weights: Path) -> None:
    """The tiny Hugging Face checkpoint of a case (FSDP2-native ones are made by the child from the model)."""
    if case.make is not None:
        return
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    if case.model == "wan2.1":
        from test_convert_wan import build

        build(case.task).save_pretrained(weights / "transformer")
    elif case.model == "wan2.2":
        _wan22(case).save_pretrained(weights / "transformer")
    elif case.model == "vace":
        _vace_original(weights / "original")
    elif case.model == "qwen2.5vl":
        from test_convert_qwen import build_model

        build_model(weights, tie=True)
    elif case.model == "qwen2vl":
        import torch
        import transformers

        config = transformers.Qwen2VLConfig(
            text_config={
                "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
                "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}, "tie_word_embeddings": True,
            },
            vision_config={"depth": 2, "embed_dim": 32, "mlp_ratio": 4, "num_heads": 2, "hidden_size": 64},
            tie_word_embeddings=True,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Qwen2VLForConditionalGeneration(config).save_pretrained(weights)
    elif case.model == "qwen2.5omni":
        import torch
        import transformers

        # the thinker, which is what MindSpeed-MM trains; the released checkpoint's talker.* and token2wav.* are
        # not built (enable_audio_output=False): the conversion keeps only the thinker's names (its stage schemas)
        config = transformers.Qwen2_5OmniConfig(
            thinker_config={
                "text_config": {
                    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
                    "tie_word_embeddings": False,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 2, 4]},
                },
                "vision_config": {
                    "depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                    "fullatt_block_indexes": [1],
                },
                "audio_config": {
                    "encoder_layers": 2, "d_model": 32, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                    "output_dim": 64,
                },
            },
            enable_audio_output=False,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Qwen2_5OmniForConditionalGeneration(config).save_pretrained(weights)
    elif case.model == "glm4.5v":
        import torch
        import transformers

        # GLM-4.5V's structure: a dense first layer, then MoE layers of routed experts and a shared one; the
        # checkpoint keeps one tensor per expert (transformers 5 saves its fused experts back so)
        config = transformers.Glm4vMoeConfig(
            text_config={
                "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
                "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                "partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "tie_word_embeddings": False,
            },
            vision_config={
                "depth": 2, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 32, "intermediate_size": 64,
                "image_size": 28, "patch_size": 14,
            },
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Glm4vMoeForConditionalGeneration(config).save_pretrained(weights)
    elif case.model == "magistral-2509":
        import torch
        import transformers

        # Magistral Small 2509's structure (transformers' Mistral3: a Pixtral vision tower, a patch-merging
        # projector and a Mistral LLM, untied)
        config = transformers.Mistral3Config(
            text_config={
                "model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
                "tie_word_embeddings": False,
            },
            vision_config={
                "model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "head_dim": 8, "image_size": 56, "patch_size": 14,
            },
            spatial_merge_size=2,
            tie_word_embeddings=False,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Mistral3ForConditionalGeneration(config).save_pretrained(weights)
    elif case.model == "qwen3omni":
        import torch
        import transformers

        # Qwen3-Omni-30B-A3B's thinker (what MindSpeed-MM trains): vision with deepstack mergers, an audio encoder
        # and a MoE LLM whose checkpoint keeps one tensor per expert; the talker and code2wav are not built
        config = transformers.Qwen3OmniMoeConfig(
            thinker_config={
                "text_config": {
                    "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
                    "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "tie_word_embeddings": False,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2],
                                        "mrope_interleaved": True},
                },
                "vision_config": {
                    "depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
                    "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 16, "patch_size": 4,
                    "spatial_merge_size": 2,
                },
                "audio_config": {
                    "encoder_layers": 2, "d_model": 16, "encoder_attention_heads": 2, "encoder_ffn_dim": 32,
                    "output_dim": 32, "num_mel_bins": 16, "downsample_hidden_size": 8, "max_source_positions": 64,
                },
            },
            enable_audio_output=False,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Qwen3OmniMoeForConditionalGeneration(config).save_pretrained(weights)
    elif case.model == "glm4.1v":
        import torch
        import transformers

        config = transformers.Glm4vConfig(
            text_config={
                "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
                "partial_rotary_factor": 0.5,
            },
            vision_config={
                "depth": 2, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64, "intermediate_size": 96,
                "image_size": 28, "patch_size": 14,
            },
            tie_word_embeddings=False,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.Glm4vForConditionalGeneration(config).save_pretrained(weights)
    elif case.model in ("qwen3_5", "qwen3_6"):  # Qwen3.6's dense 27B is the Qwen3.5 model, untied
        import torch
        import transformers

        tied = case.model == "qwen3_5"
        config = {**_QWEN35_TINY, "tie_word_embeddings": tied}
        config["text_config"] = {**_QWEN35_TINY["text_config"], "tie_word_embeddings": tied}
        torch.manual_seed(0)
        model = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(**config))
        model.save_pretrained(weights)
    else:
        raise ValueError(f"no tiny checkpoint for {case.id}")


def _wan22(case: LoadCase) -> Any:
    import diffusers
    import torch

    in_channels, out_channels = _WAN22_CHANNELS[case.task]
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=in_channels,
        out_channels=out_channels, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=4, rope_max_seq_len=32,
    )  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


# The inverse of diffusers' own reading of Wan's original checkpoint names (single_file_utils.py
# convert_wan_transformer_to_diffusers, which reads VACE's before_proj / after_proj too), applied in order.
_DIFFUSERS_TO_WAN = (
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("attn1.", "self_attn."), ("attn2.", "cross_attn."), (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."),
    (".to_v.", ".v."), (".norm2.", ".norm3."), ("ffn.net.0.proj.", "ffn.0."), ("ffn.net.2.", "ffn.2."),
    (".proj_in.", ".before_proj."), (".proj_out.", ".after_proj."), (".scale_shift_table", ".modulation"),
)  # fmt: skip


def _vace_original(folder: Path) -> None:
    """A tiny Wan2.1-VACE checkpoint in the layout of the released Wan-AI/Wan2.1-VACE-1.3B (Wan's own names, what
    VACEConverter hf_to_mm reads): diffusers' WanVACETransformer3DModel (2 heads of 8, 4 layers, VACE blocks at 0
    and 2, 24 VACE input channels) renamed to Wan's names, and checked to be exactly what diffusers' single-file
    loader reads back into that model."""
    import diffusers
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = diffusers.WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=4, rope_max_seq_len=32, vace_layers=[0, 2],
        vace_in_channels=24,
    )  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    original: dict[str, Any] = {}
    for name, tensor in state.items():
        if name == "scale_shift_table":
            name = "head.modulation"
        elif name.startswith("proj_out."):
            name = "head.head." + name.removeprefix("proj_out.")
        else:
            for old, new in _DIFFUSERS_TO_WAN:
                name = name.replace(old, new)
        original[name] = tensor
    back = convert_wan_transformer_to_diffusers(dict(original))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(original, str(folder / "diffusion_pytorch_model.safetensors"))


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    assert leaf in node, f"{key} is not in the rendered config"
    node[leaf] = value


@dataclass
class Outcome:
    """One case at one version: what MindSpeed-MM converted and what its model requests."""

    prep: Prepared
    made: dict[str, list[int]] | None  # FSDP2-native: the tiny Hugging Face checkpoint the child saved
    converted: dict[str, list[int]] | None
    model: dict[str, list[int]] | None
    error: str | None
    stubbed: list[str]
    shared: dict[str, str] = field(default_factory=dict)  # a parameter that is another's tensor at load time

    @property
    def case(self) -> LoadCase:
        return self.prep.case

    @property
    def version(self) -> str:
        return self.prep.version

    def fills(self, name: str) -> bool:
        """The checkpoint holds the name with the model's shape, or the tensor it shares at load time."""
        have, shape = self.converted or {}, (self.model or {}).get(name)
        partner = self.shared.get(name)
        return have.get(name) == shape or (partner is not None and have.get(partner) == shape)

    @property
    def loaded(self) -> int:
        return sum(1 for name in self.model or {} if self.fills(name))

    @property
    def total(self) -> int:
        return len(self.model or {})

    def missing(self) -> list[str]:
        return [n for n in self.model or {} if not self.fills(n)]

    def cell(self) -> Cell:
        if self.error is not None or not self.model:
            return Cell(False, f"check failed: {(self.error or 'no model').strip().splitlines()[-1][:200]}")
        if self.loaded == self.total:
            return Cell(True, f"{self.loaded:,} of {self.total:,}")
        shown = ", ".join(self.missing()[:3])
        return Cell(False, f"{self.loaded:,} of {self.total:,}: the rest start random (e.g. {shown})")


def _conversion(next_steps: list[str]) -> list[str]:
    """The argv of the conversion render lists (`cd <MM root> && mm-convert ...` or `python -c ...`)."""
    for step in next_steps:
        if step.startswith("#"):
            continue
        words = shlex.split(step)
        if "&&" in words:
            words = words[words.index("&&") + 1 :]
        if words[:1] == ["mm-convert"] or (
            words[:2] in (["python", "-c"], ["python3", "-c"]) and "convert_cli" in words[2]
        ):
            return words
    raise AssertionError(f"render lists no conversion: {next_steps}")


def _launch(job_dir: Path, mm_root: Path) -> tuple[str, list[str]]:
    """(entry script, argv) of the job's training launch, as mm-agent's validator evaluates the script."""
    from mm_agent.validate.files import walk
    from mm_agent.validate.findings import Sink
    from mm_agent.validate.job import Job
    from mm_agent.validate.refs import build_launches, load_inputs
    from mm_agent.validate.rules_mmparser import argv_of

    job = Job(Sink(), None, str(mm_root))
    job.inputs.append(job_dir)
    load_inputs(job, walk(job_dir))
    job.find_mm_root()
    build_launches(job)
    launch = next(ln for ln in job.launches if ln.is_training and not ln.is_feature)
    argv = argv_of(launch)
    assert argv is not None, f"the training launch of {job_dir} is not known statically"
    return launch.entry, argv


def _sdpa(node: Any) -> None:
    """Every `attn_implementation` under a model config set to sdpa, with sdpa's tensor layout (in place)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "attn_implementation":
                node[key] = "sdpa"
            elif key == "attn_layout":
                node[key] = "BNSD"
            else:
                _sdpa(value)
    elif isinstance(node, list):
        for value in node:
            _sdpa(value)


def _from_pretrained(launch_argv: list[str], mm: Path) -> Path:
    """The converted checkpoint a predictor loads through its model config's `predictor.from_pretrained` (PredictModel
    calls load_checkpoint on it, mindspeed_mm/models/predictor/predict_model.py:52-56 at 26.0.0): the checkpoint
    folder holding the rank file it names, or the path itself when it names a folder (which that load refuses)."""
    named = Path(launch_argv[launch_argv.index("--mm-model") + 1])
    data = json.loads((named if named.is_absolute() else mm / named).read_text(encoding="utf-8"))
    path = Path(data["predictor"]["from_pretrained"])
    return path.parents[2] if path.suffix in (".pt", ".pth") else path


@dataclass
class Prepared:
    """A case rendered, its tiny checkpoint built and its child's spec written (run by `execute`)."""

    case: LoadCase
    version: str
    work: Path
    argv: list[str]
    job_dir: Path
    load_dir: Path
    weights_dir: Path
    request: Any  # the RenderRequest (tests re-render it once the checkpoint exists)


def prepare(case: LoadCase, version: str, upstream: Path, base: Path) -> Prepared:
    """Render one case at one version, build its tiny checkpoint and write the child's spec (module docstring)."""
    from mm_agent.render import RenderRequest, render_job

    mm = upstream / "MindSpeed-MM" / f"v{version}"
    work = base / version / case.id
    if work.exists():
        shutil.rmtree(work)
    weights = work / "weights" / case.weights
    weights.mkdir(parents=True, exist_ok=True)
    _build(case, weights)
    job_dir = work / "job"
    request = RenderRequest(
        model=case.model, task=case.task, backend=case.backend, size=case.size, mm_version=version,  # type: ignore[arg-type]
        mm_root=str(mm), weights_dir=str(weights), tp=1, pp=1, cp=1, out_dir=str(job_dir), confirm=True, force=True,
    )  # fmt: skip
    result = render_job(request)
    argv = _conversion(result.next_steps)
    for flag, value in case.shrink_convert.items():
        argv[argv.index(flag) + 1] = value
    spec: dict[str, Any] = {
        "mm": str(mm),
        "mindspeed": str(upstream / "MindSpeed" / f"{version}_core_r0.12.1"),
        "megatron": str(upstream / "Megatron-LM" / "core_v0.12.1"),
        "cwd": str(mm),
        "out": str(work / "out.json"),
    }
    if case.make is not None:
        spec["make"] = {**case.make, "out": str(weights)}
    # what the training loads: the launch's --load, or the FSDP2-native config's training.load
    if case.kind == "megatron":
        entry, launch_argv = _launch(job_dir, mm)
        if "--load" in launch_argv:
            load_dir = Path(launch_argv[launch_argv.index("--load") + 1])
        else:  # a predictor that loads its converted file itself (VACE: predictor.from_pretrained, no --load)
            load_dir = _from_pretrained(launch_argv, mm)
        if (
            case.shrink_config
        ):  # the launch's model config (the job's, or the stock one it names), at tiny dims
            at = launch_argv.index("--mm-model") + 1
            named = Path(launch_argv[at])
            data = json.loads((named if named.is_absolute() else mm / named).read_text(encoding="utf-8"))
            for key, value in case.shrink_config.items():
                _set(data, key, value)
            tiny = work / "model_tiny.json"
            tiny.write_text(json.dumps(data, indent=4), encoding="utf-8")
            launch_argv[at] = str(tiny)
            for flag, value in case.shrink_argv.items():
                if flag in launch_argv:
                    launch_argv[launch_argv.index(flag) + 1] = value
        spec["model"] = {"kind": "megatron", "entry": entry, "argv": launch_argv}
    elif case.kind == "transformers":
        # one YAML holds the launch's flags (gpt_args, turned into argv by read_yaml_config.py) and its model
        # config (TransformersModel builds the Hugging Face class of model.init_from_hf_path's config.json)
        entry, launch_argv = _launch(job_dir, mm)
        train = yaml.safe_load(Path(launch_argv[0]).read_text(encoding="utf-8"))
        load_dir = Path(train["gpt_args"]["load"])
        # the attention implementation and its layout create no parameter, and flash-attn's package is absent on a
        # CPU machine (transformers refuses to build a model that names it): the model section's become sdpa's
        _sdpa(train["model"])
        launch_argv[0] = str(work / "train_cpu.yaml")
        Path(launch_argv[0]).write_text(yaml.safe_dump(train, sort_keys=False), encoding="utf-8")
        spec["model"] = {"kind": "megatron", "entry": entry, "argv": launch_argv, "prefix": "model."}
    else:
        reader = "parse_args" if version == "26.0.0" else "config_manager"
        config = yaml.safe_load((job_dir / "config.yaml").read_text(encoding="utf-8"))
        load_dir = Path(config["training"]["load"])
        spec["model"] = {"kind": "fsdp", "config": str(job_dir / "config.yaml"), "reader": reader}
    if case.converter_argv is not None:
        argv = [w.format(weights=weights, load=load_dir) for w in case.converter_argv]
    spec["convert"] = {"argv": argv, "target": str(load_dir), "layout": case.layout}
    (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    return Prepared(case, version, work, argv, job_dir, load_dir, weights, request)


def execute(prep: Prepared) -> Outcome:
    """Run the child on a prepared case and read what it wrote."""
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(prep.work / "spec.json")],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    out_path = prep.work / "out.json"
    if not out_path.is_file():
        error = proc.stderr[-4000:] or "the child wrote nothing"
        return Outcome(prep, None, None, None, error, [])
    out = json.loads(out_path.read_text(encoding="utf-8"))
    error = out["convert_error"] or out["model_error"]
    return Outcome(prep, out["made"], out["converted"], out["model"], error, out["stubbed"], out["shared"])


def run(case: LoadCase, version: str, upstream: Path, base: Path) -> Outcome:
    return execute(prepare(case, version, upstream, base))


def versions_of(case: LoadCase) -> list[str]:
    from mm_agent.registry import get_registry

    entry = get_registry().get(case.model)
    task = entry.task(case.task, case.backend)
    assert task is not None
    found = [v for v in VERSIONS if entry.versions.contains(v) and task.versions.contains(v)]
    return [v for v in found if case.only is None or v in case.only]


def run_all(
    upstream: Path, base: Path, cases: tuple[LoadCase, ...] = CASES, workers: int = 2
) -> list[Outcome]:
    """Every case at every version it has: prepared here one after the other, their children `workers` at a
    time (each is one process on one core)."""
    from concurrent.futures import ThreadPoolExecutor

    prepared = [prepare(case, v, upstream, base) for case in cases for v in versions_of(case)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(execute, prepared))


# ------------------------------------------------------------------------------------------------ the report
def not_run() -> dict[str, str]:
    """Why the check does not run on CPU, per registered model no case covers (registry data)."""
    from mm_agent.loadcheck import load_keys

    return dict(load_keys().not_run)


def cells(outcomes: list[Outcome]) -> dict[tuple[str, str], Cell]:
    """Every registered model at every version it has: the cases' verdicts (all of a model's cases at that
    version must load fully), else the reason the model is not checked."""
    from mm_agent.registry import get_registry

    reg = get_registry()
    by_key: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        by_key.setdefault((outcome.case.model, outcome.version), []).append(outcome)
    reasons = not_run()
    out: dict[tuple[str, str], Cell] = {}
    for entry in reg.models.values():
        for version in VERSIONS:
            if not entry.versions.contains(version):
                continue
            found = by_key.get((entry.id, version))
            if found:
                bad = [o for o in found if not o.cell().ok]
                parts = [f"{o.case.task}/{o.case.backend}: {o.cell().text}" for o in (bad or found)]
                out[(entry.id, version)] = Cell(not bad, "; ".join(parts))
            elif entry.id in reasons:
                kind, _, why = reasons[entry.id].partition(": ")
                label = {"source": "not runnable on CPU", "none": "no conversion"}.get(kind, "not run")
                out[(entry.id, version)] = Cell(
                    None, f"{label}: {why if kind in ('source', 'none') else reasons[entry.id]}"
                )
            elif entry.converter is None and all(t.converter is None for t in entry.tasks):
                out[(entry.id, version)] = Cell(
                    None, "no conversion step: the job reads the weights it is given itself"
                )
            else:
                out[(entry.id, version)] = Cell(
                    None, "unexplained: no case and no reason in load_keys.yaml not_run"
                )
    return out


def rows(upstream: Path, base: Path | None = None) -> dict[tuple[str, str], Cell]:
    """The report column "parameters loaded M of M" (runs every case: 5-10 s a case and version, two at a time)."""
    import tempfile

    if base is not None:
        return cells(run_all(upstream, base))
    with tempfile.TemporaryDirectory(prefix="mm-agent-load-") as tmp:
        return cells(run_all(upstream, Path(tmp)))

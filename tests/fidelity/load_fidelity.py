"""What the training will load, judged by MindSpeed-MM: the report's "parameters loaded M of M" column.

For each case (a registry model, task, backend and size whose converter and model run on CPU) and each
MindSpeed-MM version: a tiny Hugging Face checkpoint is built from the model's own config class, the job is
rendered by `render_job` with that checkpoint as its weights (TP 1, PP 1: one rank file), and
`upstream_load.py` (a child process per case and version) runs the conversion command render lists with
MindSpeed-MM's own converter CLI, then builds the job's training model on the meta device with MindSpeed-MM's
own code from the rendered launch and model config. The converted tensors are compared with the parameters the
model requests: "N of M parameters would load" (same name and shape).

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
    kind: str  # megatron | fsdp
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
    "Qwen3-VL-30B-A3B-Instruct", make=_QWEN3VL_MOE_TINY, static=True,
    converter_argv=("mm-convert", "Qwen3VLConverter", "hf_to_dcp", "--hf_dir", "{weights}", "--dcp_dir", "{load}"),
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
        load_dir = Path(launch_argv[launch_argv.index("--load") + 1])
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
    return [v for v in VERSIONS if entry.versions.contains(v) and task.versions.contains(v)]


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
    """The report column "parameters loaded M of M" (runs every case: about 5 s a case and version)."""
    import tempfile

    if base is not None:
        return cells(run_all(upstream, base))
    with tempfile.TemporaryDirectory(prefix="mm-agent-load-") as tmp:
        return cells(run_all(upstream, Path(tmp)))

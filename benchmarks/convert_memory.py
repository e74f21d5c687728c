"""Peak anonymous memory and wall time of `convert_weights` against what `mm-convert` does, same run.

Synthesises two checkpoints with real key names and shapes (taken from the diffusers / transformers model
classes built on the meta device, so no weights are allocated to learn them):
  * Wan2.1-1.3B transformer: hidden 1536, ffn 8960, 12 heads, text_dim 4096, freq 256, patch (1,2,2),
    --blocks blocks (30 = the real model, ~2.8 GB), bf16, sharded safetensors with an index;
  * Qwen2.5-VL-shaped: LLM hidden 2048, 16 heads, 2 KV groups, ffn 11008, --qwen-layers layers, --vocab;
    ViT hidden 1280, 16 heads, --vit-blocks blocks; bf16, sharded, untied lm_head.
Then, each in its own subprocess, cases Wan hf_to_mm PP=1 and PP=4, Wan mm_to_hf, Qwen hf_to_mm TP=2 for
  * mm-agent: `mm_agent.convert.engine.execute` (what `mm-agent convert ... --yes` runs in its worker),
  * baseline: what mm-convert does (`load_file` / `torch.load` every file whole, rename, clone per TP rank,
    `torch.save` / `save_file`), written here so it runs without MindSpeed-MM,
  * cp: `cp -r` of the same source bytes, the I/O floor.
Peak anonymous memory is the sum of RssAnon (/proc/PID/status) over the process tree, sampled every 20 ms:
page cache and clean file mappings are reclaimable and do not count. Tools take turns, --runs times per
case; the best warm run (any but the first, which fills the page cache) is reported, since other processes
and kernel writeback make single runs on a small box vary by tens of percent. Goal: mm-agent's peak RssAnon
<= 25% of the checkpoint size in every direction and its wall time <= the baseline's.

Note: with safetensors 0.8 (installed here) `load_file` returns tensors over a mapping of the file, so the
baseline's safetensors loads cost no anonymous memory either; its `torch.load` (mm_to_hf) and per-rank
clones (TP) still do.

    python benchmarks/convert_memory.py [--quick] [--blocks 30] [--runs 3] [--cases wan,qwen] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
SHARD_BYTES = 1 << 30  # diffusers/transformers shard big checkpoints; 1 GiB gives several shards here
QWEN_VIT_DEPTH_DEFAULT = 4


# ----------------------------------------------------------------------------------------------------------
# synthetic checkpoints


def _write_sharded(out: Path, shapes: dict[str, tuple[int, ...]], prefix: str, index_name: str) -> int:
    """Random bf16 tensors in shards of ~SHARD_BYTES plus the weight-map index; returns bytes written."""
    import torch
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    size = 0
    for key, shape in shapes.items():
        nbytes = 2 * _numel(shape)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    gen = torch.Generator().manual_seed(0)
    for i, keys in enumerate(shards, start=1):
        name = f"{prefix}-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {k: torch.randn(shapes[k], generator=gen, dtype=torch.bfloat16) for k in keys}
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update(dict.fromkeys(keys, name))
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / index_name).write_text(json.dumps(index, indent=2))
    return total


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def synth_wan(out: Path, blocks: int) -> int:
    """Wan2.1-T2V-1.3B transformer dir (config.json + shards) with `blocks` transformer blocks."""
    from accelerate import init_empty_weights
    from diffusers import WanTransformer3DModel

    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=12,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=8960,
        num_layers=blocks,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
    )
    with init_empty_weights():
        model: Any = WanTransformer3DModel(**cfg)
    model.save_config(out)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return _write_sharded(
        out, shapes, "diffusion_pytorch_model", "diffusion_pytorch_model.safetensors.index.json"
    )


def synth_qwen(out: Path, layers: int, vit_blocks: int, vocab: int) -> int:
    """Qwen2.5-VL-shaped HF dir with hub key names (`model.layers.*`, `visual.*`, `lm_head`)."""
    from accelerate import init_empty_weights
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=layers,
            num_attention_heads=16,
            num_key_value_heads=2,
            vocab_size=vocab,
            max_position_embeddings=32768,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=vit_blocks,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            fullatt_block_indexes=list(range(vit_blocks - 1, vit_blocks)),
        ),
        tie_word_embeddings=False,
    )
    with init_empty_weights():
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    cfg.save_pretrained(out)
    shapes: dict[str, tuple[int, ...]] = {}
    for k, v in model.state_dict().items():
        # transformers 5 nests modules (model.language_model, model.visual) but saves the hub names
        hub = k.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        shapes[hub] = tuple(v.shape)
    return _write_sharded(out, shapes, "model", "model.safetensors.index.json")


# ----------------------------------------------------------------------------------------------------------
# baseline: what mm-convert does (whole-model loads, per-rank clones)

WAN_EXACT = {
    "condition_embedder.text_embedder.linear_1.": "text_embedding.linear_1.",
    "condition_embedder.text_embedder.linear_2.": "text_embedding.linear_2.",
    "condition_embedder.time_embedder.linear_1.": "time_embedding.0.",
    "condition_embedder.time_embedder.linear_2.": "time_embedding.2.",
    "condition_embedder.time_proj.": "time_projection.1.",
    "proj_out.": "head.head.",
}
WAN_REPLACE = [
    ("attn1.norm_q", "self_attn.q_norm"),
    ("attn1.norm_k", "self_attn.k_norm"),
    ("attn2.norm_q", "cross_attn.q_norm"),
    ("attn2.norm_k", "cross_attn.k_norm"),
    ("attn1.to_q.", "self_attn.proj_q."),
    ("attn1.to_k.", "self_attn.proj_k."),
    ("attn1.to_v.", "self_attn.proj_v."),
    ("attn1.to_out.0.", "self_attn.proj_out."),
    ("attn2.to_q.", "cross_attn.proj_q."),
    ("attn2.to_k.", "cross_attn.proj_k."),
    ("attn2.to_v.", "cross_attn.proj_v."),
    ("attn2.to_out.0.", "cross_attn.proj_out."),
    (".ffn.net.0.proj.", ".ffn.0."),
    (".ffn.net.2.", ".ffn.2."),
    ("scale_shift_table", "modulation"),
    (".norm2.", ".norm3."),
]
WAN_PRE = ("patch_embedding.", "text_embedding.", "time_embedding.", "time_projection.", "img_emb.")
WAN_POST = ("head.",)


def _wan_to_mm_name(name: str) -> str:
    if name == "scale_shift_table":
        return "head.modulation"
    for old, new in WAN_EXACT.items():
        if name.startswith(old):
            return new + name[len(old) :]
    for old, new in WAN_REPLACE:
        name = name.replace(old, new)
    return name


def _wan_to_hf_name(name: str) -> str:
    if name == "head.modulation":
        return "scale_shift_table"
    for old, new in WAN_EXACT.items():
        if name.startswith(new):
            return old + name[len(new) :]
    for old, new in reversed(WAN_REPLACE):
        name = name.replace(new, old)
    return name


def _save_mm(target: Path, stages: list[dict[str, Any]], tp_rank: int = 0, version: bool = False) -> None:
    import torch

    for pp, sd in enumerate(stages):
        name = f"mp_rank_{tp_rank:02d}" + (f"_{pp:03d}" if len(stages) > 1 else "")
        d = target / "release" / name
        d.mkdir(parents=True)
        obj: dict[str, Any] = {"model": sd}
        if version:
            obj["checkpoint_version"] = 3.0
        torch.save(obj, d / "model_optim_rng.pt")
    (target / "latest_checkpointed_iteration.txt").write_text("release")


def baseline_wan_hf_to_mm(source: Path, target: Path, pp_layers: list[int]) -> None:
    from safetensors.torch import load_file

    sd: dict[str, Any] = {}
    for f in sorted(source.glob("*.safetensors")):
        sd.update(load_file(str(f), device="cpu"))
    sd = {_wan_to_mm_name(k): v for k, v in sd.items() if "_extra_state" not in k}
    stages: list[dict[str, Any]] = []
    start = 0
    for i, n in enumerate(pp_layers):
        stage: dict[str, Any] = {}
        for k, v in sd.items():
            parts = k.split(".")
            if parts[0] == "blocks" and start <= int(parts[1]) < start + n:
                stage[".".join(["blocks", str(int(parts[1]) - start), *parts[2:]])] = v
            elif (i == 0 and k.startswith(WAN_PRE)) or (i == len(pp_layers) - 1 and k.startswith(WAN_POST)):
                stage[k] = v
        stages.append(stage)
        start += n
    _save_mm(target, stages)


def baseline_wan_mm_to_hf(source: Path, target: Path, hf_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sd: dict[str, Any] = {}
    for f in sorted((source / "release").glob("mp_rank_*/model_optim_rng.pt")):
        sd.update(torch.load(f, map_location="cpu", weights_only=True)["model"])  # PP=1 source
    sd = {_wan_to_hf_name(k): v for k, v in sd.items()}
    target.mkdir(parents=True)
    index_name = "diffusion_pytorch_model.safetensors.index.json"
    shutil.copy2(hf_dir / index_name, target)
    shutil.copy2(hf_dir / "config.json", target)
    weight_map: dict[str, str] = json.loads((hf_dir / index_name).read_text())["weight_map"]
    shards: dict[str, dict[str, Any]] = {}
    for key, file in weight_map.items():
        shards.setdefault(file, {})[key] = sd[key]
    for file, tensors in shards.items():
        save_file(tensors, str(target / file), metadata={"format": "pt"})


QWEN_RENAMES = [  # §2.5 of the reference, enough for the byte counts and TP dims to be MM's
    ("model.embed_tokens", "text_decoder.embedding.word_embeddings"),
    ("lm_head", "text_decoder.output_layer"),
    ("model.norm", "text_decoder.decoder.final_layernorm"),
    ("model.layers.", "text_decoder.decoder.layers."),
    ("visual.blocks.", "image_encoder.encoder.blocks.layers."),
    ("self_attn.o_proj", "self_attention.linear_proj"),
    ("attn.proj", "self_attention.linear_proj"),
    ("mlp.down_proj", "mlp.linear_fc2"),
    ("post_attention_layernorm", "pre_mlp_layernorm"),
    ("norm1", "input_layernorm"),
    ("norm2", "pre_mlp_layernorm"),
    ("visual.merger.ln_q", "image_encoder.projector.layernorm"),
    ("visual.merger.mlp.0", "image_encoder.projector.encoder.linear_fc1"),
    ("visual.merger.mlp.2", "image_encoder.projector.encoder.linear_fc2"),
    ("visual.patch_embed", "image_encoder.encoder.patch_embed"),
]


def baseline_qwen_hf_to_mm(source: Path, target: Path, tp: int) -> None:
    """Whole load, QKV / gate-up merges, TP split with per-rank clones (MM's `split_by_tp`), torch.save."""
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((source / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    vheads = cfg["vision_config"]["num_heads"]
    sd: dict[str, Any] = {}
    for f in sorted(source.glob("*.safetensors")):
        sd.update(load_file(str(f), device="cpu"))
    out: dict[str, Any] = {}
    col: set[str] = set()
    row: set[str] = set()
    merged_first = (".self_attn.q_proj.", ".mlp.gate_proj.", ".attn.qkv.")  # they consume k/v and up keys
    for k in sorted(sd, key=lambda k: not any(s in k for s in merged_first)):
        if k not in sd:
            continue
        if ".self_attn.q_proj." in k:
            q, kk, v = (sd.pop(k.replace("q_proj", p)) for p in ("q_proj", "k_proj", "v_proj"))
            g = heads // kv
            q = q.reshape(kv, g * q.shape[0] // heads, *q.shape[1:])
            kk, v = (t.reshape(kv, t.shape[0] // kv, *t.shape[1:]) for t in (kk, v))
            merged = torch.cat([q, kk, v], dim=1).reshape(-1, *q.shape[2:])
            name = k.replace("model.layers.", "text_decoder.decoder.layers.").replace(
                "self_attn.q_proj", "self_attention.linear_qkv"
            )
            out[name] = merged
            col.add(name)
        elif ".mlp.gate_proj." in k:
            gate, up = sd.pop(k), sd.pop(k.replace("gate_proj", "up_proj"))
            pre = (
                "text_decoder.decoder.layers."
                if k.startswith("model.")
                else "image_encoder.encoder.blocks.layers."
            )
            name = pre + k.split("layers.", 1)[-1].split("blocks.", 1)[-1].replace(
                "mlp.gate_proj", "mlp.linear_fc1"
            )
            out[name] = torch.cat(
                [torch.cat([a, b]) for a, b in zip(gate.chunk(tp), up.chunk(tp), strict=True)]
            )
            col.add(name)
        elif ".attn.qkv." in k:
            t = sd.pop(k)
            d = t.shape[0] // 3
            name = "image_encoder.encoder.blocks.layers." + k.split("blocks.", 1)[1].replace(
                "attn.qkv", "self_attention.linear_qkv"
            )
            out[name] = t.reshape(3, vheads, d // vheads, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
            col.add(name)
        else:
            t = sd.pop(k)
            name = k
            for a, b in QWEN_RENAMES:
                name = name.replace(a, b)
            out[name] = t
            if any(s in k for s in ("o_proj", "down_proj", "attn.proj", "merger.mlp.2")):
                row.add(name)
            elif any(s in k for s in ("embed_tokens", "lm_head", "merger.mlp.0")):
                col.add(name)
    del sd
    ranks: list[dict[str, Any]] = [{} for _ in range(tp)]
    for k, v in out.items():  # MM split_by_tp: split the parallel ones, clone the rest per rank
        if k in col or (k in row and v.dim() > 1):
            parts = v.chunk(tp, dim=0 if k in col else 1)
            for r in range(tp):
                ranks[r][k] = parts[r].clone()
        else:
            for r in range(tp):
                ranks[r][k] = v.clone()
    for r in range(tp):
        _save_mm(target, [ranks[r]], tp_rank=r, version=True)


# ----------------------------------------------------------------------------------------------------------
# measurement


def _rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Sample:
    wall: float  # seconds until the process exits
    durable: float  # seconds until its output is on disk (the process, then a sync)
    cpu: float  # user + system seconds of the whole tree: steadier than wall time on a busy box
    peak: int  # bytes: highest sum of RssAnon over the tree
    rc: int
    tail: str


@dataclass
class Result:
    case: str
    tool: str
    best: Sample  # best warm run
    peak: int  # highest peak of all runs
    ok: bool
    walls: list[float]  # every run's wall time, in run order (tools took turns)


def measure(argv: list[str]) -> Sample:
    """Run argv and sample the RssAnon of its process tree every 20 ms. mm-agent fsyncs what it writes;
    the baseline and cp leave dirty pages behind, so only `durable` compares like with like."""
    peak = 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = psutil.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                pids = [proc.pid] + [c.pid for c in proc.children(recursive=True)]
            except psutil.Error:
                pids = [proc.pid]
            peak = max(peak, sum(_rss_anon(p) for p in pids))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    os.sync()
    durable = time.perf_counter() - t0
    return Sample(wall, durable, cpu, peak, proc.returncode, out.decode(errors="replace")[-2000:])


def _self(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


MM_AGENT_RUNNER = (
    "import json, sys\n"
    "from mm_agent.convert.engine import execute\n"
    "from mm_agent.convert.schema import ConvertRequest\n"
    "r = execute(ConvertRequest.model_validate_json(sys.argv[1]))\n"
    "print(r.status, r.message)\n"
    "sys.exit(0 if r.status in ('converted', 'unchanged') else 1)\n"
)


def mm_agent_argv(**req: Any) -> list[str]:
    return [sys.executable, "-c", MM_AGENT_RUNNER, json.dumps({**req, "confirm": True})]


@dataclass
class Case:
    name: str
    source: Path
    size: int
    tools: dict[str, Callable[[Path], list[str]]]


def run_cases(cases: list[Case], work: Path, runs: int, tools: list[str]) -> list[Result]:
    """Tools take turns run by run (machine noise hits them alike). Reported: the warm run (any but the
    first, which fills the page cache) with the best wall time, and the highest peak of any run."""
    results: list[Result] = []
    for case in cases:
        samples: dict[str, list[Sample]] = {t: [] for t in tools}
        for _ in range(runs):
            for tool in tools:
                if samples[tool] and samples[tool][-1].rc != 0:
                    continue
                target = work / f"out-{case.name.replace(' ', '-')}-{tool}"
                shutil.rmtree(target, ignore_errors=True)
                os.sync()  # earlier dirty pages would otherwise be written back during this run
                one = measure(case.tools[tool](target))
                shutil.rmtree(target, ignore_errors=True)
                print(
                    f"  {case.name:<18} {tool:<9} {one.wall:6.2f} s  +sync {one.durable:6.2f} s  "
                    f"cpu {one.cpu:6.2f} s  {one.peak / 2**20:6.0f} MB  rc={one.rc}",
                    flush=True,
                )
                samples[tool].append(one)
        for tool in tools:
            got = samples[tool]
            ok = got[-1].rc == 0
            best = got[-1] if not ok else min(got[1:] or got, key=lambda x: x.wall)
            results.append(Result(case.name, tool, best, max(x.peak for x in got), ok, [x.wall for x in got]))
    return results


def _ratio(a: float, b: float | None) -> str:
    return f"{a / b:9.2f}" if b else f"{'-':>9}"


def report(results: list[Result], cases: list[Case], runs: int) -> None:
    sizes = {c.name: c.size for c in cases}
    base = {r.case: r for r in results if r.tool == "baseline" and r.ok}
    print(
        f"\nwall, +sync, cpu: the warm run with the best wall time ({max(runs - 1, 1)} warm of {runs}); "
        "+sync: until the output is on disk;\ncpu: user+sys of the tree; peak: highest sum of RssAnon over the "
        "process tree in any run"
    )
    head = (
        f"{'case':<18} {'tool':<9} {'wall s':>7} {'+sync s':>7} {'cpu s':>6} {'peak MB':>8} {'wall/base':>9} "
        f"{'sync/base':>9} {'cpu/base':>9} {'peak/base':>9} {'peak/ckpt':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        b = base.get(r.case)
        x = r.best
        print(
            f"{r.case:<18} {r.tool:<9} {x.wall:7.2f} {x.durable:7.2f} {x.cpu:6.2f} {r.peak / 2**20:8.0f} "
            f"{_ratio(x.wall, b.best.wall if b else None)} {_ratio(x.durable, b.best.durable if b else None)} "
            f"{_ratio(x.cpu, b.best.cpu if b else None)} {_ratio(r.peak, b.peak if b else None)} "
            f"{r.peak / sizes[r.case]:9.3f}" + ("" if r.ok else "  FAILED")
        )
    for r in results:
        if not r.ok:
            print(f"\n{r.case} {r.tool} failed:\n{r.best.tail}")
    mine = [r for r in results if r.tool == "mm-agent"]
    paired = [(r, base[r.case]) for r in mine if r.ok and r.case in base]
    if paired:
        print("\nmm-agent / baseline wall time, run by run (the two ran back to back, so noise hits both):")
        for r, b in paired:
            ratios = [a / c for a, c in zip(r.walls, b.walls, strict=False)]
            wins = sum(x <= 1 for x in ratios)
            print(
                f"  {r.case:<18} {' '.join(f'{x:.2f}' for x in ratios)}   "
                f"(faster in {wins} of {len(ratios)} runs)"
            )
    if mine:
        mem = all(r.ok and r.peak <= 0.25 * sizes[r.case] for r in mine)
        wall = all(r.ok and r.case in base and r.best.wall <= base[r.case].best.wall for r in mine)
        durable = all(r.ok and r.case in base and r.best.durable <= base[r.case].best.durable for r in mine)
        print(f"\ngoal peak RssAnon <= 25% of checkpoint:  {'met' if mem else 'NOT met'}")
        print(f"goal wall time <= baseline (to exit):    {'met' if wall else 'NOT met'}")
        print(f"goal wall time <= baseline (to disk):    {'met' if durable else 'NOT met'}")


def build_cases(work: Path, args: argparse.Namespace) -> list[Case]:
    wan, qwen, wan_mm = work / "wan-transformer", work / "qwen2_5_vl", work / "wan-mm"
    t0 = time.perf_counter()
    shape = {k: getattr(args, k) for k in ("blocks", "qwen_layers", "vit_blocks", "vocab")}
    marker = work / "synth.json"
    if (
        marker.is_file() and json.loads(marker.read_text())["shape"] == shape
    ):  # --out reused: same checkpoints
        wan_size, qwen_size = json.loads(marker.read_text())["sizes"]
        verb = "reused"
    else:
        for d in (wan, qwen, wan_mm):
            shutil.rmtree(d, ignore_errors=True)
        wan_size = synth_wan(wan, args.blocks)
        qwen_size = synth_qwen(qwen, args.qwen_layers, args.vit_blocks, args.vocab)
        # the mm_to_hf source: the MM layout of the same weights, written by the baseline (not measured)
        baseline_wan_hf_to_mm(wan, wan_mm, [args.blocks])
        marker.write_text(json.dumps({"shape": shape, "sizes": [wan_size, qwen_size]}))
        verb = "synthesised"
    print(
        f"{verb} Wan {wan_size / 1e9:.2f} GB ({args.blocks} blocks), Qwen2.5-VL {qwen_size / 1e9:.2f} GB "
        f"({args.qwen_layers} LLM layers, {args.vit_blocks} ViT blocks, vocab {args.vocab}) "
        f"in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    pp4 = _pp_split(args.blocks, 4)
    pp_str = ",".join(map(str, pp4))
    wan_req = dict(converter="WanConverter", method="hf_to_mm", source=str(wan))
    qwen_req = dict(converter="Qwen2_5_VLConverter", method="hf_to_mm", source=str(qwen), tp=2)
    qwen_pp = dict(pp_layers=[[args.qwen_layers]], vit_pp_layers=[[args.vit_blocks]])
    cp = lambda src: lambda t: ["cp", "-r", str(src), str(t)]  # noqa: E731
    return [
        Case(
            "wan hf_to_mm pp1",
            wan,
            wan_size,
            {
                "mm-agent": lambda t: mm_agent_argv(**wan_req, target=str(t)),
                "baseline": lambda t: _self("_baseline", "wan_hf_to_mm", str(wan), str(t), str(args.blocks)),
                "cp": cp(wan),
            },
        ),
        Case(
            "wan hf_to_mm pp4",
            wan,
            wan_size,
            {
                "mm-agent": lambda t: mm_agent_argv(**wan_req, target=str(t), pp_layers=pp4),
                "baseline": lambda t: _self("_baseline", "wan_hf_to_mm", str(wan), str(t), pp_str),
                "cp": cp(wan),
            },
        ),
        Case(
            "wan mm_to_hf",
            wan_mm,
            wan_size,
            {
                "mm-agent": lambda t: mm_agent_argv(
                    converter="WanConverter",
                    method="mm_to_hf",
                    source=str(wan_mm),
                    target=str(t),
                    hf_dir=str(wan),
                ),
                "baseline": lambda t: _self("_baseline", "wan_mm_to_hf", str(wan_mm), str(t), str(wan)),
                "cp": cp(wan_mm),
            },
        ),
        Case(
            "qwen hf_to_mm tp2",
            qwen,
            qwen_size,
            {
                "mm-agent": lambda t: mm_agent_argv(**qwen_req, **qwen_pp, target=str(t)),
                "baseline": lambda t: _self("_baseline", "qwen_hf_to_mm", str(qwen), str(t), "2"),
                "cp": cp(qwen),
            },
        ),
    ]


def _pp_split(layers: int, stages: int) -> list[int]:
    """Balanced split with the remainder in the middle stages, like the README's [7,8,8,7]."""
    stages = min(stages, layers)
    base, extra = divmod(layers, stages)
    split = [base] * stages
    middle = list(range(1, stages - 1)) or list(range(stages))
    for i in range(extra):
        split[middle[i % len(middle)]] += 1
    return split


def _baseline_main(argv: list[str]) -> None:
    kind, src, dst, arg = argv
    if kind == "wan_hf_to_mm":
        baseline_wan_hf_to_mm(Path(src), Path(dst), [int(x) for x in arg.split(",")])
    elif kind == "wan_mm_to_hf":
        baseline_wan_mm_to_hf(Path(src), Path(dst), Path(arg))
    elif kind == "qwen_hf_to_mm":
        baseline_qwen_hf_to_mm(Path(src), Path(dst), int(arg))
    else:
        raise SystemExit(f"unknown baseline {kind}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_baseline":
        _baseline_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="small run: 4 Wan blocks, 2+2 Qwen layers, vocab 32000"
    )
    ap.add_argument("--blocks", type=int, default=30, help="Wan transformer blocks (30 = Wan2.1-1.3B)")
    ap.add_argument("--qwen-layers", type=int, default=4)
    ap.add_argument("--vit-blocks", type=int, default=QWEN_VIT_DEPTH_DEFAULT)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument(
        "--runs", type=int, default=3, help="runs per case; the best warm one (not the first) is reported"
    )
    ap.add_argument("--tools", default="mm-agent,baseline,cp")
    ap.add_argument("--cases", default="", help="only cases whose name contains one of these (comma list)")
    ap.add_argument("--out", type=Path, help="work dir (kept); default: a temp dir, removed at the end")
    args = ap.parse_args()
    if args.quick:
        args.blocks, args.qwen_layers, args.vit_blocks, args.vocab = 4, 2, 2, 32000
    work = args.out or Path(tempfile.mkdtemp(prefix="mm-agent-convert-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        wanted = [w for w in args.cases.split(",") if w]
        cases = [c for c in build_cases(work, args) if not wanted or any(w in c.name for w in wanted)]
        results = run_cases(cases, work, args.runs, args.tools.split(","))
        report(results, cases, args.runs)
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""`estimate_resources`: will a job fit its devices, and how long does a step take, before it is launched."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from mm_agent.errors import MMAgentError
from mm_agent.estimate.devices import load_devices
from mm_agent.estimate.flops import flops_per_sample, step_seconds
from mm_agent.estimate.jobdir import JobFacts, request_from_job
from mm_agent.estimate.levers import rank_levers
from mm_agent.estimate.memory import Layout, breakdown
from mm_agent.estimate.model import model_shape
from mm_agent.estimate.profiles import load_profiles
from mm_agent.estimate.schema import EstimateRequest, EstimateResult, Sharding
from mm_agent.estimate.tokens import count_tokens
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry, SizeSpec, TaskSpec

FAMILIES = ("generative", "vlm")
MOE_NOTE = "MoE: expert parallelism is not modelled, every expert counts on each device (an upper bound)"


def estimate_resources(
    req: EstimateRequest,
    root: Path | None = None,
    *,
    levers: Literal["always", "over_budget"] = "always",
    known: Mapping[Path, str] | None = None,
) -> EstimateResult:
    """Memory per device (itemised), step time and, when it does not fit or could fit better, the ranked
    changes with their own estimates. A job directory's job.yaml and scripts fill what the request leaves out.
    `levers="over_budget"`: ranked only for a job that does not fit (each lever is an estimate of its own;
    validation wants them only for its fix). `known`: texts of the job's files already read, by resolved path
    (validation's)."""
    facts: JobFacts | None = None
    if req.job_dir:
        req, facts = request_from_job(req, root, known)
    result = estimate_once(req, facts)
    if levers == "always" or not result.fits:
        result.levers = rank_levers(req, result, lambda changed: estimate_once(changed, facts))
    return result


def _pick(req: EstimateRequest) -> tuple[ModelEntry, SizeSpec, TaskSpec]:
    if not req.model:
        raise MMAgentError("no model to estimate", field="model", fix="pass a registry model id or a job_dir")
    entry = get_registry().get(req.model)
    if entry.family not in FAMILIES:
        raise MMAgentError(
            f"{entry.id} is a {entry.family} model; estimates cover generative and VLM models",
            field="model",
            fix="pick a generative or VLM model (`mm-agent models`)",
        )
    size = entry.size(req.size) if req.size else entry.sizes[0]
    if size is None:
        raise MMAgentError(
            f"{entry.id} has no size {req.size!r}",
            field="size",
            fix=f"use one of {', '.join(s.id for s in entry.sizes)}",
        )
    tasks = [t for t in entry.tasks if (req.task in (None, t.id)) and (t.sizes is None or size.id in t.sizes)]
    if not tasks:
        known = sorted({t.id for t in entry.tasks if t.sizes is None or size.id in t.sizes})
        raise MMAgentError(
            f"{entry.id} size {size.id} has no task {req.task!r}",
            field="task",
            fix=f"use one of {', '.join(known)}",
        )
    return entry, size, tasks[0]


def _sharding(task: TaskSpec, size: SizeSpec) -> Sharding:
    """The stock layout's: FSDP2 backends shard everything, so do the Megatron jobs that ship a LayerZero
    config (Wan-14B's listed tasks, Open-Sora 2.0); MindSpeed-MM's DeepSpeed examples all run ZeRO stage 2
    (their accelerate/DeepSpeed configs); other Megatron jobs shard the optimizer."""
    if "fsdp2" in task.backend or task.template == "transformers_fsdp2":
        return "fsdp2"
    if task.backend == "megatron" and (
        task.id in size.arch.get("layerzero_tasks", []) or "layerzero" in size.config_files
    ):
        return "layerzero"
    if "deepspeed" in task.backend:
        return "zero2"
    return "distributed-optimizer"


def estimate_once(req: EstimateRequest, job: JobFacts | None = None) -> EstimateResult:
    """One estimate of exactly the request (no levers), for MindSpeed-MM or mm-agent's bundled runtime
    (default: the bundled one where the device trains in fp32, i.e. on CPU, else MindSpeed-MM). `job`: what a
    job fixes beyond the request (its runtime, its own PP, the depth its model config builds)."""
    entry, size, task = _pick(req)
    shape = model_shape(entry, size, job.arch if job is not None else None)
    depth_note = None
    stock_depth = size.arch.get("num_layers")
    if job is not None and job.layers and isinstance(stock_depth, int) and job.layers != stock_depth:
        shape = replace(shape, main=shape.main.scaled(job.layers / stock_depth))
        depth_note = f"the job's model config builds {job.layers} of the size's {stock_depth} layers"
    tokens = count_tokens(shape, req.frames, req.height, req.width, req.text_len)
    devices = load_devices()
    device = devices.find(req.device or devices.default)
    runtime = job.runtime if job else "bundled" if device.precision == "fp32" else "mindspeed-mm"
    profile = load_profiles().find(runtime, device.precision)
    par = size.parallel
    stock = size.arch.get("task_defaults", {}).get(task.id, {})  # a task's own layout (Wan2.1-14B i2v: CP 2)
    lay = Layout(
        npus=req.npus or par.npus_per_node * par.nnodes,
        tp=req.tp or par.tp,
        pp=(job.pp if job else None) or int(stock.get("pp", par.pp)),
        cp=req.cp or int(stock.get("cp", par.cp)),
        mbs=par.mbs,
        recompute=req.recompute or "full",
        sharding=req.sharding or _sharding(task, size),
        lora=req.lora if req.lora is not None else task.id == "lora",
        online_encoders=shape.kind != "vlm" and task.feature_extraction is None,
        profile=profile,
    )
    split = lay.tp * lay.pp * lay.cp
    if lay.npus % split:
        raise MMAgentError(
            f"{lay.npus} devices cannot hold TP {lay.tp} x PP {lay.pp} x CP {lay.cp} = {split} evenly",
            field="npus",
            fix=f"use a multiple of {split} devices, or smaller tp/pp/cp",
        )
    parts = breakdown(shape, tokens, lay, device.workspace_gb)
    per_device = round(sum(parts.values()), 2)
    global_batch = lay.dp * lay.mbs * par.grad_acc
    step_flops = flops_per_sample(shape, tokens, lay) * global_batch
    seconds = step_seconds(step_flops, lay.npus, device.bf16_tflops, device.mfu)
    notes = [f"{device.name}: {device.memory_gb:g} GB, {device.bf16_tflops:g} bf16 TFLOPS x MFU {device.mfu}"]
    if shape.main.active < shape.main.params and "derived" in shape.source:
        notes.append(MOE_NOTE)
    if depth_note:
        notes.append(depth_note)
    if shape.stock_shape and not (req.frames or req.height or req.width):
        notes.append(
            f"input {tokens.frames}x{tokens.height}x{tokens.width}: the stock {shape.stock_shape.origin}"
        )
    if not lay.online_encoders and shape.kind != "vlm":
        notes.append("VAE and text encoder not counted: this task trains on pre-extracted features")
    return EstimateResult(
        model=entry.id,
        size=size.id,
        task=task.id,
        backend=task.backend,
        device=device.id,
        fits=per_device <= device.memory_gb,
        per_device_gb=per_device,
        device_gb=device.memory_gb,
        breakdown=parts,
        step_seconds=round(seconds, 3),
        run_hours=round(req.train_iters * seconds / 3600, 2) if req.train_iters else None,
        epoch_hours=round(req.dataset_size / global_batch * seconds / 3600, 2) if req.dataset_size else None,
        npus=lay.npus,
        tp=lay.tp,
        pp=lay.pp,
        cp=lay.cp,
        dp=lay.dp,
        global_batch=global_batch,
        recompute=lay.recompute,
        sharding=lay.sharding,
        lora=lay.lora,
        runtime=runtime,
        params_b=round((shape.main.params + (shape.vit.params if shape.vit else 0)) / 1e9, 2),
        active_params_b=round((shape.main.active + (shape.vit.active if shape.vit else 0)) / 1e9, 2),
        params_source=shape.source,
        frames=tokens.frames,
        height=tokens.height,
        width=tokens.width,
        text_len=tokens.text,
        seq_tokens=tokens.seq,
        vision_tokens=tokens.vision,
        tflops_per_step=round(step_flops / 1e12, 1),
        notes=notes,
    )

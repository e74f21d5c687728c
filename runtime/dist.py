"""Process-group setup under torchrun (or a plain single process) and Megatron's parallel-layout arithmetic.

The bundled runtime trains data-parallel only, but it accepts MindSpeed-MM's TP/PP/CP/MBS/GBS flags so the
same `pretrain.sh` drives it. `check_layout` applies megatron-core `parallel_state`'s world-size rule and the
microbatch calculator's rule (GBS = MBS x DP x grad-acc) and then refuses TP/PP/CP > 1 with the way out.
The arithmetic is re-implemented here rather than imported: `import megatron.core` costs 4-9 s per process
on a CPU box, paid by every torchrun rank of every test for two lines of integer maths; a unit test checks
it against megatron-core's `ConstantNumMicroBatchesCalculator`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.device import Device
from runtime.errors import RuntimeFailure


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int


@dataclass(frozen=True)
class Layout:
    """Megatron's layout for one run: model-parallel sizes, DP, micro-batch size and gradient-accumulation steps."""

    tp: int
    pp: int
    cp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    grad_acc: int


def env_ranks() -> DistInfo:
    """Ranks from torchrun's environment; a plain `python -m runtime.x` is rank 0 of 1."""
    try:
        return DistInfo(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )
    except ValueError as exc:
        raise RuntimeFailure(
            f"RANK/WORLD_SIZE/LOCAL_RANK are not integers: {exc}", fix="launch with torchrun"
        ) from exc


def init_distributed(device: Device, timeout_s: float = 1800.0) -> DistInfo:
    """Create the default process group with the device's backend (always, so one code path serves world 1)."""
    info = env_ranks()
    if dist.is_initialized():
        return info
    device.set_current()
    timeout = timedelta(seconds=timeout_s)
    if info.world_size == 1 and "MASTER_ADDR" not in os.environ:
        store = dist.HashStore()
        dist.init_process_group(device.backend, store=store, rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(device.backend, init_method="env://", timeout=timeout)
    return info


def log0(rank: int, line: str) -> None:
    """Print on rank 0 only, flushed: the log lines the job manager and the diagnoser follow."""
    if rank == 0:
        print(line, flush=True)


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def num_microbatches(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """megatron-core's ConstantNumMicroBatchesCalculator: GBS must be a multiple of MBS x DP."""
    per_step = micro_batch_size * dp
    if micro_batch_size < 1 or global_batch_size < 1 or global_batch_size % per_step != 0:
        raise RuntimeFailure(
            f"global batch size ({global_batch_size}) is not divisible by micro batch size "
            f"({micro_batch_size}) times data parallel size ({dp})",
            field="--global-batch-size",
            fix=f"use a --global-batch-size that is a multiple of MBS x DP = {per_step} (GBS = MBS x DP x grad-acc)",
        )
    return global_batch_size // per_step


def check_layout(
    world_size: int, tp: int, pp: int, cp: int, micro_batch_size: int, global_batch_size: int
) -> Layout:
    """parallel_state's world-size rule, the microbatch rule, then the bundled runtime's DP-only refusal."""
    for flag, value in (
        ("--tensor-model-parallel-size", tp),
        ("--pipeline-model-parallel-size", pp),
        ("--context-parallel-size", cp),
    ):
        if value < 1:
            raise RuntimeFailure(f"{flag} must be >= 1, got {value}", field=flag, fix=f"set {flag} 1")
    model_parallel = tp * pp * cp
    if world_size % model_parallel != 0:
        raise RuntimeFailure(
            f"world_size ({world_size}) is not divisible by tensor_model_parallel_size ({tp}) x "
            f"pipeline_model_parallel_size ({pp}) x context_parallel_size ({cp})",
            field="--nproc_per_node",
            fix="choose TP, PP and CP whose product divides the number of processes",
        )
    dp = world_size // model_parallel
    grad_acc = num_microbatches(global_batch_size, micro_batch_size, dp)
    if model_parallel > 1:
        raise RuntimeFailure(
            f"the bundled runtime trains data-parallel; got TP={tp} PP={pp} CP={cp}",
            field="--tensor-model-parallel-size/--pipeline-model-parallel-size/--context-parallel-size",
            fix="set TP=PP=CP=1 — PP-split checkpoints are merged at load (use MindSpeed-MM for model parallelism)",
        )
    return Layout(tp, pp, cp, dp, micro_batch_size, global_batch_size, grad_acc)


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a tensor over all ranks (the logged loss is the DP average, as Megatron reports it)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value

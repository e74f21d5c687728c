"""Megatron-layout checkpoints for the bundled runtime: load any converted split, save resumable iterations.

Loading reads `latest_checkpointed_iteration.txt` (`release` or an iteration) and merges PP/VPP rank files
into one state dict with global block numbers, using the layout knowledge of `mm_agent.convert` (the same
code that wrote them). MindSpeed-MM silently trains from random weights when LOAD_PATH is wrong; here a
missing dir, a missing or invalid tracker, or a missing `mp_rank_*` file is a `RuntimeFailure` naming it.
Omitting `--load` is the only way to start from random initialisation.

Saving writes `iter_{:07d}/mp_rank_00/model_optim_rng.pt` with the full (gathered) model in MM names, the
optimizer, per-rank RNG states, iteration, consumed samples, `checkpoint_version` 3.0 and args, into a
temp dir renamed into place; the tracker is replaced atomically last, so a run killed at any point leaves
either the previous checkpoint or the new one, never a half-written one that looks valid.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from runtime.atomic import TEMP_MARK, fsync_dir, write_text_atomic
from runtime.errors import RuntimeFailure

if TYPE_CHECKING:
    from mm_agent.convert.layout import MMCheckpoint

TRACKER = "latest_checkpointed_iteration.txt"
CKPT_NAME = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0
LORA_MANIFEST = "lora_adapter.json"
LAYER_PREFIX = "blocks."
CONVERT_FIX = (
    "convert the diffusers weights first (`mm-agent convert WanConverter hf_to_mm --source <transformer dir> "
    "--target <dir> --yes`) and pass that dir, or the training --save dir to resume; omit --load to start "
    "from random initialisation"
)


@dataclass
class Loaded:
    """A checkpoint read from disk: merged model weights plus, for training saves, the resume state."""

    root: Path
    iteration: int  # 0 for a release (converted) checkpoint
    release: bool
    model: dict[str, torch.Tensor]
    layout: str  # e.g. "PP=4 pp_layers=[1, 1, 0, 0]" — how the files were split
    optimizer: dict[str, Any] | None = None
    rng_state: list[dict[str, Any]] | None = None
    consumed_samples: int = 0
    lora: dict[str, Any] | None = None  # a LoRA checkpoint's manifest (runtime.lora), when it has one
    args: argparse.Namespace | None = None  # the training args saved with an iteration


def _as_failure(exc: Exception, root: Path) -> RuntimeFailure:
    from mm_agent.errors import MMAgentError

    if isinstance(exc, MMAgentError):
        return RuntimeFailure(
            exc.message, file=exc.file or str(root), field="--load", fix=exc.fix or CONVERT_FIX
        )
    return RuntimeFailure(str(exc), file=str(root), field="--load", fix=CONVERT_FIX)


def _converted_files(root: Path) -> list[str] | None:
    """Rank files the conversion manifest promises for `release/` (catches a missing last stage)."""
    from mm_agent.convert.manifest import read_manifest

    tracker = (root / TRACKER).read_text(encoding="utf-8", errors="replace").strip()
    manifest = read_manifest(root) if tracker == "release" else None
    return [f.path for f in manifest.files] if manifest is not None else None


Merge = Callable[["MMCheckpoint"], tuple[dict[str, torch.Tensor], str]]


def merge_blocks(found: MMCheckpoint) -> tuple[dict[str, torch.Tensor], str]:
    """A predictor's stages merged into global `blocks.N` names, and how the files were split."""
    from mm_agent.convert.mmio import load_merged

    model, split = load_merged(found, LAYER_PREFIX)
    return model, split.describe()


def load_checkpoint(load_dir: str, merge: Merge = merge_blocks) -> Loaded:
    """Read `--load`: every problem that would make MindSpeed-MM fall back to random weights is an error.

    `merge` joins the rank files into one state dict (a VLM's ViT and LLM are split by their own layers)."""
    from mm_agent.convert.layout import find_checkpoint
    from mm_agent.convert.tensors import load_pt
    from mm_agent.errors import MMAgentError

    root = Path(load_dir)
    if not root.is_dir():
        raise RuntimeFailure(
            f"--load {root} does not exist or is not a directory", field="--load", fix=CONVERT_FIX
        )
    if not (root / TRACKER).is_file():
        hint = (
            " (it holds diffusers safetensors: convert them first)" if any(root.glob("*.safetensors")) else ""
        )
        raise RuntimeFailure(
            f"--load {root} has no {TRACKER}, so it is not a Megatron checkpoint{hint}; MindSpeed-MM would "
            "silently train from random weights here, the bundled runtime refuses",
            file=str(root / TRACKER),
            field="--load",
            fix=CONVERT_FIX,
        )
    try:
        found = find_checkpoint(root, field="--load", expected=_converted_files(root))
        if found.tp != 1:
            raise RuntimeFailure(
                f"{root} has TP={found.tp} rank files; the bundled runtime loads TP=1 checkpoints",
                file=str(root),
                field="--load",
                fix="re-convert with TP=1 (PP/VPP splits are fine: they are merged)",
            )
        model, layout = merge(found)
        loaded = Loaded(
            root=root,
            iteration=0 if found.iteration == "release" else int(found.iteration.removeprefix("iter_")),
            release=found.iteration == "release",
            model=model,
            layout=layout,
        )
        if not loaded.release:
            obj = load_pt(found.stage_files()[0])
            loaded.optimizer = obj.get("optimizer")
            loaded.rng_state = obj.get("rng_state")
            loaded.consumed_samples = int(obj.get("consumed_samples", 0))
            loaded.lora = obj.get("lora")
            saved_args = obj.get("args")
            loaded.args = saved_args if isinstance(saved_args, argparse.Namespace) else None
    except RuntimeFailure:
        raise  # already the runtime's own (a RuntimeFailure is also an MMAgentError)
    except MMAgentError as exc:
        raise _as_failure(exc, root) from exc
    return loaded


def rng_state(device_kind: str) -> dict[str, Any]:
    """This rank's RNG states, keyed as Megatron keys them (`cuda_rng_state` holds the NPU's on NPU)."""
    state: dict[str, Any] = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }
    if device_kind == "cuda":
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    elif device_kind == "npu":
        state["cuda_rng_state"] = torch.npu.get_rng_state()  # type: ignore[attr-defined]
    return state


def restore_rng(states: list[dict[str, Any]], rank: int, device_kind: str) -> None:
    """Restore this rank's entry (entry 0 when the checkpoint came from fewer ranks)."""
    state = states[rank] if rank < len(states) else states[0]
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    device_state = state.get("cuda_rng_state")
    if device_state is not None and device_kind == "cuda":
        torch.cuda.set_rng_state(device_state)
    elif device_state is not None and device_kind == "npu":
        torch.npu.set_rng_state(device_state)  # type: ignore[attr-defined]


def iteration_dir(save_dir: Path, iteration: int) -> Path:
    return save_dir / f"iter_{iteration:07d}"


def save_checkpoint(
    save_dir: Path,
    iteration: int,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    rng_states: list[dict[str, Any]],
    consumed_samples: int,
    args: argparse.Namespace,
    lora: dict[str, Any] | None = None,
) -> Path:
    """Write one iteration (rank 0 only): temp dir → rename → tracker last. Returns the iteration dir.

    A LoRA run passes `model` = the adapter keys only and its manifest as `lora`: stored in the payload and
    as `lora_adapter.json` beside the tracker (not in the iteration dir: MindSpeed-MM's `load_from_mm` reads
    every entry there as a rank dir).
    """
    save_dir.mkdir(parents=True, exist_ok=True)
    for stale in save_dir.glob(f".iter_*{TEMP_MARK}*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed run; never a valid checkpoint
    final = iteration_dir(save_dir, iteration)
    tmp = save_dir / f".{final.name}{TEMP_MARK}{os.getpid()}"
    rank_dir = tmp / "mp_rank_00"
    rank_dir.mkdir(parents=True)
    payload = {
        "model": model,
        "optimizer": optimizer,
        "rng_state": rng_states,
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "checkpoint_version": CHECKPOINT_VERSION,
        "args": args,
    }
    if lora is not None:
        payload["lora"] = lora
    with open(rank_dir / CKPT_NAME, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(rank_dir)
    if final.exists():  # the same iteration saved again (a resumed run's final save): replace it whole
        old = save_dir / f".{final.name}{TEMP_MARK}old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(save_dir)
    if lora is not None:
        write_text_atomic(save_dir / LORA_MANIFEST, json.dumps(lora, indent=2) + "\n")
    write_text_atomic(save_dir / TRACKER, str(iteration))
    fsync_dir(save_dir)
    return final


def gather_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainable_only: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (unsharded) model and optimizer state dicts on CPU, on rank 0 (a collective: call on every rank).

    With FSDP2 each rank holds shards; `get_state_dict(full_state_dict, cpu_offload)` all-gathers them so
    the file holds plain tensors under MM names, loadable by MindSpeed-MM and by `mm_to_hf`.
    `trainable_only` leaves the frozen base out (a LoRA run gathers and saves only its adapter).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_state_dict(model, optimizer, options=options)


def restore_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full optimizer state dict (FQN-keyed, as `gather_full_state` saved it) into a sharded optimizer.

    Every rank read the same file, so each shards its own copy: no rank waits in a broadcast while another
    one fails validation.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def state_mismatch(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """Why a strict load of `state` into a model whose state dict is `expected` would fail, one part per kind
    ("2 missing (e.g. a, b)", "1 unexpected (...)", "1 with other shapes (e.g. k: checkpoint (..) vs model (..))");
    empty when it fits. Said before loading, so a checkpoint of another size or family never half-loads."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    kinds = (("missing", missing), ("unexpected", unexpected), ("with other shapes", shapes))
    return [f"{len(items)} {label} (e.g. {', '.join(items[:3])})" for label, items in kinds if items]

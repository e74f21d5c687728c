"""Checks of host resources against the job: /dev/shm for DataLoader workers, free disk for features and
checkpoints, and host RAM for checkpoint conversion. Sizes are computed from the model's size id (1.3b, 14b)
at 2 bytes per parameter (bf16), never hard-coded per model.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psutil

from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import Outcome, check, fail, ok, skip, warn

GIB = 1024**3
MIB = 1024**2
BF16_BYTES = 2
# The bundled runtime saves the full fp32 model and AdamW's two fp32 moments at every save (runtime/checkpoint.py).
BUNDLED_SAVE_BYTES = 4 + 2 * 4
# DataLoader workers hand batches to the trainer through /dev/shm; each keeps prefetch_factor=2 batches in
# flight, and a video batch (latents + text embeddings, or decoded frames) is tens of MB: budget 64 MiB.
SHM_PER_BATCH = 64 * MIB
PREFETCH = 2
SHM_FLOOR = 1 * GIB  # below this (docker's default is 64 MB) any worker>0 run dies with "Bus error"
# Wan-style features: VAE latents (16x21x60x104) + UMT5 embeddings (512x4096) in bf16 = ~10 MB per 480p clip;
# 20 GiB holds ~2000 clips, the smallest data set worth a fine-tune.
FEATURES_MIN_FREE = 20 * GIB
NO_MODEL_MIN_FREE = 10 * GIB
_SIZE = re.compile(r"^(a)?(\d+(?:\.\d+)?)b$", re.IGNORECASE)


def model_params(size_id: str) -> tuple[float, str] | None:
    """Parameters from a size id ("1.3b" -> 1.3e9); A14B (MoE active params) is a lower bound."""
    m = _SIZE.match(size_id.strip())
    if not m:
        return None
    note = " (active parameters of an MoE model: the total is larger)" if m.group(1) else ""
    return float(m.group(2)) * 1e9, note


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _model_bytes(ctx: Context) -> tuple[float, str] | None:
    if ctx.model is None or ctx.size is None:
        return None
    parsed = model_params(ctx.size.id)
    if parsed is None:
        return None
    params, note = parsed
    return (
        params * BF16_BYTES,
        f"{ctx.model.id} {ctx.size.id}: {params / 1e9:g}B params x 2 bytes (bf16) = {_gib(params * BF16_BYTES)}{note}",
    )


@check("shm", "/dev/shm large enough for the DataLoader workers")
def shm(ctx: Context) -> Outcome:
    workers = ctx.num_workers
    if workers == 0:
        return ok("num_workers is 0: the DataLoader does not use /dev/shm")
    path = Path("/dev/shm")
    if not path.is_dir():
        return skip("no /dev/shm on this system")
    usage = shutil.disk_usage(path)
    ranks = ctx.npus_per_node or 8
    want = ranks * workers * PREFETCH * SHM_PER_BATCH
    evidence = [
        f"/dev/shm: {_gib(usage.total)} total, {_gib(usage.free)} free",
        f"num_workers {workers} ({ctx.num_workers_source}) x {ranks} ranks per node",
        f"rule of thumb: ranks x workers x prefetch {PREFETCH} x {SHM_PER_BATCH // MIB} MiB per batch = {_gib(want)}",
    ]
    fix = (
        "restart the container with `--shm-size=16g` (or `--ipc=host`); as a workaround set num_workers to 0 "
        "(slower data loading)"
    )
    if usage.total < SHM_FLOOR:
        return fail(
            f"/dev/shm is only {usage.total // MIB} MiB: workers die with `Bus error ... insufficient shared memory`",
            fix,
            evidence,
        )
    if usage.free < want:
        return warn(f"/dev/shm has {_gib(usage.free)} free, {_gib(want)} recommended", fix, evidence)
    return ok(f"{_gib(usage.free)} free for {workers} worker(s) per rank", evidence)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@check("disk_space", "Free disk for features and checkpoints")
def disk_space(ctx: Context) -> Outcome:
    model = _model_bytes(ctx)
    targets: list[tuple[str, Path, float, float]] = []  # (role, path, fail below, warn below)
    if ctx.job is not None:
        if model:
            ckpt = model[0]
            warn_below = 3 * ckpt
            if ctx.runtime == "bundled":  # one save of the bundled runtime: weights + optimizer state
                warn_below = max(warn_below, ckpt / BF16_BYTES * BUNDLED_SAVE_BYTES)
            targets.append(("checkpoints (SAVE_PATH)", ctx.job_path("save_path"), ckpt, warn_below))
        else:
            targets.append(("checkpoints (SAVE_PATH)", ctx.job_path("save_path"), GIB, NO_MODEL_MIN_FREE))
        if ctx.job.uses_features:
            targets.append(("features", ctx.job_path("feature_dir"), GIB, FEATURES_MIN_FREE))
    else:
        ckpt = model[0] if model else 0.0
        targets.append(("workspace", ctx.base, max(GIB, ckpt), max(NO_MODEL_MIN_FREE, 3 * ckpt)))
    by_fs: dict[int, list[tuple[str, Path, float, float]]] = {}
    for role, path, low, high in targets:
        by_fs.setdefault(os.stat(_existing(path)).st_dev, []).append((role, path, low, high))
    if model and ctx.runtime == "bundled":
        save = model[0] / BF16_BYTES * BUNDLED_SAVE_BYTES
        evidence = [
            f"{model[1]}; each save of the bundled runtime (fp32 weights + AdamW state, "
            f"{BUNDLED_SAVE_BYTES} bytes per parameter) is ~{_gib(save)}, every --save-interval"
        ]
    else:
        evidence = (
            [model[1] + "; each checkpoint save (weights only, --no-save-optim) is that size"]
            if model
            else []
        )
    worst = "ok"
    notes = []
    for group in by_fs.values():
        free = shutil.disk_usage(_existing(group[0][1])).free
        low, high = sum(g[2] for g in group), sum(g[3] for g in group)
        roles = " + ".join(f"{g[0]} {g[1]}" for g in group)
        evidence.append(f"{roles}: {_gib(free)} free (fail below {_gib(low)}, warn below {_gib(high)})")
        if free < low:
            worst = "fail"
            notes.append(f"{_gib(free)} free for {roles}, at least {_gib(low)} needed")
        elif free < high and worst != "fail":
            worst = "warn"
            notes.append(f"{_gib(free)} free for {roles}, {_gib(high)} recommended")
    fix = "free space or point save_path/feature_dir at a larger disk (re-render the job); raise --save-interval to save fewer checkpoints"
    if worst == "fail":
        return fail("; ".join(notes), fix, evidence)
    if worst == "warn":
        return warn("; ".join(notes), fix, evidence)
    return ok("enough free disk", evidence)


def _cgroup_memory() -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, v2 then v1; None when unlimited or unknown."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if not raw.isdigit() or int(raw) >= 1 << 60:
            return None, None
        try:
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            usage = None
        return int(raw), usage
    return None, None


@check("host_ram", "Host RAM for checkpoint conversion and loading")
def host_ram(ctx: Context) -> Outcome:
    model = _model_bytes(ctx)
    if model is None:
        return skip("no model size to estimate from (--model/--size or --job)")
    size_bytes, how = model
    vm = psutil.virtual_memory()
    total, available = vm.total, vm.available
    limit, usage = _cgroup_memory()
    evidence = [how, f"host RAM {_gib(total)} total, {_gib(available)} available"]
    if limit is not None:
        evidence.append(f"cgroup memory limit {_gib(limit)}" + (f", {_gib(usage)} used" if usage else ""))
        total = min(total, limit)
        available = min(available, limit - (usage or 0))
    tp = ctx.tp
    conversion = (1 + tp) * size_bytes
    evidence.append(
        f"mm-convert peak ~ (1 + TP={tp}) x model = {_gib(conversion)} (whole state dict plus one deep copy per TP rank)"
    )
    ranks = ctx.npus_per_node or 1
    loading = ranks * size_bytes
    evidence.append(
        f"training start: {ranks} rank(s) each loading the full checkpoint on the host = {_gib(loading)}"
    )
    if total < conversion:
        return fail(
            f"{_gib(total)} RAM cannot hold the conversion peak of {_gib(conversion)}: the OOM killer ends it (exit -9)",
            f"run mm-convert on a machine with at least {_gib(conversion)} free RAM"
            + (
                f", or convert at TP=1 (peak {_gib(2 * size_bytes)}) and `resplit` to TP={tp} afterwards"
                if tp > 1 and ctx.model and ctx.model.converter and "resplit" in ctx.model.converter.methods
                else ""
            ),
            evidence,
        )
    if available < conversion:
        return warn(
            f"only {_gib(available)} available, conversion peaks at ~{_gib(conversion)}",
            "stop other memory-heavy processes before `mm-convert`",
            evidence,
        )
    if available < loading:
        return warn(
            f"{ranks} ranks loading the full weights need ~{_gib(loading)}, {_gib(available)} available",
            "use fewer dataloader workers, convert to DCP (`mm-convert ... mm_to_dcp`) or init_model_with_meta_device "
            "so ranks do not all hold full copies (otherwise: `Signal 9 (SIGKILL)` at load)",
            evidence,
        )
    return ok(f"{_gib(available)} available, conversion needs ~{_gib(conversion)}", evidence)

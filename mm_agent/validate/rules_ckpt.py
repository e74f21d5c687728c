"""Checkpoint directory rules for `--load` (LOAD_PATH): the Megatron layout written by mm-convert.

<LOAD_PATH>/latest_checkpointed_iteration.txt   "release" or an iteration number
<LOAD_PATH>/release/ (or iter_{:07d}/)
    mp_rank_{tp:02d}/              PP == 1
    mp_rank_{tp:02d}_{pp:03d}/     PP > 1   (+ _{ep:03d} with expert parallelism)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from mm_agent.convert.manifest import MANIFEST, read_manifest
from mm_agent.errors import MMAgentError
from mm_agent.validate.files import open_text
from mm_agent.validate.job import Job, Launch, to_int
from mm_agent.validate.refs import CROSS_FILE_CHECKS, locate, resolved_note, skipped

TRACKER = "latest_checkpointed_iteration.txt"
TRACKER_CHARS = 4096  # a tracker holds "release" or a step number; more is read no further
_ITER = re.compile(r"^iter_\d+$")


def check(job: Job) -> None:
    for launch in job.launches:
        if launch.has("--load"):
            _check_load(job, launch)
        elif _megatron_entry(launch) and not _passed(launch, launch.env("LOAD_PATH")):
            file, field, line = launch.where(None, "LOAD_PATH")
            job.sink.warning(
                "ckpt.load_not_passed",
                file,
                "LOAD_PATH is set but the launch command has no --load; "
                "training will start from random weights",
                "add `--load $LOAD_PATH` to the training arguments (stock scripts put it in OUTPUT_ARGS)",
                field=field,
                line=line,
            )


def _megatron_entry(launch: Launch) -> bool:
    """MindSpeed-MM's Megatron entry points (pretrain_sora.py, pretrain_vlm.py, posttrain_*.py, ...)."""
    return launch.cmd.launcher == "torchrun" and launch.entry.startswith(("pretrain_", "posttrain_"))


def _passed(launch: Launch, value: str | None) -> bool:
    """True when LOAD_PATH is unset/empty or its value reaches some flag of the command."""
    if not value:
        return True
    return any(value in (v or "") for values in launch.flags.values() for v in values)


def expected_rank_dirs(tp: int, pp: int, ep: int = 1) -> set[str]:
    names: set[str] = set()
    for t in range(tp):
        for p in range(pp):
            base = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
            if ep > 1:
                names.update(f"{base}_{e:03d}" for e in range(ep))
            else:
                names.add(base)
    return names


def _bridge(launch: Launch) -> bool:
    model = launch.configs.get("mm-model")
    return bool(model is not None and model.get("patch.bridge_patch") is True)


def _check_load(job: Job, launch: Launch) -> None:
    raw = launch.value("--load")
    var = "LOAD_PATH" if raw is not None and launch.env("LOAD_PATH") == raw else None
    file, field, line = launch.where("--load", var)
    if raw is None:
        job.sink.info(
            "path.unresolved",
            file,
            "--load is not known statically; checkpoint not checked",
            "set LOAD_PATH with a plain assignment",
            field=field,
            line=line,
        )
        return
    name = Path(raw.rstrip("/")).name
    if name == "release" or _ITER.match(name):
        job.sink.error(
            "ckpt.points_inside",
            file,
            f"--load points inside a checkpoint ({name}/); Megatron looks for "
            f"{TRACKER} in the --load directory itself, finds none and silently trains from random init",
            f"point {field} at the parent directory: {str(Path(raw.rstrip('/')).parent)!r}",
            field=field,
            line=line,
        )
        return
    what = "checkpoint directory (--load)"
    found = locate(job, launch, raw)
    if found.why:
        skipped(job, what, raw, found.why, CROSS_FILE_CHECKS["load"], (file, field, line), fix=found.fix)
        return
    resolved_note(job, what, raw, found, (file, field, line))
    path = job.check_path(
        raw,
        base=found.base,
        file=file,
        field=field,
        line=line,
        what=what,
        fix=f"fix {field}; if the path only exists on the cluster, ignore this (an invalid LOAD_PATH makes "
        "MindSpeed train from random init)",
    )
    if path is None or not path.is_dir():
        return
    tracker = path / TRACKER
    if not tracker.is_file():
        if _bridge(launch) and any(path.glob("*.safetensors")):
            return  # bridge_patch loads the Hugging Face directory online
        job.sink.error(
            "ckpt.tracker_missing",
            file,
            f"{path} has no {TRACKER}: MindSpeed will silently train from random "
            "init ('will not load any checkpoints and will start from random')",
            f"convert the weights with mm-convert (hf_to_mm) into {path}, or point {field} at the directory "
            f"that contains {TRACKER}",
            field=field,
            line=line,
        )
        return
    try:
        with open_text(tracker, job.root) as fh:
            content = fh.read(TRACKER_CHARS).strip()
    except (MMAgentError, OSError) as exc:
        why = exc.message if isinstance(exc, MMAgentError) else exc.strerror or str(exc)
        job.sink.error(
            "file.unreadable",
            str(tracker),
            f"cannot read: {why}",
            "make the tracker file a readable regular file (`echo release > " + str(tracker) + "`)",
        )
        return
    iteration = to_int(content)
    if content != "release" and iteration is None:
        job.sink.error(
            "ckpt.tracker_invalid",
            str(tracker),
            f"tracker content {content[:40]!r} is neither 'release' nor "
            f"an iteration number; Megatron exits with 'ERROR: Invalid metadata file {tracker}. Exiting'",
            f"write `release` (converted weights) or the saved step into {tracker}: `echo release > "
            f"{tracker}`",
            line=1,
        )
        return
    iter_dir = path / ("release" if content == "release" else f"iter_{iteration:07d}")
    if not iter_dir.is_dir():
        job.sink.error(
            "ckpt.iter_dir_missing",
            file,
            f"{TRACKER} says {content!r} but {iter_dir.name}/ does not exist in {path}",
            f"re-run the conversion into {path}, or write the existing iteration into {TRACKER}",
            field=field,
            line=line,
        )
        return
    if content == "release" and launch.is_training:
        _release_flags(job, launch)
    mismatch = _rank_dirs(job, launch, iter_dir, file, field, line)
    if content == "release" and not mismatch:  # a wrong rank grid is reported once, by _rank_dirs
        _manifest(job, launch, path, iter_dir, (file, field, line))


def _release_flags(job: Job, launch: Launch) -> None:
    missing = [f for f in ("--no-load-optim", "--no-load-rng") if not launch.has(f)]
    if not missing:
        return
    file, field, line = launch.where("--load", "LOAD_PATH" if launch.env("LOAD_PATH") else None)
    job.sink.error(
        "ckpt.release_needs_no_load",
        file,
        f"loading a converted 'release' checkpoint (no optimizer/RNG state) "
        f"without {' and '.join(missing)}: Megatron exits with 'Unable to load optimizer from checkpoint ... "
        "Specify --no-load-optim or --finetune'",
        f"add {' '.join(missing)} to the training arguments",
        field=field,
        line=line,
    )


def _rank_dirs(
    job: Job, launch: Launch, iter_dir: Path, file: str, field: str | None, line: int | None
) -> bool:
    """Check the mp_rank dir names against TP/PP/EP; True when a mismatch was reported."""
    try:
        present = {p.name for p in iter_dir.iterdir() if p.name.startswith("mp_rank_")}
        dcp = (iter_dir / ".metadata").exists()
    except OSError:
        return False
    if dcp or (not present and launch.value("--ckpt-format") == "torch_dcp"):
        return False
    tp, pp = (
        launch.int_flag("--tensor-model-parallel-size"),
        launch.int_flag("--pipeline-model-parallel-size"),
    )
    ep = launch.int_flag("--expert-model-parallel-size")
    if tp is None or pp is None or ep is None or not 0 < tp * pp * ep <= 4096:
        return False
    want = expected_rank_dirs(tp, pp, ep)
    missing, extra = sorted(want - present), sorted(present - want)
    if not missing and not extra:
        return False
    layout = "mp_rank_{tp:02d}" if pp == 1 else "mp_rank_{tp:02d}_{pp:03d}"
    message = (
        f"{iter_dir} does not match TP={tp} PP={pp}: expected {layout} dirs "
        f"{', '.join(sorted(want))}"
        + (f"; missing {', '.join(missing)}" if missing else "")
        + (f"; unexpected {', '.join(extra)}" if extra else "")
    )
    fix = (
        f"re-convert the weights with mm-convert using tp_size {tp} and a {pp}-stage pp_layers list "
        "(llm_pp_layers/vit_pp_layers for VLMs) matching the model config, or resplit the checkpoint; "
        "or set TP/PP in the script to the sizes it was converted with"
    )
    if missing:
        job.sink.error(
            "ckpt.rank_dirs",
            file,
            message + " ('No such file or directory: .../model_optim_rng.pt')",
            fix,
            field=field,
            line=line,
        )
    else:
        job.sink.warning("ckpt.rank_dirs", file, message, fix, field=field, line=line)
    return True


# ---------------------------------------------------------------------------------------------------------
# the conversion manifest (mm-agent convert writes it next to every converted checkpoint)

_LAYER_LISTS = {
    "pp_layers": ("predictor.pipeline_num_layers", "text_decoder.pipeline_num_layers"),
    "vit_pp_layers": ("image_encoder.vision_encoder.pipeline_num_layers",),
}


def _chunks(value: Any) -> list[list[int]] | None:
    """A pp list as VPP chunks ([7,8] -> [[7,8]]); None when it is not a list of layer counts."""
    if not isinstance(value, list) or not value:
        return None
    rows = value if all(isinstance(v, list) for v in value) else [value]
    if not all(isinstance(n, int) and not isinstance(n, bool) for r in rows for n in r):
        return None
    return [list(r) for r in rows]


def _job_lists(launch: Launch) -> dict[str, tuple[str, list[list[int]]]]:
    """manifest field -> (model config key, its value as chunks) for the lists the job's model config sets."""
    model = launch.configs.get("mm-model")
    found: dict[str, tuple[str, list[list[int]]]] = {}
    if model is None:
        return found
    for name, keys in _LAYER_LISTS.items():
        for key in keys:
            chunks = _chunks(model.get(key))
            if chunks is not None:
                found[name] = (key, chunks)
                break
    return found


def _manifest(
    job: Job, launch: Launch, path: Path, iter_dir: Path, where: tuple[str, str | None, int | None]
) -> None:
    """The split the weights were converted with (tp, pp_layers, vpp) must be the split the job trains with:
    a different one loads blocks into the wrong stages (missing/unexpected keys, shape mismatches)."""
    file, field, line = where
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        try:
            ranks = any(p.name.startswith("mp_rank_") for p in iter_dir.iterdir())
        except OSError:
            return
        if ranks:
            job.sink.warning(
                "ckpt.manifest_missing",
                file,
                f"{path} has no {MANIFEST}: the split it was converted with is unknown, so only the mp_rank "
                "dir names were checked against TP/PP, not the layers per stage",
                "convert with `mm-agent convert ... --yes` (it records tp, pp_layers and vpp), or make sure "
                "the pp_layers given to mm-convert equal the model config's pipeline_num_layers",
                field=field,
                line=line,
            )
        return
    try:
        manifest = read_manifest(path, job.root)
    except (OSError, MMAgentError) as exc:
        job.sink.warning(
            "ckpt.manifest_invalid",
            str(manifest_path),
            f"not an mm-agent conversion manifest: {exc.message if isinstance(exc, MMAgentError) else exc}",
            "re-run the conversion with `mm-agent convert` (or delete the file if it is not mm-agent's)",
        )
        return
    assert manifest is not None
    if manifest.direction == "mm_to_hf":
        return
    tp = launch.int_flag("--tensor-model-parallel-size")
    pp = launch.int_flag("--pipeline-model-parallel-size")
    vpp = launch.int_flag("--virtual-pipeline-model-parallel-size")
    have = {name: _chunks(getattr(manifest, name)) or [] for name in _LAYER_LISTS}
    stages = len(have["pp_layers"][0]) if have["pp_layers"] else 1
    diffs: list[str] = []
    if tp is not None and tp != manifest.tp:
        diffs.append(f"TP {manifest.tp} (job: {tp})")
    if pp is not None and pp != stages:
        diffs.append(f"PP {stages} (job: {pp})")
    if vpp is not None and vpp != manifest.vpp:
        diffs.append(f"VPP {manifest.vpp} (job: {vpp})")
    if (pp or 1) > 1 or (vpp or 1) > 1:
        for name, (key, want) in _job_lists(launch).items():
            if have[name] and have[name] != want:
                diffs.append(
                    f"{name} {getattr(manifest, name)} (job's {key}: {want if len(want) > 1 else want[0]})"
                )
    if not diffs:
        return
    job_lists = _job_lists(launch)
    layers = job_lists.get("pp_layers", ("", []))[1]
    shown = ",".join(map(str, layers[0])) if len(layers) == 1 else str(layers).replace(" ", "")
    resplit = (
        f"`mm-agent convert {shlex.quote(manifest.converter)} resplit --source {shlex.quote(str(path))} "
        "--target <new dir>"
        + (f" --tp {tp}" if tp and tp > 1 else "")
        + (f" --pp-layers {shlex.quote(shown)}" if layers else "")
        + "`"
    )
    job.sink.error(
        "ckpt.manifest_mismatch",
        file,
        f"{path} was converted with {'; '.join(diffs)}: the stages would load the wrong blocks "
        "(Megatron fails with missing/unexpected keys or size mismatches)",
        f"convert again with the job's split, e.g. {resplit}, and point {field or 'LOAD_PATH'} at it; or set "
        f"the job's TP/PP/VPP and pipeline_num_layers to the checkpoint's (tp {manifest.tp}, pp_layers "
        f"{manifest.pp_layers}, vpp {manifest.vpp})",
        field=field,
        line=line,
    )

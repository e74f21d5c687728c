"""Rules that hold a job's dataset against its own configs, so a dataset MindSpeed-MM would quietly shrink (or
fail on hours into a run) is caught before launch.

Video-text: the `{path, cap, num_frames, fps, resolution}` records a data config reaches (through `data.txt` in
combine mode, or its `data_path` json) judged with the config's `preprocess_parameters`, as
`OpensoraplanVideoProcessor.select_valid_data` would: it drops records without metadata or outside the limits
without an error, drops every sample size shared by fewer than 4 x global batch size clips, and crashes when
nothing is left. The per-clip decisions are `mm_agent.dataset.limits`'.
MLLM: the turn order `SharegptDatasetConverter` skips records over, and the image files the records name.

What other rule groups already report is not repeated here: record keys and video files (`rules_data`), Wan's
4n+1 frames (`rules_generative`), attr keys, roles and `<image>` counts (`rules_vlm`).
"""

from __future__ import annotations

import math
import os
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mm_agent.dataset.limits import (
    OPENSORAPLAN,
    ClipLimits,
    Refusal,
    extraction_split,
    frames_rule,
    limits_from_config,
    name_collision,
    plan_clip,
    small_groups,
)
from mm_agent.errors import MMAgentError
from mm_agent.validate.files import ConfigFile, jsonl_head
from mm_agent.validate.job import Job, Launch, exists, is_dir, is_file, to_int
from mm_agent.validate.parse import join

# Records judged per data config: arithmetic over a list `job.load` already holds, and the sample-size groups
# are only right over the whole list. Files are looked up for no more than SAMPLE records.
SCAN = 20_000
SAMPLE = 200
MAX_FILES = 1000  # image files looked up per MLLM dataset
EXAMPLES = 3
_PP = "dataset_param.preprocess_parameters"
_BP = "dataset_param.basic_parameters"
# MindSpeed-MM's data_utils/utils.py (VID_EXTENSIONS, TENSOR_EXTENSIONS) and torchvision's IMG_EXTENSIONS
VIDEO_EXT = (".mp4", ".avi", ".mov", ".mkv")
TENSOR_EXT = (".pt", ".pth")
IMAGE_EXT = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# MindSpeed-MM's DatasetAttr defaults, for keys a config's attr leaves out
ATTR_DEFAULTS: dict[str, Any] = {
    "messages": "conversations",
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
    "images": None,
    "ranking": False,
    "formatting": "sharegpt",
}
_VLM_PREFIX = {"vlm_data": "", "transformers_yaml": "data", "fsdp2_trainer_yaml": "data"}


def check(job: Job) -> None:
    for cfg in job.of_kind("fe_data", "sora_data"):
        _video_config(job, cfg)
    for cfg in list(job.configs.values()):
        prefix = _VLM_PREFIX.get(cfg.kind)
        if prefix is not None and isinstance(cfg.get(join(prefix, "dataset_param")), dict):
            _vlm_config(job, cfg, join(prefix, "dataset_param"))


# ---- video-text ----------------------------------------------------------------------------------------------
@dataclass
class _Tally:
    """What select_valid_data makes of the records of one data config (all its lists together)."""

    scanned: int = 0
    total: int = 0
    undecided: int = 0  # records this module cannot judge: no path (rules_data's), tensors, no limits
    uncaptioned: int = 0  # records without `cap`: dropped by select_valid_data, reported by rules_data
    missing: list[tuple[ConfigFile, int, list[str]]] = field(default_factory=list)
    refused: dict[str, list[tuple[ConfigFile, int, Refusal]]] = field(default_factory=dict)
    sizes: Counter[str] = field(default_factory=Counter)
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (sample size, path) of each kept clip
    files: list[ConfigFile] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)

    def refuse(self, dataset: ConfigFile, index: int, refusal: Refusal) -> None:
        self.refused.setdefault(refusal.code, []).append((dataset, index, refusal))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _quiet(job: Job, raw: Any, cfg: ConfigFile | None = None) -> Path | None:
    """The path when it exists inside the workspace, read from where `cfg`'s process runs; other rules report
    the ones that do not."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    path = job.resolve(raw, base=cfg.run_base, search=cfg.search) if cfg else job.resolve(raw)
    return path if path is not None and job.inside(path) and exists(path) else None


def _video_config(job: Job, cfg: ConfigFile) -> None:
    pre = cfg.get(_PP)
    if not isinstance(pre, dict):
        return
    launches = [ln for ln, role in job.users(cfg) if role == "mm-data"]
    if launches and all(ln.is_bundled for ln in launches):
        return  # mm-agent's runtime decodes each clip itself; select_valid_data never runs
    launch = next((ln for ln in launches if not ln.is_bundled), None)
    gbs = launch.int_flag("--global-batch-size", default=None) if launch else None
    cp = launch.int_flag("--context-parallel-size") if launch and pre.get("truncate_t_by_sp", True) else None
    try:
        lim = limits_from_config(cfg.data, source=str(cfg.path), global_batch_size=gbs, sp_size=cp)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        job.sink.info(
            "dataset.limits",
            str(cfg.path),
            f"preprocess_parameters.{key} is not usable ({first['msg']}); the dataset was not judged against it",
            f"give preprocess_parameters.{key} a number, as in the stock dataset configs",
            field=f"{_PP}.{key}",
            line=cfg.line(f"{_PP}.{key}"),
        )
        return
    if lim.processor == OPENSORAPLAN and not job.is_wan():  # rules_generative reports Wan's; other processors
        _frames(job, cfg, lim)  # serve VAEs with other strides (Step-Video's takes 17-frame chunks)
    tally = _Tally()
    for root, dataset in _raw_lists(job, cfg):
        tally.files.append(dataset)
        tally.roots += [root] if root is not None else []
        tally.total += len(dataset.data)
        for index, record in enumerate(dataset.data[: max(0, SCAN - tally.scanned)]):
            _judge(tally, dataset, index, record, lim)
        tally.scanned = min(SCAN, tally.total)
    if tally.files:
        _report_clips(job, tally)
        if lim.processor == OPENSORAPLAN and tally.scanned == tally.total and not tally.undecided:
            _report_groups(job, cfg, lim, tally, launch)
            small = small_groups(tally.sizes, lim)
            kept = [p for size, p in tally.accepted if size not in small]
            _extraction(job, cfg, launch, kept, tally.files[0] if len(tally.files) == 1 else cfg)
    elif launch is not None and launch.is_feature:
        standard = _standard_paths(job, cfg)  # standard mode: CogVideoXProcessor keeps every record
        if standard is not None:
            _extraction(job, cfg, launch, standard[1], standard[0])


def _frames(job: Job, cfg: ConfigFile, lim: ClipLimits) -> None:
    key = f"{_PP}.num_frames"
    frames = to_int(cfg.get(key))
    problem = frames_rule(frames, lim.ae_stride_t) if frames is not None and frames > 0 else None
    if problem and frames is not None:
        low = (frames - 1) // lim.ae_stride_t * lim.ae_stride_t + 1
        job.sink.error(
            "dataset.num_frames",
            str(cfg.path),
            f"{problem}; the video VAE encodes 1 + {lim.ae_stride_t}n frames, and MindSpeed-MM trims every clip to "
            "such a count",
            f"set num_frames to {low} or {low + lim.ae_stride_t}",
            field=key,
            line=cfg.line(key),
        )


def _raw_lists(job: Job, cfg: ConfigFile) -> list[tuple[Path | None, ConfigFile]]:
    """(dataset root, json list) for each list the config reads: the lines of its data.txt, or its json."""
    path = _quiet(job, cfg.get(f"{_BP}.data_path"), cfg)
    if path is None or not is_file(path) or path.suffix == ".jsonl":
        return []  # (a .jsonl is a standard-mode record file: its keys are rules_data's, read line by line)
    if path.suffix != ".txt":
        found = job.load(path)
        return [(None, found)] if found is not None and found.kind == "raw_dataset" else []
    txt = job.load(path, kind_hint="data_txt")
    if txt is None:
        return []
    out: list[tuple[Path | None, ConfigFile]] = []
    for text in txt.text.splitlines():
        root_raw, comma, json_raw = text.strip().rpartition(",")
        if text.strip().startswith("#") or not comma:
            continue  # rules_data reports malformed lines
        data = _quiet(job, json_raw, txt)
        found = job.load(data) if data is not None and is_file(data) else None
        if found is not None and found.kind == "raw_dataset":
            out.append((_quiet(job, root_raw, txt), found))
    return out


def _judge(tally: _Tally, dataset: ConfigFile, index: int, record: Any, lim: ClipLimits) -> None:
    """Tally one record as select_valid_data sees it: caption, then resolution, then frames."""
    opensoraplan = lim.processor == OPENSORAPLAN
    path = record.get("path") if isinstance(record, dict) else None
    ext = os.path.splitext(path)[1].lower() if isinstance(path, str) else ""
    if not isinstance(path, str) or ext in TENSOR_EXT or ("cap" not in record and not opensoraplan):
        tally.undecided += 1
        return
    if "cap" not in record:  # `sample.get("cap", None) is None`: dropped as 'No Caption' (see rules_data)
        tally.uncaptioned += 1
        return
    if record["cap"] is None:
        tally.refuse(
            dataset, index, Refusal(code="no_caption", reason="cap is null", fix="write a caption in 'cap'")
        )
        return
    res: dict[str, Any] = record["resolution"] if isinstance(record.get("resolution"), dict) else {}
    height: Any = res.get("height")
    width: Any = res.get("width")
    lacking = [k for k, v in (("resolution.height", height), ("resolution.width", width)) if not _number(v)]
    video = ext in VIDEO_EXT
    fps, frames, duration = record.get("fps"), record.get("num_frames"), record.get("duration")
    if video and not _number(fps):
        lacking.append("fps")
    if video and not _number(frames) and not (_number(duration) and _number(fps) and _number(fps * duration)):
        lacking.append("num_frames")
    if lacking or not (
        video or opensoraplan
    ):  # only OpenSora-Plan's processor needs (and filters on) metadata
        if lacking and opensoraplan:
            tally.missing.append((dataset, index, lacking))
        else:
            tally.undecided += 1
        return
    if not video and ext not in IMAGE_EXT:  # after resolution, _process_temporal raises on it
        tally.refuse(
            dataset,
            index,
            Refusal(
                code="extension",
                reason=f"{ext or 'no extension'!r} is neither a video nor an image, so MindSpeed-MM stops with "
                "'NameError: Unknown file extension'",
                fix=f"convert the file to one of {', '.join(VIDEO_EXT + IMAGE_EXT)}, or remove the record",
            ),
        )
        return
    if video:
        count = int(frames) if _number(frames) else round(fps * duration)
        plan = plan_clip(count, float(fps), int(height), int(width), lim)
    else:  # an image: one frame at its own size, so only the resolution rules can refuse it
        plan = plan_clip(max(lim.num_frames, 1), lim.train_fps, int(height), int(width), lim)
    if isinstance(plan, Refusal):
        tally.refuse(dataset, index, plan)
    else:
        size = f"{plan.sample_num_frames if video else 1}x{plan.sample_height}x{plan.sample_width}"
        tally.sizes[size] += 1
        tally.accepted.append((size, path))


def _of(tally: _Tally) -> str:
    return f"{tally.total}" if tally.scanned >= tally.total else f"the first {tally.scanned}"


def _dataset_command(job: Job, tally: _Tally, *, yes: bool) -> str:
    """The `mm-agent dataset` line for this job's clips: with `--job` when the job.yaml is here, so the line
    applies the job's own limits (without it the stock ones would refuse clips the job takes)."""
    root = shlex.quote(str(tally.roots[0])) if tally.roots else "<dataset root>"
    spec = next((c for c in job.of_kind("job_yaml") if isinstance(c.get("model"), str)), None)
    model = shlex.quote(str(spec.get("model"))) if spec is not None else "<model>"
    job_dir = f" --job {shlex.quote(str(spec.path.parent))}" if spec is not None else ""
    return f"mm-agent dataset {root} --model {model}{job_dir}" + (" --yes" if yes else "")


def _report_clips(job: Job, tally: _Tally) -> None:
    if tally.missing:
        dataset, index, lacking = tally.missing[0]
        job.sink.error(
            "dataset.metadata_missing",
            str(dataset.path),
            f"{len(tally.missing)} of {_of(tally)} records lack clip metadata (record {index}: no "
            f"{', '.join(lacking)}); MindSpeed-MM's select_valid_data silently drops such records",
            f"run `{_dataset_command(job, tally, yes=True)}`: it probes every clip and "
            "writes num_frames, fps and resolution {height, width} into the records",
            field=f"[{index}]",
            line=dataset.line(f"[{index}]"),
        )
    for code, cases in tally.refused.items():
        dataset, index, refusal = cases[0]
        examples = "; ".join(f"record {i}: {r.reason}" for _, i, r in cases[:EXAMPLES])
        fatal = code == "extension"
        job.sink.add(
            "error" if fatal else "warning",
            "dataset.clip_refused",
            str(dataset.path),
            f"{len(cases)} of {_of(tally)} records are {'unreadable' if fatal else 'left out'} by MindSpeed-MM "
            f"({code}): {examples}",
            refusal.fix,
            field=f"[{index}]",
            line=dataset.line(f"[{index}]"),
        )


def _report_groups(job: Job, cfg: ConfigFile, lim: ClipLimits, tally: _Tally, launch: Launch | None) -> None:
    """The final filter: every sample size needs 4 x global batch size clips, and something must be left."""
    small = small_groups(tally.sizes, lim)
    kept = sum(n for size, n in tally.sizes.items() if size not in small)
    only = tally.files[0] if len(tally.files) == 1 else None
    file = str(only.path) if only else str(cfg.path)
    at = None if only else f"{_BP}.data_path"
    line = None if only else cfg.line(f"{_BP}.data_path")
    script = launch.where("--global-batch-size", "GBS")[0] if launch else "the extraction script"
    floor = f"4 x global batch size {lim.global_batch_size} = {4 * (lim.global_batch_size or 0)}"
    grouped = ", ".join(f"{size}: {n}" for size, n in sorted(small.items()))
    if kept == 0 and tally.total:
        why = f"; no sample size reaches {floor} clips ({grouped})" if small else ""
        job.sink.error(
            "dataset.all_dropped",
            file,
            f"MindSpeed-MM keeps none of the {tally.total} records{why}; select_valid_data then fails with "
            "'ValueError: not enough values to unpack'",
            "fix the findings above"
            + (f", add clips of a common size or lower GBS in {script}" if small else "")
            + f" (`{_dataset_command(job, tally, yes=False)}` shows which clips are kept)",
            field=at,
            line=line,
        )
    elif small:
        job.sink.warning(
            "dataset.small_groups",
            file,
            f"{sum(small.values())} clips are dropped: MindSpeed-MM keeps a sample size (frames x height x width) "
            f"only when {floor} clips share it ({grouped})",
            f"add clips of those sizes, bring them to a common size (or set force_resolution), or lower GBS in "
            f"{script} (the floor is 4 x GBS)",
            field=at,
            line=line,
        )


# ---- MindSpeed-MM's feature extraction over several ranks -----------------------------------------------------
def _standard_paths(job: Job, cfg: ConfigFile) -> tuple[ConfigFile, list[str]] | None:
    """(config, every record's `file`) of a standard-mode raw data config whose record file is here."""
    ds = cfg.get("dataset_param")
    basic = cfg.get(_BP)
    if (
        not isinstance(ds, dict)
        or not isinstance(basic, dict)
        or ds.get("dataset_type") not in ("t2v", "i2v")
        or basic.get("data_storage_mode", "standard") != "standard"
    ):
        return None
    path = _quiet(job, basic.get("data_path"), cfg)
    if path is None or not is_file(path):
        return None
    if path.suffix != ".jsonl":
        found = job.load(path)
        records = found.data if found is not None and isinstance(found.data, list) else None
    else:
        try:
            records = jsonl_head(path, job.root, SCAN)
        except (MMAgentError, OSError):
            return None
    if records is None or len(records) >= SCAN:
        return None  # (unreadable, or too long to count here)
    return cfg, [r.get("file", "") if isinstance(r, dict) else "" for r in records]


def _extraction(job: Job, cfg: ConfigFile, launch: Launch | None, paths: list[str], at: ConfigFile) -> None:
    """What MindSpeed-MM's feature extraction does with these kept samples on this launch's data-parallel ranks
    (`limits.extraction_split`, `limits.name_collision`): repeated samples written by two ranks at once, samples
    left without features, clips whose file names write one feature file."""
    if launch is None or not launch.is_feature or launch.is_bundled or not paths:
        return
    from mm_agent.validate.rules_parallel import sizes  # (a sibling rule module; no cycle at import time)

    s = sizes(launch)
    parallel = (s.tp or 1) * (s.pp or 1) * (s.cp or 1)
    line = at.line("[0]") if at is not cfg else cfg.line(f"{_BP}.data_path")
    if s.world and s.mbs and not s.world % parallel:
        loader = cfg.get("dataloader_param")
        split = extraction_split(
            len(paths), s.world // parallel, s.mbs, loader if isinstance(loader, dict) else {}
        )
        if split is not None:
            script = launch.where(None, "NPUS_PER_NODE")[0]
            job.sink.add(
                "warning" if split.code == "duplicate_writes" else "error",
                f"extract.{split.code}",
                str(at.path),
                split.reason,
                f"{split.fix} (NPUS_PER_NODE in {script})",
                line=line,
            )
    clash = name_collision(paths)
    if clash is not None:
        job.sink.warning("extract.name_collision", str(at.path), clash.reason, clash.fix, line=line)


# ---- MLLM ----------------------------------------------------------------------------------------------------
def _vlm_config(job: Job, cfg: ConfigFile, at: str) -> None:
    dp = cfg.get(at)
    attr = {**ATTR_DEFAULTS, **(dp.get("attr") if isinstance(dp.get("attr"), dict) else {})}
    bp = dp.get("basic_parameters") if isinstance(dp.get("basic_parameters"), dict) else {}
    names = bp.get("dataset")
    if attr["formatting"] != "sharegpt" or attr["ranking"] or not isinstance(names, str):
        return
    base = _quiet(job, bp.get("dataset_dir"), cfg)
    base = base if base is not None and is_dir(base) else None
    for name in (n for n in names.split(",") if n.strip()):
        candidates = [
            job.resolve(name, base=base) if base else None,
            job.resolve(name, base=cfg.run_base, search=cfg.search),
        ]
        path = next((p for p in candidates if p is not None and job.inside(p) and is_file(p)), None)
        if path is None:
            continue  # rules_vlm reports a missing dataset
        records, source = _records(job, path)
        _turns(job, attr, path, records, source)
        _images(job, attr, base, path, records, source)


def _records(job: Job, path: Path) -> tuple[list[Any], ConfigFile | None]:
    """The first SAMPLE records of an MLLM JSON/JSONL file (the JSON one parsed once, with line numbers)."""
    if path.suffix != ".jsonl":
        found = job.load(path)
        return (
            (found.data[:SAMPLE], found) if found is not None and isinstance(found.data, list) else ([], None)
        )
    try:
        out = jsonl_head(path, job.root, SAMPLE)
    except (MMAgentError, OSError):
        return [], None  # rules_vlm reports an unreadable dataset
    return out, None


def _turn_problem(attr: dict[str, Any], messages: list[dict[str, Any]]) -> str | None:
    odd = (attr["user_tag"], attr["observation_tag"])
    even = (attr["assistant_tag"], attr["function_tag"])
    roles = [m.get(attr["role_tag"]) for m in messages]
    if attr["system_tag"] and roles and roles[0] == attr["system_tag"]:
        roles = roles[1:]
    for turn, role in enumerate(roles):
        expected = (odd, even)[turn % 2]
        if role not in expected:
            wanted = "/".join(str(r) for r in expected if r)
            return f"turn {turn} is {role!r} where {wanted} belongs ('Invalid role tag')"
    if not roles or len(roles) % 2:
        return (
            f"{len(roles)} turn(s); a conversation ends with the assistant's answer ('Invalid message count')"
        )
    return None


def _turns(job: Job, attr: dict[str, Any], path: Path, records: list[Any], source: ConfigFile | None) -> None:
    known = {
        attr[k] for k in ("user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
    } - {None}
    bad: list[tuple[int, str]] = []
    for index, record in enumerate(records):
        messages = record.get(attr["messages"]) if isinstance(record, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            continue  # rules_vlm reports records without the messages list
        if any(m.get(attr["role_tag"]) not in known for m in messages):
            continue  # and roles attr does not name
        problem = _turn_problem(attr, messages)
        if problem:
            bad.append((index, problem))
    if bad:
        index, problem = bad[0]
        job.sink.warning(
            "dataset.vlm_turns",
            str(path),
            f"{len(bad)} of the first {len(records)} records are skipped by MindSpeed-MM's SharegptDatasetConverter "
            f"('Skipping this abnormal example'; record {index}: {problem})",
            f"alternate {attr['user_tag']} and {attr['assistant_tag']} turns (an optional {attr['system_tag']} "
            f"turn first) and end each conversation with the {attr['assistant_tag']}'s answer",
            field=f"[{index}]",
            line=source.line(f"[{index}]") if source else None,
        )


def _images(
    job: Job,
    attr: dict[str, Any],
    base: Path | None,
    path: Path,
    records: list[Any],
    source: ConfigFile | None,
) -> None:
    key = attr["images"]
    if not isinstance(key, str):
        return  # rules_vlm reports images a null attr.images ignores
    checked, missing = 0, []
    for index, record in enumerate(records):
        if checked >= MAX_FILES:
            break
        value = record.get(key) if isinstance(record, dict) else None
        for media in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if not isinstance(media, str) or not media.strip():
                continue
            # MindSpeed-MM's _find_media_files: dataset_dir/<media> when that file exists, else the path as given
            tried = [p for p in (base / media if base else None, job.resolve(media)) if p is not None]
            if not tried or not all(job.inside(p) for p in tried):
                continue
            checked += 1
            if not any(is_file(p) for p in tried):
                missing.append((index, media))
    if missing:
        index, media = missing[0]
        job.sink.warning(
            "dataset.image_missing",
            str(path),
            f"{len(missing)} of {checked} image files named by the first {len(records)} records do not exist "
            f"(record {index}: {media!r}); loading fails there with FileNotFoundError",
            f"make the paths in {key!r} relative to basic_parameters.dataset_dir ({base or 'unset'}) or absolute, "
            "or copy the images there",
            field=f"[{index}].{key}",
            line=source.line(f"[{index}]") if source else None,
        )

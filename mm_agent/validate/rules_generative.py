"""Rules for generative (Wan-style DiT) jobs: feature extraction inputs/outputs and dataset files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mm_agent.errors import MMAgentError
from mm_agent.validate.files import ConfigFile, lines, open_text
from mm_agent.validate.job import Job, exists, to_int

SAMPLE = 200
_BP = "dataset_param.basic_parameters"
_PP = "dataset_param.preprocess_parameters"
# Feature-extraction entry points that split train_pipeline into video_only / video_and_first_frame and raise
# 'ValueError: "<key>" key not found in vid_img_process["train_pipeline"]' without them: upstream's
# mindspeed_mm/tools/feature_extraction/get_wan_feature.py (2.2.0-26.1.0; get_sora/hunyuan/vace_feature.py
# never read them) and mm-agent's bundled runtime.extract, which mirrors it.
TWO_STAGE_FE_SCRIPTS = ("get_wan_feature", "runtime.extract")


def check(job: Job) -> None:
    for cfg in job.of_kind("fe_data", "sora_data"):
        _data_path(job, cfg)
    for cfg in job.of_kind("feature_data"):
        _feature_data(job, cfg)
    _feature_extraction(job)
    if job.is_wan():
        for cfg in job.of_kind("feature_data", "fe_data", "sora_data"):
            _num_frames(job, cfg)


def _data_path(job: Job, cfg: ConfigFile) -> None:
    raw = cfg.get(f"{_BP}.data_path")
    field = f"{_BP}.data_path"
    path = job.check_path(
        raw,
        file=str(cfg.path),
        field=field,
        line=cfg.line(field),
        what="data_path",
        base=cfg.run_base,
        search=cfg.search,
    )
    if path is not None and path.is_file() and path.suffix == ".txt" and job.inside(path):
        txt = job.load(path, kind_hint="data_txt")
        if txt is not None and txt.run_base is None and not txt.search:
            txt.run_base, txt.search = cfg.run_base, cfg.search  # read by the same process


def _feature_data(job: Job, cfg: ConfigFile) -> None:
    file = str(cfg.path)
    folder_raw = cfg.get(f"{_BP}.data_folder")
    folder_field = f"{_BP}.data_folder"
    folder = None
    if isinstance(folder_raw, str) and folder_raw.strip():
        if os.path.basename(os.path.normpath(folder_raw)) == "features":
            parent = folder_raw.rstrip("/")[: -len("features")] or "./"
            job.sink.error(
                "feature.data_folder",
                file,
                f"data_folder {folder_raw!r} is the features/ subdirectory; data.jsonl "
                "entries already start with 'features/', so paths double up (features/features/xxx.pt)",
                f"set data_folder to the feature root (sorafeature.save_path), i.e. {parent!r}",
                field=folder_field,
                line=cfg.line(folder_field),
            )
        else:
            folder = job.check_path(
                folder_raw,
                file=file,
                field=folder_field,
                line=cfg.line(folder_field),
                what="data_folder",
                base=cfg.run_base,
                search=cfg.search,
            )
    field = f"{_BP}.data_path"
    jsonl = job.check_path(
        cfg.get(field),
        file=file,
        field=field,
        line=cfg.line(field),
        what="data_path",
        fix="run feature extraction first (it writes <save_path>/data.jsonl), or fix data_path",
        base=cfg.run_base,
        search=cfg.search,
    )
    if jsonl is not None and jsonl.is_file():
        _jsonl(job, jsonl, folder)


def _jsonl(job: Job, path: Path, folder: Path | None) -> None:
    file = str(path)
    missing: list[str] = []
    try:
        with open_text(path, job.root) as fh:
            for number, text in enumerate(lines(fh), 1):
                if number > SAMPLE:
                    break
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except ValueError as exc:
                    job.sink.error(
                        "feature.jsonl_record",
                        file,
                        f"line {number} is not JSON: {exc}",
                        "re-run feature extraction to rewrite data.jsonl",
                        line=number,
                    )
                    return
                entry = record.get("file") if isinstance(record, dict) else None
                if not isinstance(entry, str):
                    job.sink.error(
                        "feature.jsonl_record",
                        file,
                        f"record on line {number} has no 'file' entry",
                        "use the data.jsonl written by feature extraction (each record has "
                        '"file": "features/<name>.pt")',
                        field="file",
                        line=number,
                    )
                    return
                if not entry.endswith(".pt"):
                    job.sink.error(
                        "feature.jsonl_record",
                        file,
                        f"'file' {entry!r} on line {number} is not a .pt file "
                        "('NotImplementedError: Unsupported file format. Only .pt files are currently "
                        "supported.')",
                        "point 'file' at the .pt feature files written by feature extraction",
                        field="file",
                        line=number,
                    )
                    return
                if folder is not None and job.inside(folder / entry) and not exists(folder / entry):
                    missing.append(entry)
    except MMAgentError as exc:
        job.sink.error("file.unreadable", file, f"cannot read: {exc.message}", exc.fix or "fix data_path")
        return
    except OSError as exc:
        job.sink.error(
            "file.unreadable", file, f"cannot read: {exc.strerror or exc}", "make data.jsonl readable"
        )
        return
    if missing:
        job.sink.warning(
            "feature.file_missing",
            file,
            f"{len(missing)} feature file(s) listed here are missing under "
            f"data_folder {folder} (first: {missing[0]})",
            "let feature extraction finish, or set data_folder to the save_path the features were written to",
            field="file",
        )


def _same_path(job: Job, a: str, b: str) -> bool | None:
    pa, pb = job.resolve(a), job.resolve(b)
    if pa is not None and pb is not None:
        return pa == pb
    if os.path.isabs(a) != os.path.isabs(b):
        return None
    return os.path.normpath(a) == os.path.normpath(b)


def _feature_extraction(job: Job) -> None:
    fe_launches = [ln for ln in job.launches if ln.is_feature]
    used = {id(c) for ln in job.launches for c in ln.configs.values()}
    has_fe = bool(fe_launches or job.of_kind("fe_model"))
    two_stage = [ln for ln in fe_launches if any(m in (ln.cmd.entry or "") for m in TWO_STAGE_FE_SCRIPTS)]
    datas = [ln.configs["mm-data"] for ln in two_stage if "mm-data" in ln.configs]
    tools = [ln.configs["mm-tool"] for ln in fe_launches if "mm-tool" in ln.configs]
    if has_fe and len(two_stage) == len(fe_launches):
        # a data config no launch passes: judged as Wan's unless the job extracts with another script
        datas += [c for c in job.of_kind("fe_data") if id(c) not in used]
        tools += [c for c in job.of_kind("tools") if id(c) not in used and not fe_launches]
    for cfg in datas:
        pipeline = cfg.get(f"{_PP}.train_pipeline")
        for key in ("video_only", "video_and_first_frame"):
            if isinstance(pipeline, dict) and key in pipeline:
                continue
            field = f"{_PP}.train_pipeline.{key}"
            job.sink.error(
                "fe.train_pipeline",
                str(cfg.path),
                f"feature extraction needs train_pipeline.{key}: "
                f'\'ValueError: "{key}" key not found in vid_img_process["train_pipeline"]\'',
                f"add train_pipeline.{key} as in the stock examples/wan2.1/feature_extract/data.json",
                field=field,
                line=cfg.line(field),
            )
    save_paths: list[tuple[ConfigFile, str]] = []
    for cfg in tools:
        save = cfg.get("sorafeature.save_path")
        if isinstance(save, str) and save.strip():
            save_paths.append((cfg, save))
            continue
        job.sink.error(
            "fe.sorafeature",
            str(cfg.path),
            "tools config used for feature extraction has no sorafeature.save_path "
            "(\"AttributeError: 'ConfigReader' object has no attribute 'sorafeature'\")",
            'add "sorafeature": {"save_path": "./sora_features"} (the directory features are written to)',
            field="sorafeature.save_path",
            line=cfg.line("sorafeature"),
        )
    for tools_cfg, save in save_paths:
        for cfg in job.of_kind("feature_data"):
            _compare(job, cfg, tools_cfg, save)


def _compare(job: Job, cfg: ConfigFile, tools_cfg: ConfigFile, save: str) -> None:
    folder, data_path = cfg.get(f"{_BP}.data_folder"), cfg.get(f"{_BP}.data_path")
    checks = [("data_folder", folder, save), ("data_path", data_path, os.path.join(save, "data.jsonl"))]
    for key, value, want in checks:
        if not isinstance(value, str) or os.path.basename(os.path.normpath(value)) == "features":
            continue
        if _same_path(job, value, want) is False:
            field = f"{_BP}.{key}"
            job.sink.warning(
                "feature.save_path_mismatch",
                str(cfg.path),
                f"{key} {value!r} differs from where feature "
                f"extraction writes ({tools_cfg.path}: sorafeature.save_path {save!r})",
                f"set {key} to {want!r} (or change sorafeature.save_path)",
                field=field,
                line=cfg.line(field),
            )


def _num_frames(job: Job, cfg: ConfigFile) -> None:
    field = f"{_PP}.num_frames"
    n = to_int(cfg.get(field))
    if n is None or n < 1 or (n - 1) % 4 == 0:
        return
    low = (n - 1) // 4 * 4 + 1
    job.sink.error(
        "wan.num_frames",
        str(cfg.path),
        f"num_frames {n} is not 4n+1; the Wan VAE packs 4 frames per latent after "
        "the first (81 frames → 21 latents)",
        f"set num_frames to {low} or {low + 4}",
        field=field,
        line=cfg.line(field),
    )

"""Rules for raw dataset inputs, by the storage mode the data config reads them in (what the model's dataset class
takes, `registry/data/dataset_formats.yaml`):
- combine: `data.txt` (`<dataset_root>,<data.json>` per line) and the json list of `{path, cap}` records it names
  (`DataFileReader.get_cap_list`);
- standard (CogVideoX, Step-Video): `data_path` is a data.jsonl (or a .json list) of `{file, captions}` records,
  `file` relative to `data_folder` (`T2VDataset.getitem`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.validate.files import ConfigFile, lines, open_text
from mm_agent.validate.job import Job, exists, resolved

SAMPLE = 200
_RENAMES = {
    "video": "path",
    "video_path": "path",
    "file": "path",
    "filename": "path",
    "image": "path",
    "caption": "cap",
    "captions": "cap",
    "text": "cap",
    "prompt": "cap",
}


_BP = "dataset_param.basic_parameters"
# standard mode's record keys (mindspeed_mm/data/data_utils/constants.py:14-16: FILE_INFO, CAPTIONS) and the
# combine-mode names a record written for another model holds instead
_STANDARD_RENAMES = {
    "path": "file",
    "video": "file",
    "video_path": "file",
    "cap": "captions",
    "caption": "captions",
}
_STANDARD_CITE = "mindspeed_mm/data/datasets/t2v_dataset.py:139-161"


def check(job: Job) -> None:
    standard: set[Path] = set()
    for cfg in job.of_kind("fe_data", "sora_data"):
        records = _standard_records(job, cfg)
        real = resolved(records) if records is not None else None
        if real is not None:
            standard.add(real)  # (a loaded file's path is its resolved one)
    for cfg in job.of_kind("data_txt"):
        _data_txt(job, cfg)
    for cfg in job.of_kind("raw_dataset"):
        if cfg.path not in standard:
            _raw_dataset(job, cfg)


def _data_txt(job: Job, cfg: ConfigFile) -> None:
    file = str(cfg.path)
    for number, text in enumerate(cfg.text.splitlines(), 1):
        line = text.strip()
        if not line or line.startswith("#"):
            continue
        root_raw, comma, json_raw = line.rpartition(",")
        if not comma or not root_raw.strip() or not json_raw.strip():
            job.sink.error(
                "data_txt.format",
                file,
                f"line {number} {line[:80]!r} is not '<dataset_root>,<path/to/data.json>'",
                "write one dataset per line as `<dataset_root>,<data.json>` (e.g. "
                "/data/wan2.1/dataset,/data/wan2.1/data.json)",
                line=number,
            )
            continue
        root = job.check_path(
            root_raw,
            file=file,
            field=None,
            line=number,
            what="dataset root",
            base=cfg.run_base,
            search=cfg.search,
        )
        exists = root is not None and root.is_dir()
        data = job.check_path(
            json_raw,
            file=file,
            field=None,
            line=number,
            what="dataset json",
            severity="error" if exists else "warning",
            rule="data_txt.json_missing" if exists else "path.missing",
            fix="point the part after the comma at the dataset's json list of {path, cap} records",
            base=cfg.run_base,
            search=cfg.search,
        )
        if data is not None and data.is_file():
            dataset = job.load(data)
            if dataset is not None and dataset.kind == "raw_dataset" and exists and root is not None:
                _videos(job, dataset, root)


def _videos(job: Job, cfg: ConfigFile, root: Path) -> None:
    records = [r for r in cfg.data[:SAMPLE] if isinstance(r, dict) and isinstance(r.get("path"), str)]
    missing = [
        i for i, r in enumerate(records) if job.inside(root / r["path"]) and not exists(root / r["path"])
    ]
    if missing:
        first = records[missing[0]]["path"]
        job.sink.warning(
            "dataset.video_missing",
            str(cfg.path),
            f"{len(missing)} of the first {len(records)} records point at "
            f"missing files under {root} (first: {first!r}; 'AssertionError: file ... do not exist!')",
            "make each record's path relative to the dataset root in data.txt",
            field=f"[{missing[0]}].path",
            line=cfg.line(f"[{missing[0]}]"),
        )


def _raw_dataset(job: Job, cfg: ConfigFile) -> None:
    """Records without `path` stop the run; records without `cap` are dropped (MindSpeed-MM 26.0.0 and 26.1.0,
    same lines in both):
    - `path`: combine mode's DataFileReader._change_path reads `item["path"]` of every record while the dataset
      loads (mindspeed_mm/data/data_utils/utils.py:132), a KeyError before the first step;
    - `cap`: OpensoraplanVideoProcessor.select_valid_data (the processor of every Wan/OpenSora-Plan config) drops
      a record whose `sample.get("cap")` is None and counts it as "No Caption"
      (mindspeed_mm/data/data_utils/video_processor.py:494 and 515-519); with the other processors, whose
      select_valid_data keeps every record, `sample["cap"]` raises in T2VDataset.getitem
      (mindspeed_mm/data/datasets/t2v_dataset.py:167) and __getitem__ catches it, prints "the error is 'cap'" and
      returns a random other record instead (t2v_dataset.py:139-149). Either way the record is never trained on
      and nothing stops, so it is a warning (rules_dataset reports a list from which nothing is left)."""
    sampled = cfg.data[:SAMPLE]
    no_path = [(i, r) for i, r in enumerate(sampled) if not isinstance(r, dict) or "path" not in r]
    no_cap = [(i, r) for i, r in enumerate(sampled) if isinstance(r, dict) and "path" in r and "cap" not in r]
    for bad, missing in ((no_path, "path"), (no_cap, "cap")):
        if not bad:
            continue
        index, record = bad[0]
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        named = record if isinstance(record, dict) else {}
        renames = [f"{k} → {_RENAMES[k]}" for k in named if k in _RENAMES and _RENAMES[k] not in named]
        head = (
            f"{len(bad)} of the first {len(sampled)} records have no {missing!r} (record {index} has {keys})"
        )
        job.sink.add(
            "error" if missing == "path" else "warning",
            "dataset.keys",
            str(cfg.path),
            head + "; loading the dataset stops with KeyError: 'path'"
            if missing == "path"
            else head + "; MindSpeed-MM drops them without an error (select_valid_data counts them as "
            "'No Caption'), so they are never trained on",
            f"rename the record keys: {', '.join(renames)}"
            if renames
            else "give every record a 'path' (relative to the dataset root) and a 'cap' (caption)",
            field=f"[{index}]",
            line=cfg.line(f"[{index}]"),
        )


# ---- standard mode (CogVideoX, Step-Video) ---------------------------------------------------------------------
def _standard_records(job: Job, cfg: ConfigFile) -> Path | None:
    """Check the `{file, captions}` records of a standard-mode raw data config; the record file's path, or None
    when `cfg` is no such config or its file is not here (rules_generative reports a missing data_path)."""
    ds = cfg.get("dataset_param")
    basic = cfg.get(_BP)
    if (
        not isinstance(ds, dict)
        or not isinstance(basic, dict)
        or ds.get("dataset_type") not in ("t2v", "i2v")
    ):
        return None
    if basic.get("data_storage_mode", "standard") != "standard":  # MMBaseDataset's default mode
        return None
    raw = basic.get("data_path")
    path = (
        job.resolve(raw, base=cfg.run_base, search=cfg.search)
        if isinstance(raw, str) and raw.strip()
        else None
    )
    if path is None or not job.inside(path) or not path.is_file():
        return None
    folder_raw = basic.get("data_folder")
    folder = (
        job.resolve(folder_raw, base=cfg.run_base, search=cfg.search)
        if isinstance(folder_raw, str) and folder_raw.strip()
        else None
    )
    records = _read_records(job, path)
    if records is not None:
        _standard_keys(job, path, records)
        if folder is not None and folder.is_dir():
            _standard_files(job, path, records, folder)
    return path


def _read_records(job: Job, path: Path) -> list[tuple[int, Any]] | None:
    """(line, record) of the first SAMPLE records, read as MindSpeed-MM's orjson_load does: a `.jsonl` line by
    line, anything else as one JSON document (utils.py:936-946 at 26.0.0)."""
    file = str(path)
    try:
        if path.suffix != ".jsonl":
            cfg = job.load(path)
            if cfg is None or not isinstance(cfg.data, list):
                return None  # a syntax error is reported by the loader; a non-list by the KeyError below
            return [(cfg.line(f"[{i}]") or 1, r) for i, r in enumerate(cfg.data[:SAMPLE])]
        out: list[tuple[int, Any]] = []
        with open_text(path, job.root) as fh:
            for number, text in enumerate(lines(fh), 1):
                if len(out) >= SAMPLE:
                    break
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                    problem = "it is a JSON list, not a record" if isinstance(record, list) else None
                except ValueError as exc:
                    record, problem = None, str(exc)
                if problem is None:
                    out.append((number, record))
                else:
                    listed = text.lstrip().startswith("[")
                    job.sink.error(
                        "dataset.jsonl",
                        file,
                        f"line {number} is not one JSON record ({problem}); MindSpeed-MM reads a .jsonl one "
                        "record per line, so "
                        + (
                            "the first batch fails"
                            if isinstance(record, list)
                            else "loading the dataset fails"
                        ),
                        "rename the file to .json (a JSON list) and point data_path at it"
                        if listed
                        else "write one JSON object per line, e.g. "
                        '{"file": "videos/1.mp4", "captions": "a caption"}',
                        line=number,
                    )
                    return None
        return out
    except (MMAgentError, OSError) as exc:
        reason = exc.message if isinstance(exc, MMAgentError) else exc.strerror or str(exc)
        job.sink.error("file.unreadable", file, f"cannot read: {reason}", "make the dataset file readable")
        return None


def _standard_keys(job: Job, path: Path, records: list[tuple[int, Any]]) -> None:
    """`file` missing: T2VDataset.getitem raises KeyError('file'), and its __getitem__ handler reads the same key
    to print the path, so the KeyError escapes at the first batch holding the record (t2v_dataset.py:139-161).
    `captions` missing: getitem's KeyError('captions') is caught, "Data <file>: the error is 'captions'" printed
    and a random other record trained instead: the record is never trained on (every record without one: the
    handler recurses until Python's recursion limit)."""
    no_file = [(i, ln, r) for i, (ln, r) in enumerate(records) if not isinstance(r, dict) or "file" not in r]
    no_cap = [
        (i, ln, r)
        for i, (ln, r) in enumerate(records)
        if isinstance(r, dict) and "file" in r and "captions" not in r
    ]
    for bad, key in ((no_file, "file"), (no_cap, "captions")):
        if not bad:
            continue
        index, line, record = bad[0]
        named = record if isinstance(record, dict) else {}
        keys = sorted(named) if isinstance(record, dict) else type(record).__name__
        renames = [f"{k} → {v}" for k, v in _STANDARD_RENAMES.items() if k in named and v not in named]
        head = f"{len(bad)} of the first {len(records)} records have no {key!r} (record {index} has {keys})"
        every = key == "captions" and len(bad) == len(records)
        if key == "file":
            effect = (
                "; T2VDataset (standard mode) stops the run with KeyError: 'file' at the first batch that holds "
                f"one ({_STANDARD_CITE})"
            )
        elif every:
            effect = (
                "; T2VDataset skips a record without captions by training a random other one, and with none "
                f"left it recurses until RecursionError ({_STANDARD_CITE})"
            )
        else:
            effect = (
                "; T2VDataset catches their KeyError, prints \"the error is 'captions'\" and trains a random "
                f"other record instead, so they are never trained on ({_STANDARD_CITE})"
            )
        job.sink.add(
            "error" if key == "file" or every else "warning",
            "dataset.keys",
            str(path),
            head + effect,
            f"rename the record keys: {', '.join(renames)} (this model reads {{file, captions}} records; "
            f"`mm-agent dataset <dir> --model <model>` writes them)"
            if renames
            else "give every record a 'file' (relative to data_folder) and a 'captions' string",
            field=f"[{index}]",
            line=line,
        )


def _standard_files(job: Job, path: Path, records: list[tuple[int, Any]], folder: Path) -> None:
    """A record whose file is not under data_folder fails to open in getitem; the handler trains a random other
    record instead (t2v_dataset.py:139-149), so the clip is silently never trained on."""
    named = [
        (i, ln, r["file"])
        for i, (ln, r) in enumerate(records)
        if isinstance(r, dict) and isinstance(r.get("file"), str)
    ]
    missing = [(i, ln, f) for i, ln, f in named if job.inside(folder / f) and not exists(folder / f)]
    if missing:
        index, line, first = missing[0]
        job.sink.warning(
            "dataset.video_missing",
            str(path),
            f"{len(missing)} of the first {len(named)} records name files missing under data_folder {folder} "
            f"(record {index}: {first!r}); T2VDataset trains a random other record in their place",
            "make each record's 'file' relative to data_folder, or set data_folder to the folder the files are in",
            field=f"[{index}].file",
            line=line,
        )

"""Rules for raw dataset inputs: `data.txt` (`<dataset_root>,<data.json>` per line) and the json list
of `{path, cap}` records it names (combine mode, `DataFileReader.get_cap_list`)."""

from __future__ import annotations

from pathlib import Path

from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, exists

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


def check(job: Job) -> None:
    for cfg in job.of_kind("data_txt"):
        _data_txt(job, cfg)
    for cfg in job.of_kind("raw_dataset"):
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

"""What MindSpeed-MM's own dataset readers make of the files `prepare_dataset` writes (issue 26, item 4), per
registered job and release; the report's "dataset read by its reader" column (`rows`).

For every job whose reader mm-agent writes for (`mm_agent/registry/data/dataset_formats.yaml`), at 26.0.0 and
26.1.0: the job is rendered (`render_job`, one NPU where the layout allows, so the extraction's final filter keeps
a sample size shared by 4 clips), a small dataset made for it (real H.264 clips sized to the job's own limits,
or a PNG and a LLaVA index for a VLM), `prepare_dataset` writes the index the job points at, and
`upstream_readers.py` feeds that index, under the job's rendered data config, to the model's own dataset class
at that release. A job reads when the class keeps every written record, and item 0 is the first record as written
(its file opened by decord with the frames written, its caption). Jobs whose reader mm-agent does not write for
are marked in the data with the reason and fix (the cell says so); their record keys are checked by `ast`
(`reader_keys`, tests/fidelity/test_dataset_readers.py).

Jobs of one task whose rendered data config, reader and limits are the same (Wan2.1's t2v on its two backends)
share one dataset and one reading: the same config and the same file give the same answer.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.dataset.formats import ReaderEntry, ReaderFormat, reader_format
from mm_agent.dataset.limits import ClipLimits, ClipPlan, plan_clip
from mm_agent.dataset.target import Target, resolve_target
from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from tests.fidelity.report_cell import Cell

HERE = Path(__file__).resolve().parent
VERSIONS = ("26.0.0", "26.1.0")
CLIPS = 4  # 4 x the one-NPU extraction's global batch size 1: a sample size MindSpeed-MM's final filter keeps
CONVERT = {  # the reader module -> the module that holds its record converter
    "mindspeed_mm/data/datasets/qwen2vl_dataset.py": "mindspeed_mm.data.data_utils.func_utils.convert",
    "mindspeed_mm/fsdp/data/datasets/huggingface/qwen2vl_dataset.py": (
        "mindspeed_mm.fsdp.data.data_utils.func_utils.convert"
    ),
}


@dataclass(frozen=True)
class Job:
    model: str
    task: str
    backend: str
    version: str
    answer: ReaderFormat

    @property
    def label(self) -> str:
        return f"{self.model}-{self.task}-{self.backend.replace('+', '_')}-{self.version}"


def jobs(version: str) -> list[Job]:
    """Every registered (model, task, backend) at `version`, with the reader the table records for it."""
    reg = get_registry()
    out = []
    for entry in reg.models.values():
        if not entry.versions.contains(version):
            continue
        for task in entry.tasks:
            if task.versions.contains(version):
                answer = reader_format(entry.id, task.id, version, task.backend)
                out.append(Job(entry.id, task.id, task.backend, version, answer))
    return out


@dataclass
class Prepared:
    """A job's dataset, written by prepare_dataset, and the case that feeds it to the job's reader."""

    job: Job
    case: dict[str, Any]
    records: list[dict[str, Any]]
    root: Path
    frames: int = 0
    notes: list[str] = field(default_factory=list)


def _render(job: Job, out: Path, dataset: Path, one_npu: bool) -> None:
    layout: dict[str, Any] = {"npus_per_node": 1, "tp": 1, "pp": 1, "cp": 1} if one_npu else {}
    request = RenderRequest(
        model=job.model,
        task=job.task,
        backend=job.backend,
        mm_version=job.version,
        out_dir=str(out),
        dataset_dir=str(dataset),
        confirm=True,
        **layout,
    )
    render_job(request, root=None)


def _clip_spec(lim: ClipLimits) -> tuple[int, int, int, int]:
    """(frames, fps, height, width) of a clip the job's limits accept and train at its full size."""
    if lim.processor != "OpensoraplanVideoProcessor":
        return 9, 16, 32, 48  # CogVideoXProcessor pads short clips and resizes any size
    fps = round(lim.train_fps)
    spec = (max(lim.num_frames, lim.min_num_frames), fps, lim.max_height, lim.max_width)
    assert isinstance(plan_clip(*spec, lim), ClipPlan), (spec, plan_clip(*spec, lim))
    return spec


def _clip_library(lib: Path, spec: tuple[int, int, int, int]) -> list[Path]:
    """CLIPS distinct flat-colour clips of `spec`, written once per spec (encoding dominates the cost)."""
    from runtime.synth import write_mp4

    frames, fps, height, width = spec
    folder = lib / "x".join(str(v) for v in spec)
    paths = [folder / f"clip{i}.mp4" for i in range(CLIPS)]
    if not all(p.is_file() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(paths):
            video = np.zeros((frames, height, width, 3), np.uint8)
            video[..., i % 3] = 60 + 40 * i
            write_mp4(path, video, fps)
    return paths


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _image(path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), (200, 30, 30)).save(path)


def _prepare(job: Job, work: Path, lib: Path, seen: dict[str, Prepared]) -> Prepared:
    """Render `job`, make its dataset and let prepare_dataset write the index the job reads; a job whose
    rendered data config, reader and limits are one already prepared (`seen`) shares that one's dataset."""
    dataset, out = work / "dataset", work / "job"
    fmt = job.answer.format
    assert fmt is not None
    one_npu = job.answer.format_id != "mllm"
    try:
        _render(job, out, dataset, one_npu)
    except MMAgentError:  # a layout the model cannot take on one NPU: its stock one (GBS then per the job)
        shutil.rmtree(out, ignore_errors=True)
        _render(job, out, dataset, False)
    dataset.mkdir(parents=True, exist_ok=True)
    request: dict[str, Any] = {"dir": str(dataset), "model": job.model, "job_dir": str(out)}
    target: Target = resolve_target(DatasetRequest(**request), work, None)
    entry = job.answer.entry
    limits = target.limits.model_dump(exclude={"source"}) if target.limits else None
    same = json.dumps([job.answer.format_id, entry.reader, target.data_config, limits, job.task], default=str)
    key = hashlib.sha256(same.replace(str(work), "<work>").encode()).hexdigest()
    if key in seen:
        return seen[key]
    if job.answer.format_id == "mllm":  # an image, or a clip for a model that reads no images (Qwen2.5-Omni)
        attr = target.data_config["dataset_param"].get("attr", {})
        kind = "image" if attr.get("images", "images") else "video"
        media = f"{kind}s/red.{'png' if kind == 'image' else 'mp4'}"
        if kind == "image":
            _image(dataset / media)
        else:
            shutil.copyfile(_clip_library(lib, (9, 16, 64, 64))[0], _parent(dataset / media))
        chat = [{"from": "human", "value": f"<{kind}>\nWhat colour is it?"}, {"from": "gpt", "value": "Red."}]
        (work / "chat.json").write_text(json.dumps([{kind: media, "conversations": chat}]))
        request["index"] = str(work / "chat.json")
    frames = 0
    if job.answer.format_id != "mllm":
        assert target.limits is not None
        spec = _clip_spec(target.limits)
        frames = spec[0]
        for i, clip in enumerate(_clip_library(lib, spec)):
            rel = dataset / "videos" / f"set{i % 2}" / f"{job.model}_{i}.mp4"
            rel.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(clip, rel)
            rel.with_suffix(".txt").write_text(f"clip {i} of {job.model}")
    result = prepare_dataset(DatasetRequest(**request, confirm=True), root=None, workers=1)
    written = Path(result.written or "")
    # render points the job at the file prepare_dataset wrote (the reader's file name)
    assert written.name == fmt.index, (job.label, written)
    text = written.read_text()
    records = (
        [json.loads(x) for x in text.splitlines() if x.strip()]
        if written.suffix == ".jsonl"
        else json.loads(text)
    )
    config = work / "data_config.json"
    config.write_text(json.dumps(target.data_config))
    case: dict[str, Any] = {"name": job.label, "data_config": str(config)}
    if job.answer.format_id == "mllm":
        assert job.answer.entry.reader is not None
        case |= {"kind": "mllm", "convert": CONVERT[job.answer.entry.reader.file], "dataset": str(written)}
    else:
        ds = target.data_config["dataset_param"]
        reader = _reader_class(job.answer.entry, ds.get("dataset_type"))
        case |= {"kind": "clips", "reader": reader, "task": "i2v" if "i2v" in job.task else "t2v"}
        case["global_batch_size"] = (target.limits.global_batch_size if target.limits else None) or 1
    seen[key] = Prepared(job, case, records, dataset, frames, list(result.warnings))
    return seen[key]


def _reader_class(entry: ReaderEntry, dataset_type: Any) -> str:
    """The class the job's script builds: get_wan_feature.py's own, or build_mm_dataset's for the dataset_type."""
    assert entry.reader is not None
    name = entry.reader.symbol.split(".")[0]
    if name == "WanTextVideoDataset":
        return name
    return {"t2v": "T2VDataset", "i2v": "I2VDataset"}[str(dataset_type)]


def run_child(upstream: Path, version: str, cases: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """`upstream_readers.py` on one MindSpeed-MM tree; its result (raises when it did not run)."""
    mm = upstream / "MindSpeed-MM" / f"v{version}"
    mindspeed = upstream / "MindSpeed" / f"{version}_core_r0.12.1"
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "mm": str(mm),
        "mindspeed": str(mindspeed),
        "megatron": str(upstream / "Megatron-LM" / "core_v0.12.1"),
        "out": str(out / "result.json"),
        "cases": cases,
    }
    (out / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(HERE / "upstream_readers.py"), str(out / "spec.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not (out / "result.json").is_file():
        raise RuntimeError(
            f"upstream_readers.py wrote no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def judge(prepared: Prepared, read: dict[str, Any]) -> tuple[bool, str]:
    """Whether the reader kept every written record, and item 0 is the first record as written."""
    if "error" in read:
        return False, read["error"].strip().splitlines()[-1]
    records, job = prepared.records, prepared.job
    fmt = job.answer.format
    assert (fmt is not None and fmt.path_key is not None) or job.answer.format_id == "mllm"
    if job.answer.format_id == "mllm":
        rows = read["rows"]
        problems = [
            f"record {i}: {row}"
            for i, row in enumerate(rows)
            if not row["prompt"]
            or not row["response"]
            or not all(Path(p).is_file() for p in row["media"])
            or len(row["media"]) != len(records[i].get("images") or records[i].get("videos") or [])
        ]
        if len(rows) != len(records) or problems:
            return False, f"{len(rows)} of {len(records)} records converted; {problems[:1]}"
        return True, f"{len(rows)}/{len(records)} records read"
    assert fmt is not None
    first = records[0]
    path = str(prepared.root / first[fmt.path_key or "path"])
    caption = first[fmt.caption_key or "cap"]
    item = read["item"]
    wanted = {"len": len(records), "file": path, "frames": prepared.frames}
    got = {"len": read["len"], "file": item["file"], "frames": item["frames"]}
    if fmt.storage_mode == "standard":
        samples = [(s.get("file"), s.get("captions")) for s in read["samples"]]
        written = [(r["file"], r["captions"]) for r in records]
    else:
        samples = [(s.get("path"), s.get("cap")) for s in read["samples"]]
        written = [(str(prepared.root / r["path"]), r["cap"]) for r in records]
    if item["text"] is not None:  # Wan's reader returns the caption it took
        wanted["text"], got["text"] = [caption], item["text"]
    if got != wanted or samples != written:
        return False, f"read {got}, wrote {wanted}" + (
            "" if samples == written else f"; samples {samples[:2]}"
        )
    return True, f"{len(records)}/{len(records)} records read"


@lru_cache(maxsize=4)
def outcomes(upstream: Path) -> dict[tuple[str, str, str, str], tuple[bool | None, str]]:
    """(model, task, backend, version) -> (read?, what happened) for every registered job at VERSIONS."""
    found: dict[tuple[str, str, str, str], tuple[bool | None, str]] = {}
    with tempfile.TemporaryDirectory(prefix="mm-readers-") as tmp:
        base = Path(tmp)
        for version in VERSIONS:
            if not (upstream / "MindSpeed-MM" / f"v{version}").is_dir():
                continue
            seen: dict[str, Prepared] = {}
            todo: list[tuple[Job, Prepared]] = []
            for job in jobs(version):
                key = (job.model, job.task, job.backend, version)
                if job.answer.format is None:
                    assert job.answer.entry.unsupported is not None
                    found[key] = (None, f"unsupported: {job.answer.entry.unsupported.reason}")
                    continue
                try:
                    todo.append((job, _prepare(job, base / job.label, base / "clips", seen)))
                except (MMAgentError, AssertionError) as exc:
                    found[key] = (False, f"not prepared: {exc}")
            cases = list({id(p): p.case for _, p in todo}.values())
            result = run_child(upstream, version, cases, base / f"child-{version}")
            for job, prepared in todo:
                ok, text = judge(prepared, result["cases"][prepared.case["name"]])
                found[(job.model, job.task, job.backend, version)] = (ok, text)
    return found


def rows(upstream: Path) -> dict[tuple[str, str], Cell]:
    """The report column "dataset read by its reader": one cell per (model, version) over the model's jobs."""
    per_model: dict[tuple[str, str], list[tuple[str, bool | None, str]]] = {}
    for (model, task, backend, version), (ok, text) in sorted(outcomes(upstream).items()):
        per_model.setdefault((model, version), []).append((f"{task}/{backend}", ok, text))
    cells = {}
    for key, results in per_model.items():
        read = [r for r in results if r[1] is True]
        failed = [r for r in results if r[1] is False]
        marked = [r for r in results if r[1] is None]
        parts = [f"{len(read)}/{len(read) + len(failed)} jobs read"] if read or failed else []
        parts += [f"{job}: {text}" for job, _, text in failed[:2]]
        if marked:
            reason = marked[0][2].removeprefix("unsupported: ")
            parts.append(f"{len(marked)} unsupported ({marked[0][0]}: {reason})")
        ok = False if failed else True if read else None
        cells[key] = Cell(ok, "; ".join(parts))
    return cells


# ---- record keys of readers that do not run here, read from their code ---------------------------------------
def _symbol(tree: ast.Module, symbol: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in symbol.split("."):
        found = None
        for child in ast.walk(node) if node is not None else ():
            if (
                isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and child.name == part
            ):
                found = child
                break
        node = found
    return node


def _constants(tree: ast.Module) -> dict[str, str]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def reader_keys(mm: Path, file: str, symbol: str) -> set[str] | None:
    """String keys `symbol` (a class, Class.method or function of `file`) reads from a record: subscripts,
    `.get`/`.pop` and `in` tests, with names resolved through the module's and data_utils/constants.py's string
    constants; None when the file or the symbol is not in the tree."""
    path = mm / file
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = _symbol(tree, symbol)
    if node is None:
        return None
    names = _constants(tree)
    constants = mm / "mindspeed_mm" / "data" / "data_utils" / "constants.py"
    if constants.is_file():
        names = _constants(ast.parse(constants.read_text(encoding="utf-8"))) | names

    def value(expr: ast.AST) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        return names.get(expr.id) if isinstance(expr, ast.Name) else None

    keys: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Subscript):
            keys.add(value(child.slice) or "")
        elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.args:
            if child.func.attr in ("get", "pop"):
                keys.add(value(child.args[0]) or "")
        elif isinstance(child, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in child.ops):
            keys.add(value(child.left) or "")
        elif isinstance(child, ast.List | ast.Tuple):  # redirect_keys = ["video", "src_video", ...]
            keys.update(v for e in child.elts if (v := value(e)))
    keys.discard("")
    return keys

"""`prepare_dataset`: a folder of clips or images (or an index file) -> a checked MindSpeed-MM dataset index.

The items are found in a stable order (`scan.walk`, or the user's index), probed in a bounded process pool
(`probe.probe_file`: decord, PyAV, Pillow live only there) a few files per task with a bounded number of
tasks in flight, and consumed in order: checked against the job's limits (`limits.plan_clip`, the same
decisions MindSpeed-MM's video processor makes), deduplicated by content hash, and streamed into the index's
temporary file. Probes are cached per file (`cache.ProbeCache`), so a re-run decodes only what changed.
Nothing is fatal but an empty result: every rejected item has a reason and a fix. Dry run by default; with
`confirm` the index (MindSpeed-MM's raw `data.json`, its `data.txt`, or the MLLM JSON) and a PNG summary are
written atomically (`write.AtomicFile`), never over a file mm-agent did not write.
"""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
import os
import re
import shlex
import statistics
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import IO, Any

from mm_agent import cancel
from mm_agent.dataset.cache import ProbeCache
from mm_agent.dataset.index_files import IndexRow
from mm_agent.dataset.limits import (
    ClipLimits,
    ClipPlan,
    Refusal,
    extraction_split,
    feature_name,
    name_collision,
    plan_clip,
    small_groups,
)
from mm_agent.dataset.probe import probe_batch
from mm_agent.dataset.scan import Item, locate, media_kind, walk
from mm_agent.dataset.schema import DatasetRequest, DatasetResult, DatasetStats, Distribution, Rejected
from mm_agent.dataset.target import Target, resolve_target
from mm_agent.dataset.write import AtomicFile, check_writable, write_bytes
from mm_agent.errors import MMAgentError
from mm_agent.names import is_utf8, rename_fix, shown
from mm_agent.paths import confine, resolve

Progress = Callable[[int, int, str], None]
BATCH = 8  # files per pool task: small clips probe in milliseconds, so round trips would dominate
_WORDS = re.compile(r"[A-Za-z0-9_']+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

FIXES = {
    "no_caption": "write the caption into a .txt file of the same name beside it (clip.mp4 -> clip.txt)",
    "caption_not_utf8": "re-save the caption file as UTF-8",
    "caption_too_long": "shorten the caption file to a sentence or a paragraph",
    "caption_unreadable": "make the caption file readable by this user",
    "outside_roots": "move the file inside the workspace, or start the server with --allow-path for its folder",
    "unreadable": "re-encode or re-export the file (ffmpeg -i in.mp4 -c:v libx264 out.mp4), or remove it",
    "empty": "the file is empty: re-copy it from its source, or remove it",
    "zero_frames": "the file holds no video frames: re-encode it, or remove it",
    "mislabelled": "rename the file to its real type's extension, or convert it",
    "duplicate": "nothing to do: the first copy is kept (remove the duplicate to silence this)",
    "missing": "check the path in the index (relative paths start at the dataset folder)",
    "record": "fix the index record as the reason says",
}


def _tokens(text: str) -> int:
    """A caption's length in text-encoder tokens, estimated (no tokenizer is loaded here): ~1.3 tokens per
    word of Latin script (T5/UMT5 SentencePiece), one per CJK character."""
    return math.ceil(len(_WORDS.findall(text)) * 1.3) + len(_CJK.findall(text))


def _dist(values: list[float]) -> Distribution | None:
    if not values:
        return None
    return Distribution(
        count=len(values),
        min=round(min(values), 3),
        p50=round(statistics.median(values), 3),
        max=round(max(values), 3),
        mean=round(statistics.fmean(values), 3),
    )


def _quiet() -> None:
    """Pool worker start: decoders write their complaints to stderr (the MCP server's log); the verdict is
    in the result."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _require(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MMAgentError(
            f"{module} is not installed: it is needed to read {what}",
            field="dir",
            fix="pip install 'mm-agent[runtime]' (decord, PyAV, Pillow, matplotlib) in this environment",
        )


class _Pool:
    """Probe results in submission order, with at most `window` batches in flight (memory stays flat).

    Made inside a server call, the pool ends itself when the call is cancelled (`cancel.on_cancel`):
    pending batches are dropped and the workers killed mid-probe, and the waiting scan raises `Cancelled`."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.executor: ProcessPoolExecutor | None = None
        self.window = workers * 4
        self._lock = threading.Lock()
        self._killed = False
        self._unhook = cancel.on_cancel(self.kill)

    def _exec(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._killed:
                cancel.check()  # (killed only by a cancellation)
            if self.executor is None:
                ctx = multiprocessing.get_context("spawn")  # never fork the (threaded) server
                self.executor = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_quiet)
            return self.executor

    def kill(self) -> None:
        """End the pool now (the call was cancelled): pending batches dropped, workers killed and reaped."""
        with self._lock:
            self._killed = True
            executor = self.executor
        if executor is None:
            return
        workers = list((executor._processes or {}).values())  # (no public way to end busy workers)
        executor.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.join(5)

    def map(self, batches: Iterator[list[Item]]) -> Iterator[tuple[Item, dict[str, Any] | None]]:
        """(item, fresh probe) per item, in order; the probe is None for items with a problem or a cache hit."""
        pending: deque[tuple[list[Item], Future[list[dict[str, Any]]] | None]] = deque()
        for batch in batches:
            todo = [it.path for it in batch if _needs(it)]
            pending.append((batch, self._exec().submit(probe_batch, todo) if todo else None))
            while len(pending) > self.window:
                yield from self._drain(pending.popleft())
        while pending:
            yield from self._drain(pending.popleft())

    @staticmethod
    def _drain(
        entry: tuple[list[Item], Future[list[dict[str, Any]]] | None],
    ) -> Iterator[tuple[Item, dict[str, Any] | None]]:
        batch, fut = entry
        try:
            results = iter(fut.result() if fut is not None else [])
        except (BrokenProcessPool, CancelledError):
            cancel.check()  # the pool was killed because the call was cancelled: say so
            raise
        for item in batch:
            yield item, next(results) if _needs(item) else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._exec().submit(fn, *args).result()
        except (BrokenProcessPool, CancelledError):
            cancel.check()
            raise

    def close(self) -> None:
        self._unhook()
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


def _needs(item: Item) -> bool:
    return item.problem is None and item.probe is None


class _Run:
    def __init__(
        self,
        req: DatasetRequest,
        root: Path | None,
        progress: Progress | None,
    ) -> None:
        self.req, self.root, self.progress = req, root, progress
        self.base = (root or Path.cwd()).resolve()
        self.dir = confine(req.dir, root, "dir") if root else resolve(self.base / req.dir, "dir")
        if not self.dir.is_dir():
            raise MMAgentError(
                f"{self.dir} is not a folder", field="dir", fix="pass the folder that holds the videos/images"
            )
        if not is_utf8(str(self.dir)):  # (its real path: a UTF-8 symlink may lead there)
            raise MMAgentError(
                f"the folder {shown(str(self.dir))} has a name that is not UTF-8 (bytes shown as \\xNN): "
                "decord (MindSpeed-MM's video reader) cannot open its clips and data.txt cannot name it",
                field="dir",
                fix=rename_fix(self.dir.parent),
            )
        self.target: Target = resolve_target(req, self.base, root)
        fmt = self.target.reader.format if self.target.reader is not None else None
        # the file the model's reader reads: data.json (+ data.txt) in combine mode, data.jsonl in standard mode
        out = req.out or str(self.dir / (fmt.index if fmt is not None else "data.json"))
        self.out = confine(out, root, "out") if root else resolve(self.base / out, "out")
        listed = fmt.list_file if fmt is not None else "data.txt"
        self.data_txt = self.out.with_name(listed) if self.target.kind != "mllm" and listed else None
        keys = (fmt.path_key, fmt.caption_key) if fmt is not None and fmt.path_key else ("path", "cap")
        self.path_key, self.caption_key = keys[0] or "path", keys[1] or "cap"
        self.plot = self.out.with_name(f"{self.out.stem}.stats.png")
        self.rejected: list[Rejected] = []
        self.reasons: Counter[str] = Counter()
        self.values: dict[str, list[float]] = {
            "duration (s)": [],
            "frames": [],
            "fps": [],
            "caption words": [],
        }
        self.resolutions: Counter[str] = Counter()
        self.sizes: Counter[str] = Counter()
        self.hashes: dict[str, str] = {}
        self.long_captions = 0
        self.short: Counter[int] = Counter()  # accepted clips trained at fewer frames than num_frames
        # MindSpeed-MM's extraction names features by file name alone: accepted clips whose names clash
        self.feature_names: dict[str, str] = {}
        self.clashes: list[tuple[str, str]] = []
        self.probed = self.cached = self.found = self.accepted = 0
        self.warnings: list[str] = []
        self._kinds: set[str] | None = None

    # -- per item ------------------------------------------------------------------------------------
    def reject(self, rel: str, code: str, reason: str, fix: str | None = None) -> None:
        self.reasons[code] += 1
        default = rename_fix(self.dir) if code == "name_not_utf8" else FIXES.get(code, FIXES["record"])
        # a name that is not UTF-8 is shown escaped (\xff), never carried as text that cannot be written
        self.rejected.append(Rejected(path=shown(rel), reason=shown(reason), fix=shown(fix or default)))

    def check_probe(self, item: Item, probe: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
        """The index record of a probed item and the sample size MindSpeed-MM trains it at ('' for an
        image), or None (rejected)."""
        error = probe.get("error")
        if error:
            detail = probe.get("detail", "")
            reason = {
                "empty": "empty file (0 bytes)",
                "zero_frames": "no video frames",
                "mislabelled": f"not a {Path(item.rel).suffix} file ({detail})",
            }.get(error, f"cannot be decoded: {detail}" if detail else "cannot be decoded")
            self.reject(item.rel, error, reason)
            return None
        size = ""
        digest = probe.get("sha256", "")
        first = self.hashes.setdefault(digest, item.rel)
        if first != item.rel:
            self.reject(item.rel, "duplicate", f"same bytes as {first}")
            return None
        lim = self.target.limits or ClipLimits()
        frames, fps = int(probe.get("frames") or 0), float(probe.get("fps") or 0)
        height, width = int(probe.get("height") or 0), int(probe.get("width") or 0)
        record: dict[str, Any] = {self.path_key: item.rel, self.caption_key: item.caption}
        if probe["kind"] == "video":
            plan = plan_clip(frames, fps, height, width, lim)
            if isinstance(plan, Refusal):
                self.reject(item.rel, plan.code, plan.reason, plan.fix)
                return None
            self.note(plan, frames, fps)
            size = plan.sample_size
            if (
                self.path_key == "path"
            ):  # (standard mode's records are {file, captions}, as upstream's README)
                record |= {"num_frames": frames, "fps": round(fps, 6)}
        if self.path_key == "path":
            record["resolution"] = {"height": height, "width": width}
        self.resolutions[f"{width}x{height}"] += 1
        return record, size

    def note(self, plan: ClipPlan, frames: int, fps: float) -> None:
        lim = self.target.limits
        if lim is not None and plan.sample_num_frames < lim.num_frames:
            self.short[plan.sample_num_frames] += 1
        self.values["frames"].append(frames)
        self.values["fps"].append(fps)
        self.values["duration (s)"].append(frames / fps if fps else 0.0)

    def caption_ok(self, item: Item) -> bool:
        if item.caption is None:
            return True
        words = len(item.caption.split())
        self.values["caption words"].append(words)
        lim = self.target.limits
        if lim is not None and _tokens(item.caption) > lim.text_len:
            self.long_captions += 1
        return True

    # -- sources -------------------------------------------------------------------------------------
    def kinds(self) -> set[str]:
        """Images for an image task; videos for a video task, or its images when the folder holds no video."""
        if self.target.kind == "image-text":
            return {"image"}
        assert self._kinds is not None, "set by _count, the scan's one counting walk"
        return self._kinds

    def items(self) -> Iterator[Item]:
        if self.req.index:
            yield from self._index_items()
        else:
            ours = {p for p in (self.out, self.data_txt, self.plot) if p is not None}
            yield from (it for it in walk(self.dir, self.root, self.kinds()) if Path(it.path) not in ours)

    def index_rows(self) -> tuple[Path, Iterator[IndexRow]]:
        """The user's index (relative to the workspace, or the working directory like `out`) and its rows."""
        from mm_agent.dataset.index_files import read_index

        given = self.req.index or ""
        index = confine(given, self.root, "index") if self.root else resolve(self.base / given, "index")
        return index, read_index(
            index, path_column=self.req.path_column, caption_column=self.req.caption_column
        )

    def _index_items(self) -> Iterator[Item]:
        index, rows = self.index_rows()
        for row in rows:
            label = f"{index.name}:{row.line}"
            if row.error or not row.media:
                item = Item(rel=label, path="", problem="record", detail=row.error or "no media path")
                yield item
                continue
            yield self._media_item(row.media[0], row.caption, label)

    def _media_item(self, written: str, caption: str | None, label: str) -> Item:
        path = Path(written)
        full = path if path.is_absolute() else self.dir / path
        rel = written if not path.is_absolute() else str(path)
        item = Item(rel=rel, path=str(full), caption=caption)
        real = locate(item, self.root, f"{label}: {written} does not exist")
        if real is None:
            return item
        if path.is_absolute():
            try:
                item.rel = str(real.relative_to(self.dir))
            except ValueError:
                item.problem, item.detail = "missing", f"{label}: {written} is not under {self.dir}"
        if item.problem is None and caption is None:
            item.problem = "no_caption"
        return item


def _batches(items: Iterator[Item], cache: ProbeCache, run: _Run) -> Iterator[list[Item]]:
    batch: list[Item] = []
    for item in items:
        cancel.check()  # an abandoned call stops scanning here
        run.found += 1
        if item.problem is None:
            item.probe = cache.get(item.rel, item.size, item.mtime_ns)
        batch.append(item)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _count(run: _Run) -> int:
    """Media files in the folder (the progress total), by one walk that also settles which kind a video task
    reads: its videos, or its images when it holds none."""
    if run.req.index:
        return 0  # an index is read once, streaming; progress has no total then
    found: Counter[str | None] = Counter()
    for _, _, names in os.walk(run.dir):
        cancel.check()  # an abandoned call stops counting here
        found.update(media_kind(n) for n in names)
    if run.target.kind != "image-text":
        run._kinds = {"video"} if found["video"] else {"image"}
    return sum(found[kind] for kind in run.kinds())


def _rerun_argv(run: _Run) -> list[str]:
    """`mm-agent dataset` with this dry run's request and `--yes`: every path absolute (the command is run
    from anywhere) and each one argument (shlex.join quotes it)."""
    req = run.req
    argv = ["mm-agent", "dataset", str(run.dir), "--model", run.target.model, "--task", run.target.task]
    if run.target.job_dir is not None:
        argv += ["--job", run.target.job_dir]
    if req.index:
        index = confine(req.index, run.root, "index") if run.root else resolve(run.base / req.index, "index")
        argv += ["--index", str(index)]
    if req.out:
        argv += ["--out", str(run.out)]
    flags: dict[str, str | int | None] = {"size": req.size, "mm_version": req.mm_version}
    flags |= {"runtime": req.runtime}
    flags |= {"path_column": req.path_column, "caption_column": req.caption_column}
    flags |= {"num_frames": req.num_frames, "frame_interval": req.frame_interval, "text_len": req.text_len}
    flags |= {"max_height": req.max_height, "max_width": req.max_width}
    for name, value in flags.items():
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return [*argv, "--yes"]


def prepare_dataset(
    req: DatasetRequest,
    *,
    root: Path | None = None,
    on_progress: Progress | None = None,
    workers: int | None = None,
) -> DatasetResult:
    """Scan, probe and check a dataset; write its index when `req.confirm`. `root` confines every path (MCP)."""
    t0 = time.monotonic()
    pool = _Pool(workers or max(1, min(os.cpu_count() or 1, 8)))  # (how it runs, not what it checks)
    try:
        run = _Run(req, root, on_progress)
        if run.target.kind == "mllm":
            from mm_agent.dataset.mllm import prepare_mllm

            return prepare_mllm(run, t0, pool)
        return _prepare_clips(run, pool, t0)
    finally:
        pool.close()


def _prepare_clips(run: _Run, pool: _Pool, t0: float) -> DatasetResult:
    req, root, on_progress = run.req, run.root, run.progress
    if req.confirm:
        for path in (run.out, run.data_txt, run.plot):
            if path is not None:
                check_writable(path, root)  # refuse the user's own file before any work
    _require("decord", "videos")
    _require("PIL", "images")
    total = _count(run)
    cache = ProbeCache(run.dir)
    with tempfile.TemporaryFile() as spool:  # accepted records until the group filter has seen every clip
        groups = _Groups(run.target.limits)
        live: set[str] = set()
        done = 0
        try:
            for item, probe in pool.map(_batches(run.items(), cache, run)):
                done += 1
                if on_progress is not None and (done % 16 == 0 or done == total):
                    on_progress(done, total, shown(item.rel))
                if item.problem is not None:
                    run.reject(item.rel, item.problem, item.detail or _problem_text(item.problem), None)
                    continue
                live.add(item.rel)
                if probe is None:
                    probe = item.probe or {}
                    run.cached += 1
                else:
                    run.probed += 1
                    cache.put(item.rel, probe)
                checked = run.check_probe(item, probe)
                if checked is None:
                    continue
                record, size = checked
                run.caption_ok(item)
                groups.add(size, item.rel)
                if run.target.extraction is not None:
                    first = run.feature_names.setdefault(feature_name(item.rel), item.rel)
                    if first != item.rel:
                        run.clashes.append((first, item.rel))
                spool.write(f"{size}\t".encode() + json.dumps(record, ensure_ascii=False).encode() + b"\n")
                if done % (BATCH * 8) == 0:
                    cache.flush()
            dropped = groups.dropped()
            for size, rels in dropped.items():
                for rel in rels:
                    run.reject(rel, "small_group", *groups.why(size))
            run.sizes = groups.sizes
            run.accepted = sum(n for size, n in groups.sizes.items() if size not in dropped)
            written: str | None = None
            plot: str | None = None
            state = "dry_run"
            run.warnings += _warnings(run, dropped)
            if req.confirm and run.accepted:
                state = _write_index(run, spool, set(dropped))
                written = str(run.out)
                if run.data_txt is not None:
                    _data_txt(run)
                if state != "unchanged" or not run.plot.exists():  # the same index: the same summary
                    png = pool.submit(
                        _plot,
                        run.values,
                        dict(run.resolutions.most_common(12)),
                        f"{run.dir.name}: {run.accepted} items",
                    )
                    write_bytes(run.plot, png, root)
                plot = str(run.plot)
        finally:
            cache.close(live if not req.index else None)
    return _result(run, written, plot, time.monotonic() - t0, state)


class _Groups:
    """MindSpeed-MM's final filter (`small_groups`): clips counted per sample size; the paths of a size are
    kept only while it is still under the floor, so memory stays bounded by floor x sizes."""

    def __init__(self, lim: ClipLimits | None) -> None:
        self.lim = lim
        self.floor = 4 * lim.global_batch_size if lim is not None and lim.global_batch_size else 0
        self.sizes: Counter[str] = Counter()
        self.rels: dict[str, list[str]] = {}

    def add(self, size: str, rel: str) -> None:
        if not size:
            return
        self.sizes[size] += 1
        if self.sizes[size] < self.floor:
            self.rels.setdefault(size, []).append(rel)
        else:
            self.rels.pop(size, None)

    def dropped(self) -> dict[str, list[str]]:
        if self.lim is None:
            return {}
        return {size: self.rels.get(size, []) for size in small_groups(self.sizes, self.lim)}

    def why(self, size: str) -> tuple[str, str]:
        lim = self.lim
        gbs = lim.global_batch_size if lim is not None else None
        return (
            f"only {self.sizes[size]} clip(s) train at {size} (frames x height x width); MindSpeed-MM's final "
            f"filter drops sample sizes with fewer than {self.floor} clips (4 x global batch size {gbs})",
            "add clips that train at this size, cut clips to the sizes most clips share, or extract on fewer "
            "NPUs (render the job with a smaller npus_per_node and pass job_dir)",
        )


def _write_index(run: _Run, spool: IO[bytes], dropped: set[str]) -> str:
    """The spooled records but those of dropped sizes, atomically: a JSON list, or JSON Lines for a `.jsonl`
    index (MindSpeed-MM's `orjson_load` reads a file by its extension); 'written'/'unchanged'."""
    out = AtomicFile(run.out, run.root)
    lines = run.out.suffix == ".jsonl"
    try:
        out.write(b"" if lines else b"[")
        spool.seek(0)
        first = True
        for line in spool:
            size, _, record = line.partition(b"\t")
            if size.decode() in dropped:
                continue
            sep = b"" if lines else b"\n" if first else b",\n"
            out.write(sep + record.rstrip(b"\n") + (b"\n" if lines else b""))
            first = False
        out.write(b"" if lines else b"\n]\n")
    except BaseException:
        out.abort()
        raise
    return out.commit()


def _plot(values: dict[str, list[float]], resolutions: dict[str, int], title: str) -> bytes:
    from mm_agent.dataset.plot import plot_png

    return plot_png(values, resolutions, title)


def _problem_text(code: str) -> str:
    return {
        "no_caption": "no caption (no .txt file of the same name, or it is empty)",
        "caption_not_utf8": "the caption file is not UTF-8",
        "name_not_utf8": "its name is not UTF-8 (bytes shown as \\xNN), so data.json cannot name it",
        "caption_too_long": "the caption file is over 64 KiB",
        "caption_unreadable": "the caption file cannot be read",
        "outside_roots": "its real path is outside the allowed roots (a symlink out of the workspace)",
        "unreadable": "cannot be read",
        "missing": "does not exist",
    }.get(code, code)


def _data_txt(run: _Run) -> None:
    """`<dataset root>,<data.json>`: MindSpeed-MM splits the line on commas, so neither may hold one."""
    assert run.data_txt is not None
    for label, path in (("dir", run.dir), ("out", run.out)):
        if not is_utf8(str(path)):
            raise MMAgentError(
                f"{shown(str(path))} holds a name that is not UTF-8, which MindSpeed-MM's data.txt reader "
                "(UTF-8 text) cannot hold",
                field=label,
                fix=rename_fix(path.parent),
            )
        if "," in str(path):
            raise MMAgentError(
                f"{path} holds a comma, which MindSpeed-MM's data.txt reader splits on",
                field=label,
                fix="move or rename the folder (or output file) to a path without commas",
            )
    write_bytes(run.data_txt, f"{run.dir},{run.out}\n".encode(), run.root)


def _warnings(run: _Run, dropped: dict[str, list[str]] | None = None) -> list[str]:
    out: list[str] = []
    lim = run.target.limits
    if run.long_captions and lim is not None:
        out.append(
            f"{run.long_captions} caption(s) are longer than the text encoder's {lim.text_len} tokens (estimated):"
            " the end is cut off at extraction"
        )
    if run.short and lim is not None:
        counts = ", ".join(f"{n} at {f} frames" for f, n in sorted(run.short.items()))
        out.append(
            f"{sum(run.short.values())} clip(s) are shorter than num_frames {lim.num_frames} and train at fewer "
            f"frames ({counts}), as MindSpeed-MM's video processor allows (drop_short_ratio "
            f"{lim.drop_short_ratio:g}); use clips of {lim.num_frames}+ frames, or set num_frames to what they hold"
        )
    if dropped and lim is not None:
        clips = sum(len(v) for v in dropped.values())
        out.append(
            f"{clips} clip(s) rejected as small_group: MindSpeed-MM's final filter keeps a sample size only when "
            f"{4 * (lim.global_batch_size or 1)}+ clips share it (4 x the extraction's global batch size "
            f"{lim.global_batch_size}); with every size under it, its extraction fails"
        )
    extraction = run.target.extraction
    if extraction is not None and run.accepted:
        dp, mbs, loader = extraction
        gone = {rel for rels in (dropped or {}).values() for rel in rels}
        clashing = [p for pair in run.clashes if not set(pair) & gone for p in pair]
        for problem in (extraction_split(run.accepted, dp, mbs, loader), name_collision(clashing)):
            if problem is not None:  # what MindSpeed-MM's multi-rank feature extraction will do with them
                out.append(f"{problem.reason}; {problem.fix}")
    if run.accepted == 0:
        out.append("no item was accepted: nothing to train on (see rejected for each reason and fix)")
    return out


def _result(
    run: _Run, written: str | None, plot: str | None, seconds: float, state: str = "dry_run"
) -> DatasetResult:
    lim = run.target.limits
    limits: dict[str, Any] = {"source": run.target.config_file}
    if lim is not None:
        limits |= lim.model_dump(exclude={"source"})
    stats = DatasetStats(
        found=run.found,
        accepted=run.accepted,
        rejected=len(run.rejected),
        probed=run.probed,
        cached=run.cached,
        duplicates=run.reasons.get("duplicate", 0),
        reasons=dict(run.reasons),
        duration_s=_dist(run.values["duration (s)"]),
        frames=_dist(run.values["frames"]),
        fps=_dist(run.values["fps"]),
        caption_words=_dist(run.values["caption words"]),
        images_per_record=_dist(run.values.get("images per record", [])),
        resolutions=dict(run.resolutions.most_common(12)),
        sample_sizes=dict(run.sizes.most_common(12)),
        seconds=round(seconds, 3),
    )
    steps: list[str] = []
    if run.accepted:
        if not written:
            steps.append(shlex.join(_rerun_argv(run)))
        if run.target.job_dir is None:
            steps.append(
                shlex.join(
                    [
                        *("mm-agent", "render", run.target.model, "--task", run.target.task),
                        *("--dataset-dir", str(run.dir), "--dataset-file", str(run.out)),
                        *("--out", f"jobs/{run.target.model}-{run.target.task}"),
                    ]
                )
            )
    return DatasetResult(
        ok=run.accepted > 0,
        status="unchanged" if state == "unchanged" else "written" if written else "dry_run",
        written=written,
        kind=run.target.kind,
        dir=str(run.dir),
        index=str(run.out),
        reader=run.target.reader.describe() if run.target.reader is not None else None,
        data_txt=str(run.data_txt) if run.data_txt is not None else None,
        plot=plot,
        accepted=run.accepted,
        rejected=run.rejected,
        stats=stats,
        limits=limits,
        warnings=run.warnings,
        next_steps=steps,
    )

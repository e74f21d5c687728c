"""`python -m runtime.extract`: MindSpeed-MM's Wan feature extraction (get_wan_feature.py), run by the bundled runtime.

Reads the same three files (`--mm-data` data.json → data.txt, `--mm-model` model_t2v.json, `--mm-tool`
tools.json) and writes the same `<save_path>/features/*.pt` + `data.jsonl` (each record annotated with the
frame plan MindSpeed-MM's grouped sampler reads: `sample_num_frames`, `sample_size`, ...), with what MindSpeed-MM lacks:
sample i goes to rank i % world (deterministic, so a resume splits the same way), each rank writes its own
files atomically, `--skip-existing` redoes only missing or damaged files (resume after kill -9), a clip that
cannot be decoded or encodes to NaN is listed in `extract_report.json` instead of killing the run, and
rank 0 prints a progress line with rate and ETA.

Batching follows MindSpeed-MM's meaning of the Megatron flags: `--micro-batch-size` clips go through the VAE
together (same-shape neighbours only) and, on an NPU or GPU, `--num-workers` threads decode ahead while the
encoders run (on the CPU decoding stays inline: the encoders use every core).

Exit status: 0 when at least one clip has features (some may have failed: they are listed in the report and
a warning says how many); 2 with `error:`/`fix:` lines when no clip could be extracted, or for bad configs.

Ranks exchange progress and results through small files under `<save_path>/.extract/` rather than
collectives: a rank that finishes early then waits without a collective's timeout, however uneven the clips.
"""

from __future__ import annotations

from runtime.device import guard_torch_npu

guard_torch_npu()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Iterable, Iterator  # noqa: E402
from concurrent.futures import Future, ThreadPoolExecutor  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

import torch  # noqa: E402

from runtime import dist  # noqa: E402
from runtime.atomic import write_text_atomic  # noqa: E402
from runtime.device import pick_device  # noqa: E402
from runtime.dist import log0  # noqa: E402
from runtime.encoders import TextEncoder, VideoEncoder, compute_dtype, dtype_of  # noqa: E402
from runtime.errors import RuntimeFailure, run_main  # noqa: E402
from runtime.features import (  # noqa: E402
    Expected,
    feature_names,
    index_record,
    is_done,
    remove_temp_files,
    write_feature,
)
from runtime.mmconfig import load_json, require  # noqa: E402
from runtime.mmdata import Sample, read_samples, whitespace_clean  # noqa: E402
from runtime.video import (  # noqa: E402
    ClipPlan,
    check_num_frames,
    plan_clip,
    read_clip_planned,
    to_model_input,
)

PARTS_DIR = ".extract"
POLL_S = 0.5
T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    """argparse that raises `RuntimeFailure` (exit 2 with a fix) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise RuntimeFailure(message, fix="see `python -m runtime.extract --help`")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m runtime.extract", description=__doc__.split("\n")[0])
    parser.add_argument("--mm-data", required=True, help="feature_extract/data.json")
    parser.add_argument("--mm-model", required=True, help="feature_extract/model_t2v.json")
    parser.add_argument("--mm-tool", required=True, help="tools.json (sorafeature.save_path)")
    parser.add_argument("--skip-existing", action="store_true", help="keep feature files that load and match")
    parser.add_argument(
        "--device", default=None, help="auto|npu|cuda|cpu (default: MM_AGENT_DEVICE, then detect)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="caption choice and posterior sampling")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    parser.add_argument("--context-parallel-size", type=int, default=1)
    parser.add_argument("--micro-batch-size", type=int, default=1, help="clips per VAE call")
    parser.add_argument("--global-batch-size", type=int, default=None, help="checked: MBS x world")
    parser.add_argument("--num-workers", type=int, default=2, help="decode threads running ahead (NPU/GPU)")
    parser.add_argument("--distributed-backend", default=None, help="ignored: the backend follows the device")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise RuntimeFailure(
            f"unknown argument {unknown[0]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
            field=unknown[0],
            fix="remove it; see `python -m runtime.extract --help` for the accepted flags",
        )
    if args.micro_batch_size < 1 or args.num_workers < 0:
        raise RuntimeFailure(
            "--micro-batch-size must be >= 1 and --num-workers >= 0",
            fix="e.g. --micro-batch-size 1 --num-workers 2",
        )
    return args


@dataclass(frozen=True)
class ExtractConfig:
    """Everything extraction reads from the three MindSpeed-MM config files, checked once up front."""

    samples: list[Sample]
    save_path: Path
    num_frames: int
    max_height: int
    max_width: int
    frame_interval: float
    train_fps: float | None
    min_num_frames: int | None
    drop_short_ratio: float
    norm_mean: float
    norm_std: float
    clean_text: bool
    ae: dict[str, Any]
    text_encoder: dict[str, Any]
    tokenizer: dict[str, Any] | list[Any]
    model_file: str

    @classmethod
    def load(cls, data_file: str, model_file: str, tool_file: str) -> ExtractConfig:
        data = load_json(data_file, "data config (--mm-data)")
        model = load_json(model_file, "model config (--mm-model)")
        tools = load_json(tool_file, "tools config (--mm-tool)")
        basic = require(data, "dataset_param.basic_parameters", data_file)
        pre = require(data, "dataset_param.preprocess_parameters", data_file)
        pipeline = pre.get("train_pipeline") or {}
        # The same checks and messages as MindSpeed-MM's WanTextVideoDataset.
        for key in ("video_only", "video_and_first_frame"):
            if pipeline.get(key) is None:
                raise RuntimeFailure(
                    f'"{key}" key not found in vid_img_process["train_pipeline"]',
                    file=data_file,
                    field=f"dataset_param.preprocess_parameters.train_pipeline.{key}",
                    fix="copy train_pipeline from MindSpeed-MM's examples/wan2.1/feature_extract/data.json",
                )
        mean, std = _norm(pipeline["video_only"], data_file)
        task = model.get("task", "t2v")
        if task != "t2v":
            raise RuntimeFailure(
                f"task {task!r}: the bundled runtime extracts t2v features only (i2v needs CLIP image features)",
                file=model_file,
                field="task",
                fix="use MindSpeed-MM's get_wan_feature.py for i2v, or model_t2v.json here",
            )
        num_frames = int(require(pre, "num_frames", data_file))
        try:
            check_num_frames(num_frames)
        except RuntimeFailure as exc:
            raise RuntimeFailure(exc.message, file=data_file, field=exc.field, fix=exc.fix) from None
        auto = bool(pre.get("auto_interval", True))  # MindSpeed-MM's defaults when a key is absent
        drop_short = float(pre.get("drop_short_ratio", 1.0))
        text_methods = data["dataset_param"].get("text_preprocess_methods")
        clean = (
            bool(data["dataset_param"].get("enable_text_preprocessing", True)) and text_methods is not None
        )
        if clean:
            _check_text_methods(text_methods, data_file)
        storage = basic.get("data_storage_mode", "combine")
        try:
            samples = read_samples(require(basic, "data_path", data_file), storage)
        except RuntimeFailure as exc:
            raise RuntimeFailure(
                exc.message, file=exc.file or data_file, field=exc.field, fix=exc.fix
            ) from None
        return cls(
            samples=samples,
            save_path=Path(require(tools, "sorafeature.save_path", tool_file)),
            num_frames=num_frames,
            max_height=int(require(pre, "max_height", data_file)),
            max_width=int(require(pre, "max_width", data_file)),
            frame_interval=float(pre.get("frame_interval", 1)),
            train_fps=float(pre.get("train_fps", 24)) if auto else None,
            min_num_frames=None if drop_short >= 1.0 else int(pre.get("min_num_frames", 29)),
            drop_short_ratio=drop_short,
            norm_mean=mean,
            norm_std=std,
            clean_text=clean,
            ae=require(model, "ae", model_file),
            text_encoder=require(model, "text_encoder", model_file),
            tokenizer=require(data, "dataset_param.tokenizer_config", data_file),
            model_file=model_file,
        )


def _norm(video_only: Any, data_file: str) -> tuple[float, float]:
    """The video_only pipeline must be [CenterCropResizeVideo, norm_fun] (Wan); returns norm_fun's mean/std."""
    field = "dataset_param.preprocess_parameters.train_pipeline.video_only"
    kinds = (
        [t.get("trans_type") for t in video_only if isinstance(t, dict)]
        if isinstance(video_only, list)
        else []
    )
    if kinds != ["CenterCropResizeVideo", "norm_fun"]:
        raise RuntimeFailure(
            f"video_only pipeline {kinds or video_only!r} is not supported by the bundled runtime",
            file=data_file,
            field=field,
            fix='use [{"trans_type": "CenterCropResizeVideo", ...}, {"trans_type": "norm_fun", ...}] (Wan)',
        )
    param = video_only[1].get("param") or {}
    mean, std = param.get("mean", 0.5), param.get("std", 0.5)
    if not isinstance(mean, (int, float)) or not isinstance(std, (int, float)) or std == 0:
        raise RuntimeFailure(
            f"norm_fun mean/std must be numbers (std non-zero), got {mean!r}/{std!r}",
            file=data_file,
            field=f"{field}[1].param",
            fix='use {"mean": 0.5, "std": 0.5}',
        )
    return float(mean), float(std)


def _check_text_methods(methods: Any, data_file: str) -> None:
    names = [
        m.get("method") for m in (methods if isinstance(methods, list) else [methods]) if isinstance(m, dict)
    ]
    if names != ["whitespace_clean"]:
        raise RuntimeFailure(
            f"text_preprocess_methods {names!r}: only whitespace_clean is supported",
            file=data_file,
            field="dataset_param.text_preprocess_methods",
            fix='use {"method": "whitespace_clean"} or set enable_text_preprocessing false',
        )


@dataclass
class Outcome:
    """One sample's result on its rank: extracted, skipped_existing or failed (with the reason).

    `plan` (extracted and kept samples) is what data.jsonl records about the clip's frames.
    """

    index: int
    status: str
    reason: str | None = None
    plan: ClipPlan | None = None

    def to_json(self) -> list[Any]:
        return [self.index, self.status, self.reason, asdict(self.plan) if self.plan else None]

    @classmethod
    def from_json(cls, row: list[Any]) -> Outcome:
        index, status, reason, plan = row
        if plan is not None:
            plan = ClipPlan(**{**plan, "indices": tuple(plan["indices"])})
        return cls(index, status, reason, plan)


def decode_ahead(
    jobs: Iterable[tuple[Sample, str]], read: Callable[[Sample], T], workers: int, window: int
) -> Iterator[tuple[Sample, str, T | RuntimeFailure]]:
    """Yield (sample, name, what `read` gave or the failure) in order, decoding up to `window` clips ahead."""

    def attempt(sample: Sample) -> T | RuntimeFailure:
        try:
            return read(sample)
        except RuntimeFailure as exc:
            return exc

    if workers == 0:
        for sample, name in jobs:
            yield sample, name, attempt(sample)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode") as pool:
        pending: deque[tuple[Sample, str, Future[T | RuntimeFailure]]] = deque()
        for sample, name in jobs:
            pending.append((sample, name, pool.submit(attempt, sample)))
            if len(pending) > window:
                head = pending.popleft()
                yield head[0], head[1], head[2].result()
        while pending:
            head = pending.popleft()
            yield head[0], head[1], head[2].result()


class Progress:
    """Per-rank counters in files; rank 0 sums them into the C2 progress line whenever the total moves."""

    def __init__(self, parts: Path, rank: int, world: int, total: int) -> None:
        self.parts, self.rank, self.world, self.total = parts, rank, world, total
        self.done = self.work = 0
        self.start = time.monotonic()
        self.shown = -1

    def advance(self, worked: bool) -> None:
        self.done += 1
        self.work += int(worked)
        counts = json.dumps([self.done, self.work])
        write_text_atomic(self.parts / f"progress.rank{self.rank}", counts, durable=False)  # a hint, not data
        self.show()

    def show(self) -> None:
        if self.rank != 0:
            return
        done = work = 0
        for r in range(self.world):
            try:
                d, w = json.loads((self.parts / f"progress.rank{r}").read_text())
            except (OSError, ValueError):
                continue
            done, work = done + d, work + w
        if done == self.shown:
            return
        self.shown = done
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = (work or done) / elapsed  # all skipped so far: the rate of checking files
        eta = (self.total - done) / rate if rate > 0 else 0.0
        print(
            f"feature extraction progress: {done}/{self.total} samples | {rate:.2f} samples/s | ETA {eta:.0f} s",
            flush=True,
        )


class Extractor:
    """One rank's share of the work, then (rank 0) the merge into data.jsonl and extract_report.json."""

    def __init__(
        self, cfg: ExtractConfig, args: argparse.Namespace, device: torch.device, info: dist.DistInfo
    ):
        self.cfg, self.args, self.device, self.info = cfg, args, device, info
        self.features_dir = cfg.save_path / "features"
        self.parts = cfg.save_path / PARTS_DIR
        self.names = feature_names(cfg.samples)
        self.progress = Progress(self.parts, info.rank, info.world_size, len(cfg.samples))

    def prepare(self) -> None:
        """Rank 0 makes the folders and clears what a killed run left; everyone waits so nothing is written yet."""
        if self.info.rank == 0:
            self.features_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.parts, ignore_errors=True)
            self.parts.mkdir(parents=True)
            removed = remove_temp_files(self.features_dir)
            print(f"Created features directory at: {self.features_dir}", flush=True)
            if removed:
                print(f"removed {removed} temp file(s) left by an interrupted run", flush=True)
        dist.barrier()

    def load_models(self) -> tuple[VideoEncoder, TextEncoder, Expected]:
        cfg = self.cfg
        video_dtype = dtype_of(cfg.ae.get("dtype"), field="ae.dtype", source=cfg.model_file)
        text_dtype = dtype_of(
            cfg.text_encoder.get("dtype"), field="text_encoder.dtype", source=cfg.model_file
        )
        vae = VideoEncoder.from_config(
            cfg.ae, self.device, compute_dtype(video_dtype, self.device), source=cfg.model_file
        )
        text = TextEncoder.from_config(
            cfg.text_encoder,
            cfg.tokenizer,
            self.device,
            compute_dtype(text_dtype, self.device),
            source=cfg.model_file,
        )
        c, t, h, w = vae.latent_shape(cfg.num_frames, cfg.max_height, cfg.max_width)
        return vae, text, Expected(c, t, h, w, text.max_length, text.width, video_dtype, text_dtype)

    def read(self, sample: Sample) -> tuple[torch.Tensor, ClipPlan]:
        cfg = self.cfg
        return read_clip_planned(
            sample.path,
            cfg.num_frames,
            cfg.max_height,
            cfg.max_width,
            frame_interval=cfg.frame_interval,
            min_num_frames=self._min_frames(sample),
            train_fps=cfg.train_fps,
        )

    def plan(self, sample: Sample) -> ClipPlan:
        """The frames `read` would take, without decoding them (--skip-existing still indexes kept clips)."""
        cfg = self.cfg
        return plan_clip(
            sample.path,
            cfg.num_frames,
            frame_interval=cfg.frame_interval,
            min_num_frames=self._min_frames(sample),
            train_fps=cfg.train_fps,
        )

    def _min_frames(self, sample: Sample) -> int | None:
        """MindSpeed-MM keeps a short clip unless a draw under drop_short_ratio drops it; here the draw is seeded."""
        cfg = self.cfg
        if cfg.min_num_frames is None or cfg.drop_short_ratio <= 0:
            return cfg.min_num_frames
        draw = torch.rand(
            1, generator=torch.Generator().manual_seed(self.args.seed * 1_000_003 + sample.index)
        )
        return None if float(draw) < cfg.drop_short_ratio else cfg.min_num_frames

    def run(self) -> None:
        """Extract this rank's samples; their outcomes go to the rank's part file for rank 0 to merge."""
        vae, text, expected = self.load_models()
        self.progress.start = time.monotonic()  # the rate counts extraction, not model loading
        rank, world = self.info.rank, self.info.world_size
        mine = [(s, self.names[s.index]) for s in self.cfg.samples if s.index % world == rank]
        outcomes: list[Outcome] = []
        todo: list[tuple[Sample, str]] = []
        for sample, name in mine:
            path = self.features_dir / f"{name}.pt"
            if self.args.skip_existing and path.is_file():
                try:
                    plan = self.plan(sample)
                except RuntimeFailure as exc:
                    outcomes.append(Outcome(sample.index, "failed", exc.message))
                    print(f"warning: skipped {sample.path}: {exc.message}", file=sys.stderr, flush=True)
                    self.progress.advance(worked=False)
                    continue
                if is_done(path, expected, len(plan.indices)):
                    outcomes.append(Outcome(sample.index, "skipped_existing", plan=plan))
                    self.progress.advance(worked=False)
                    continue
            todo.append((sample, name))
        batch: list[tuple[Sample, str, torch.Tensor, ClipPlan]] = []
        # Decode ahead while an accelerator encodes. On the CPU the encoders already use every core, and
        # decode threads (whose torch resizes start OpenMP teams of their own) only contend with them.
        on_cpu = self.device.type == "cpu"
        workers = 0 if on_cpu else min(self.args.num_workers, os.cpu_count() or 1)
        window = max(2 * workers, self.args.micro_batch_size)
        for sample, name, got in decode_ahead(todo, self.read, workers, window):
            if isinstance(got, RuntimeFailure):
                outcomes.append(Outcome(sample.index, "failed", got.message))
                print(f"warning: skipped {sample.path}: {got.message}", file=sys.stderr, flush=True)
                self.progress.advance(worked=True)
                continue
            frames, plan = got
            if batch and (batch[0][2].shape != frames.shape or len(batch) == self.args.micro_batch_size):
                outcomes += self.encode(batch, vae, text, expected)
                batch = []
            batch.append((sample, name, frames, plan))
        if batch:
            outcomes += self.encode(batch, vae, text, expected)
        write_text_atomic(self.parts / f"rank{rank}.json", json.dumps([o.to_json() for o in outcomes]))

    def encode(
        self,
        batch: list[tuple[Sample, str, torch.Tensor, ClipPlan]],
        vae: VideoEncoder,
        text: TextEncoder,
        expected: Expected,
    ) -> list[Outcome]:
        """Encode same-shape clips and their captions together; check and write each sample on its own.

        Text features keep MindSpeed-MM's per-sample caption axis: hidden [1, L, D] and mask [1, L].
        """
        cfg = self.cfg
        clips = torch.stack([frames for _, _, frames, _ in batch])
        video = to_model_input(clips, cfg.norm_mean, cfg.norm_std)
        generator = torch.Generator(self.device).manual_seed(self.args.seed + batch[0][0].index)
        latents = vae.encode(video, generator=generator).cpu()
        captions = [sample.caption(self.args.seed) for sample, _, _, _ in batch]
        hidden, mask = text.encode([whitespace_clean(c) for c in captions] if cfg.clean_text else captions)
        hidden, mask = hidden.cpu(), mask.cpu()
        outcomes = []
        for i, (sample, name, _, plan) in enumerate(batch):
            feature = {
                "video": latents[i].to(expected.video_dtype, copy=True),
                "prompt_ids": hidden[i : i + 1].to(expected.text_dtype, copy=True),
                "prompt_mask": mask[i : i + 1].clone(),
            }
            problem = expected.problem(feature, check_values=True, frames=len(plan.indices))
            if problem is None:
                write_feature(self.features_dir / f"{name}.pt", feature)
                outcomes.append(Outcome(sample.index, "extracted", plan=plan))
            else:
                outcomes.append(Outcome(sample.index, "failed", problem))
                print(f"warning: skipped {sample.path}: {problem}", file=sys.stderr, flush=True)
            self.progress.advance(worked=True)
        return outcomes

    def wait_for_ranks(self) -> None:
        """Poll until every rank's part file exists (rank 0 keeps printing progress), then barrier."""
        while not all((self.parts / f"rank{r}.json").is_file() for r in range(self.info.world_size)):
            self.progress.show()
            time.sleep(POLL_S)
        self.progress.show()
        dist.barrier()

    def merge(self, seconds: float, extracting: float) -> dict[str, Any]:
        """Rank 0: data.jsonl (extracted + kept samples, dataset order) and extract_report.json, both atomic."""
        outcomes: dict[int, Outcome] = {}
        per_rank: list[int] = []  # samples each rank handled: sample i is rank i % world's alone, none twice
        for r in range(self.info.world_size):
            rows = json.loads((self.parts / f"rank{r}.json").read_text())
            per_rank.append(len(rows))
            for row in rows:
                outcome = Outcome.from_json(row)
                outcomes[outcome.index] = outcome
        lines, failed = [], []
        counts = {"extracted": 0, "skipped_existing": 0, "failed": 0}
        cfg = self.cfg
        for sample in cfg.samples:
            outcome = outcomes[sample.index]
            counts[outcome.status] += 1
            if outcome.status == "failed" or outcome.plan is None:
                failed.append({"path": sample.path, "reason": outcome.reason})
            else:
                file = f"features/{self.names[sample.index]}.pt"
                record = index_record(sample.record, outcome.plan, file, cfg.max_height, cfg.max_width)
                lines.append(json.dumps(record))
        print("Writing dataset metadata information...", flush=True)
        data_jsonl = self.cfg.save_path / "data.jsonl"
        if lines:
            write_text_atomic(data_jsonl, "\n".join(lines) + "\n")
            print(f"Dataset metadata written to: {data_jsonl}", flush=True)
        report = {
            "total": len(self.cfg.samples),
            "extracted": counts["extracted"],
            "skipped_existing": counts["skipped_existing"],
            "failed": failed,
            "seconds": round(seconds, 3),
            "clips_per_second": round((counts["extracted"] + counts["failed"]) / max(extracting, 1e-9), 3),
            "world_size": self.info.world_size,
            "per_rank": per_rank,
            "data_jsonl": str(data_jsonl),
            "features_dir": str(self.features_dir),
        }
        write_text_atomic(self.cfg.save_path / "extract_report.json", json.dumps(report, indent=2) + "\n")
        shutil.rmtree(self.parts, ignore_errors=True)
        return report


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    ranks = dist.env_ranks()
    log0(ranks.rank, "Starting feature extraction process")
    try:
        cfg = ExtractConfig.load(args.mm_data, args.mm_model, args.mm_tool)
        device = pick_device(args.device, ranks.local_rank)
        gbs = args.global_batch_size or args.micro_batch_size * ranks.world_size
        dist.check_layout(
            ranks.world_size,
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.context_parallel_size,
            args.micro_batch_size,
            gbs,
        )
        info = dist.init_distributed(device)
        try:
            return _extract(cfg, args, device.torch_device, info, started)
        finally:
            dist.destroy()
    except RuntimeFailure as exc:
        log0(ranks.rank, f"Feature extraction failed: {exc.message}")
        raise
    except Exception as exc:
        log0(ranks.rank, f"Feature extraction failed: {exc}")
        raise


def _extract(
    cfg: ExtractConfig, args: argparse.Namespace, device: torch.device, info: dist.DistInfo, started: float
) -> int:
    extractor = Extractor(cfg, args, device, info)
    extractor.prepare()
    log0(info.rank, f"Starting feature extraction. Total samples: {len(cfg.samples)}")
    extractor.run()
    extractor.wait_for_ranks()
    if info.rank != 0:
        return 0
    now = time.monotonic()
    report = extractor.merge(now - started, now - extractor.progress.start)
    usable = report["extracted"] + report["skipped_existing"]
    failed = report["failed"]
    report_path = cfg.save_path / "extract_report.json"
    if usable == 0:
        first = failed[0]
        raise RuntimeFailure(
            f"no clip could be extracted: all {len(failed)} failed (first: {first['path']}: {first['reason']})",
            file=str(report_path),
            fix="check the dataset paths in data.txt / the annotation json and the videos listed in the report",
        )
    if failed:
        print(
            f"warning: {len(failed)} of {report['total']} samples failed and were left out of data.jsonl "
            f"(listed in {report_path})",
            flush=True,
        )
    print(
        f"extracted {report['extracted']}, kept {report['skipped_existing']} existing, "
        f"failed {len(failed)} in {report['seconds']:.1f} s",
        flush=True,
    )
    print("Feature extraction completed successfully", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)

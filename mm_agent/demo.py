"""`run_demo`: the whole pipeline, end to end, on synthetic data, through the functions the MCP tools call.

The demo is the proof that the pieces fit: it makes a small video-caption dataset (real mp4 clips of moving
shapes) and tiny Wan2.1-style weights, then drives route -> render (bundled runtime) -> validate -> convert
`hf_to_mm` -> extract features -> train -> sample -> diagnose exactly as an assistant would, with the same
request models and the same job manager (real torchrun processes). Nothing is faked: a stage passes only
when its real output is there, and the run passes only when the training loss fell.

Every run gets its own `run-<time>` folder inside the demo directory, so a second run never deletes or
overwrites the first, and a directory that holds anything else is refused: the demo never touches files
it did not create. The loss comparison is smoothed (mean of the first tenth of the logged losses, at
least `LOSS_WINDOW` of them, against the mean of the last tenth) because a flow-matching loss of a single
step jumps with its sampled timestep.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.convert import ConvertReport, ConvertRequest, convert_weights, final_report
from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.errors import MMAgentError
from mm_agent.jobs import JobStatus, StageRequest, start_stage, stop_job, wait_job
from mm_agent.render import RenderRequest, RenderResult, render_job
from mm_agent.route import RouteCandidate, RouteRequest, route_model
from mm_agent.runs import RunStatus, wait_run, write_json_atomic
from mm_agent.validate import ValidateRequest, validate_configs

MARKER = ".mm-agent-demo.json"
MARKER_FORMAT = "mm-agent-demo/1"
REPORT = "demo_report.json"
SYNTH_LOG = "synth.log"
REQUEST_TEXT = "fine-tune Wan2.1 text-to-video on my videos"
LOSS_WINDOW = 3  # the smoothing window's minimum; it grows to a tenth of the logged losses
FRAMES, HEIGHT, WIDTH = 17, 64, 64
STAGE_TIMEOUT_S = 900.0
POLL_S = 0.3
# The job manager takes the job's MASTER_PORT when it is free, else the next free one. The demo starts
# its search at a random port away from the stock 6000, which a real job on this host may be about to bind.
DEMO_PORTS = (20000, 40000)
FULL_ITERS = 10  # iterations of the full fine-tune a LoRA demo measures beside its adapter
# runtime.train's lines: PEFT's trainable-parameter summary (LoRA runs) and the peak memory at the end
TRAINABLE_LINE = re.compile(
    r"trainable params: (?P<trainable>[\d,]+) \|\| all params: (?P<total>[\d,]+) \|\| trainable%: (?P<share>[\d.]+)"
)
PEAK_LINE = re.compile(r"peak memory: (?P<mb>[\d.]+) MiB \((?P<what>[^,)]+)")
RUNTIME_MODULES = ("torch", "diffusers", "transformers", "decord", "av", "tokenizers", "matplotlib")
RUNTIME_FIX = 'install the runtime extra: .venv/bin/pip install -c constraints.txt -e ".[runtime]"'

StageName = Literal[
    "dataset",
    "weights",
    "route",
    "render",
    "validate",
    "convert",
    "extract",
    "train",
    "sample",
    "diagnose",
    "baseline",
    "evaluate",
    "export",
    "answer",  # demo --vlm (mm_agent/demo_vlm.py)
    "scaffold",  # demo --new-model (mm_agent/demo_newmodel.py)
]
# the Wan demo's stages, in the order they run (demo --vlm: demo_vlm.VLM_STAGES)
STAGES: tuple[StageName, ...] = get_args(StageName)[:10]


class DemoRequest(BaseModel):
    """What to run; the defaults finish in under 3 minutes on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field(default="mm-agent-demo", description="demo directory (created; each run in a subfolder)")
    clips: int = Field(default=8, ge=2, le=512, description="synthetic video clips")
    iters: int = Field(default=100, ge=2 * LOSS_WINDOW, le=100_000, description="training iterations")
    nproc: int = Field(default=2, ge=1, le=16, description="processes for extraction and training")
    device: Literal["auto", "npu", "cuda", "cpu"] = Field(
        default="auto", description="runtime device (auto: NPU, then CUDA, then CPU)"
    )
    lr: float = Field(default=5e-3, gt=0, description="learning rate (high: the tiny model must learn fast)")
    seed: int = Field(default=0, ge=0)
    request: str = Field(default=REQUEST_TEXT, description="the free-text request routed to a model")
    lora: bool = Field(
        default=False,
        description="train a LoRA adapter on the frozen base (task lora), and a short full fine-tune beside it "
        "for the memory comparison",
    )
    vlm: bool = Field(
        default=False,
        description="rehearse Qwen2.5-VL fine-tuning instead (images + questions; clips = training images; "
        "unset clips/iters/lr/request take demo_vlm.VLM_DEFAULTS)",
    )
    new_model: bool = Field(
        default=False,
        description="rehearse MindSpeed-MM's new-model flow instead: scaffold a tiny DiT of your own "
        "(mm-agent new-model) and train it with the bundled runtime (unset fields take "
        "demo_newmodel.NEW_MODEL_DEFAULTS)",
    )


class StageResult(BaseModel):
    name: StageName
    seconds: float
    ok: bool
    detail: str


class DemoArtifacts(BaseModel):
    """Where every output of the run is; None for what a failed run did not get to."""

    dataset: str | None = Field(default=None, description="raw dataset index (data.json next to videos/)")
    weights: str | None = Field(default=None, description="tiny Wan2.1 weights, diffusers layout")
    job: str | None = Field(default=None, description="rendered job directory")
    converted: str | None = Field(default=None, description="hf_to_mm checkpoint (MindSpeed-MM layout)")
    features: str | None = Field(default=None, description="feature dir (data.jsonl + features/*.pt)")
    checkpoint: str | None = Field(default=None, description="last saved training checkpoint (iter_*)")
    loss_curve: str | None = None
    tensorboard: str | None = None
    sample: str | None = Field(default=None, description="generated mp4")
    exported: str | None = Field(
        default=None, description="--vlm: the trained model in the Hugging Face layout"
    )
    evaluation: str | None = Field(default=None, description="--vlm: held-out answers after training (JSON)")
    code: str | None = Field(
        default=None, description="--new-model: the scaffolded files (an overlay of a MindSpeed-MM checkout)"
    )
    extract_log: str | None = None
    train_log: str | None = None
    sample_log: str | None = None
    report: str | None = Field(default=None, description="this report as JSON")


class LoraFigures(BaseModel):
    """A LoRA demo's adapter against a full fine-tune of the same job (a few iterations, same data)."""

    trainable_params: int
    total_params: int
    trainable_share: float = Field(description="percent of the parameters the adapter trains")
    peak_mb: float | None = Field(
        description="peak memory of a LoRA training rank (device, or host RSS on CPU)"
    )
    full_peak_mb: float | None = Field(description="the same for the full fine-tune")
    step_ms: float | None = None
    full_step_ms: float | None = None
    full_iters: int = Field(description="iterations of the full fine-tune measured")
    memory: str = Field(description="what peak_mb measures: device memory or host RSS")


class DemoReport(BaseModel):
    ok: bool = Field(description="every stage passed and the smoothed loss fell")
    run_dir: str
    loss_first: float | None = Field(
        default=None, description="mean of the first `loss_window` logged losses"
    )
    loss_last: float | None = Field(default=None, description="mean of the last `loss_window` logged losses")
    loss_window: int | None = Field(
        default=None, description=f"losses averaged at each end: a tenth of them, at least {LOSS_WINDOW}"
    )
    losses: list[float] = Field(default_factory=list, description="every logged training loss, in order")
    seconds: float
    stages: list[StageResult]
    artifacts: DemoArtifacts
    root_cause: str | None = Field(default=None, description="diagnosis of the failed stage's log")
    lora: LoraFigures | None = Field(
        default=None, description="with --lora: the adapter against full fine-tuning"
    )
    accuracy_before: float | None = Field(
        default=None, description="--vlm: held-out exact-match accuracy of the untrained model"
    )
    accuracy_after: float | None = Field(default=None, description="--vlm: the same after training")
    accuracy_prior: float | None = Field(
        default=None,
        description="--vlm: answering each question with its commonest training answer (the bar)",
    )
    heldout: int | None = Field(default=None, description="--vlm: held-out questions asked")
    message: str


class StageEvent(BaseModel):
    """Progress of one stage, for a live display; `done`/`total` are set while a stage counts something."""

    stage: StageName
    state: Literal["start", "progress", "done", "failed"]
    detail: str = ""
    done: int | None = None
    total: int | None = None


OnEvent = Callable[[StageEvent], None]


@contextlib.contextmanager
def held_interrupt() -> Iterator[list[int]]:
    """Hold Ctrl-C while a background run is being started, so it never runs on without its id.

    The yielded list is non-empty when Ctrl-C came meanwhile: the caller stops the run it got, then
    raises KeyboardInterrupt. Only the main thread can install signal handlers; elsewhere nothing is held.
    """
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


class StageFailed(Exception):
    """A stage ran but its result is wrong; `root_cause` carries a diagnosis when there is one."""

    def __init__(self, detail: str, root_cause: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.root_cause = root_cause


# ------------------------------------------------------------------------------------------ directories


def _marker_ok(path: Path) -> bool:
    try:
        data = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == MARKER_FORMAT


def prepare_run_dir(demo_dir: Path) -> Path:
    """Create (or reuse, if it is a demo directory) `demo_dir` and a fresh `run-<time>` folder in it."""
    if demo_dir.exists() and not demo_dir.is_dir():
        raise MMAgentError(
            "the demo directory exists and is not a directory",
            file=str(demo_dir),
            field="--dir",
            fix="pass a new or empty directory with --dir",
        )
    if demo_dir.is_dir() and any(demo_dir.iterdir()) and not _marker_ok(demo_dir):
        raise MMAgentError(
            "the directory is not empty and is not an mm-agent demo directory",
            file=str(demo_dir),
            field="--dir",
            fix="pass a new or empty directory with --dir (the demo never writes into folders it did not create)",
        )
    demo_dir.mkdir(parents=True, exist_ok=True)
    if not _marker_ok(demo_dir):
        write_json_atomic(demo_dir / MARKER, {"format": MARKER_FORMAT, "created": _now()})
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        run_dir = demo_dir / (f"run-{stamp}" if n == 0 else f"run-{stamp}-{n}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        return run_dir
    raise MMAgentError(
        "could not create a new run folder",
        file=str(demo_dir),
        fix="remove old run-* folders you no longer need",
    )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def require_runtime(modules: tuple[str, ...] = RUNTIME_MODULES) -> None:
    """The demo runs the bundled runtime; say what to install before anything is created."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MMAgentError(
            f"the demo needs the runtime packages; missing: {', '.join(missing)}", fix=RUNTIME_FIX
        )


# ---------------------------------------------------------------------------------------------- losses

_ITERATION = re.compile(r" iteration +(\d+)/ *\d+ *\|.*?\| loss: *([-+0-9.eE]+|nan|inf) *\|")


def logged_losses(log: Path) -> list[float]:
    """Every `iteration N/T | ... | loss: x |` line (reference §5.6) in order; a re-logged iteration counts once."""
    by_iter: dict[int, float] = {}
    with log.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = _ITERATION.search(line)
            if m:
                by_iter[int(m.group(1))] = float(m.group(2))
    return [by_iter[i] for i in sorted(by_iter)]


def loss_window(count: int) -> int | None:
    """How many losses are averaged at each end: a tenth of them, at least LOSS_WINDOW (None: too few)."""
    return max(LOSS_WINDOW, count // 10) if count >= 2 * LOSS_WINDOW else None


def smoothed(losses: list[float]) -> tuple[float | None, float | None]:
    """(mean of the first window, mean of the last window) of the logged losses."""
    window = loss_window(len(losses))
    if window is None:
        return None, None
    return sum(losses[:window]) / window, sum(losses[-window:]) / window


# ---------------------------------------------------------------------------------------------- the run


class DemoRun:
    """One demo run: the stages in order, each timed and reported; the first failure stops the run."""

    def __init__(self, req: DemoRequest, run_dir: Path, on_event: OnEvent | None) -> None:
        self.req = req
        self.run = run_dir
        self.emit: OnEvent = on_event or (lambda event: None)
        self.stages: list[StageResult] = []
        self.art = DemoArtifacts(report=str(run_dir / REPORT))
        self.losses: list[float] = []
        self.root_cause: str | None = None
        self.candidate: RouteCandidate | None = None
        self.text_len = 0  # set by weights()
        self.lora: LoraFigures | None = None  # set by train() with --lora
        self.train_ms: float | None = None

    # -- stage plumbing

    def stage(self, name: StageName, body: Callable[[], str]) -> None:
        self.emit(StageEvent(stage=name, state="start"))
        start = time.monotonic()
        try:
            detail = body()
        except (MMAgentError, StageFailed) as exc:
            detail = exc.detail if isinstance(exc, StageFailed) else exc.render()
            if isinstance(exc, StageFailed) and exc.root_cause:
                self.root_cause = exc.root_cause
            self.stages.append(
                StageResult(name=name, seconds=time.monotonic() - start, ok=False, detail=detail)
            )
            self.emit(StageEvent(stage=name, state="failed", detail=detail))
            raise
        self.stages.append(StageResult(name=name, seconds=time.monotonic() - start, ok=True, detail=detail))
        self.emit(StageEvent(stage=name, state="done", detail=detail))

    def progress(
        self, name: StageName, detail: str, done: int | None = None, total: int | None = None
    ) -> None:
        self.emit(StageEvent(stage=name, state="progress", detail=detail, done=done, total=total))

    # -- stages

    def dataset(self) -> str:
        out = self.run / "dataset"
        size = ["--frames", str(FRAMES), "--height", str(HEIGHT), "--width", str(WIDTH)]
        self._synth(
            [
                "dataset",
                str(out),
                "--count",
                str(self.req.clips),
                *size,
                "--seed",
                str(self.req.seed),
                "--sidecars",
            ]
        )
        # the index is built as a user's would be: prepare_dataset probes the clips and writes data.json
        prepared = prepare_dataset(
            DatasetRequest(
                dir=str(out),
                model="wan2.1",
                task="t2v",
                runtime="bundled",
                num_frames=FRAMES,
                max_height=HEIGHT,
                max_width=WIDTH,
                confirm=True,
            )
        )
        if prepared.accepted != self.req.clips:
            bad = "; ".join(f"{r.path}: {r.reason}" for r in prepared.rejected[:3])
            raise MMAgentError(
                f"prepare_dataset accepted {prepared.accepted} of {self.req.clips} synthetic clips ({bad})",
                fix="report this: the synthetic clips should all pass",
            )
        index = out / "data.json"
        self.art.dataset = str(index)
        caps = {r["cap"] for r in json.loads(index.read_text(encoding="utf-8"))}
        return (
            f"{self.req.clips} mp4 clips ({FRAMES} frames, {WIDTH}x{HEIGHT}), {len(caps)} distinct captions, "
            f"indexed by prepare_dataset"
        )

    def weights(self) -> str:
        out = self.run / "weights"
        self._synth(["weights", str(out), "--seed", str(self.req.seed)])
        self.art.weights = str(out)
        cfg = json.loads((out / "transformer" / "config.json").read_text(encoding="utf-8"))
        tok = json.loads((out / "tokenizer" / "tokenizer_config.json").read_text(encoding="utf-8"))
        self.text_len = int(tok["model_max_length"])  # the job's text_len must match the tokenizer's
        return (
            f"tiny Wan2.1 t2v in the diffusers layout: {cfg['num_layers']} layers, "
            f"{cfg['num_attention_heads']} heads x {cfg['attention_head_dim']}, text_dim {cfg['text_dim']}"
        )

    def route(self) -> str:
        top = self._routed()
        if top.converter is None or top.converter_method is None or not top.needs_feature_extraction:
            raise StageFailed(
                f"routed to {top.model_id} {top.task}, which has no weight converter or feature extraction; "
                "the demo needs a generative model with both (e.g. Wan2.1 text-to-video)"
            )
        self.candidate = top
        return f"{top.model_id} {top.task} ({top.backend}, {top.size}); convert {top.converter}.{top.converter_method}"

    def render(self) -> str:
        c = self._candidate()
        result = self._render("job", c.task, self.req.iters, "checkpoints")
        self.art.job = result.job_dir
        what = "a LoRA adapter" if self.req.lora else "the whole model"
        return (
            f"{len(result.files)} files in {result.job_dir} (runtime bundled, {self.req.nproc} processes, "
            f"trains {what})"
        )

    def _render(self, name: str, task: str, iters: int, save: str) -> RenderResult:
        c = self._candidate()
        return render_job(
            RenderRequest(
                model=c.model_id,
                task=task,  # type: ignore[arg-type]  # a registry task id
                size=c.size,
                runtime="bundled",
                out_dir=str(self.run / name),
                weights_dir=str(self.run / "weights"),
                load_path=str(self.run / "converted"),
                dataset_dir=str(self.run / "dataset"),
                dataset_file=str(self.run / "dataset" / "data.json"),
                save_path=str(self.run / save),
                npus_per_node=self.req.nproc,
                nnodes=1,
                master_port=random.randrange(*DEMO_PORTS),
                tp=1,
                pp=1,
                cp=1,
                grad_acc=1,
                train_iters=iters,
                save_interval=max(1, iters // 2),
                lr=self.req.lr,
                num_workers=0,
                seed=self.req.seed,
                device=None if self.req.device == "auto" else self.req.device,
                confirm=True,
                **self._job_fields(),
            )
        )

    def _job_fields(self) -> dict[str, Any]:
        """The render fields of this demo's model: a Wan job's clip shape and feature folder, one sample a step."""
        c = self._candidate()
        return {
            "backend": c.backend,
            "feature_dir": str(self.run / "sora_features"),
            "mbs": 1,
            "num_frames": FRAMES,
            "max_height": HEIGHT,
            "max_width": WIDTH,
            "text_len": self.text_len,
        }

    def validate(self) -> str:
        report = validate_configs(ValidateRequest(paths=[str(self.run / "job")]))
        if report.error_count:
            first = "; ".join(
                f"{Path(f.file).name}: {f.message}" for f in report.findings if f.severity == "error"
            )
            raise StageFailed(f"{report.error_count} error(s): {first}")
        rules = Counter(f.rule for f in report.findings if f.severity == "warning")
        # path.missing here is expected: convert, extract and train create those paths later
        shown = f" ({', '.join(f'{rule} x{n}' for rule, n in sorted(rules.items()))})" if rules else ""
        return f"0 errors, {report.warning_count} warning(s){shown} over {len(report.files)} files"

    def convert(self) -> str:
        c = self._candidate()
        assert c.converter is not None and c.converter_method is not None  # checked by route()
        request = ConvertRequest(
            converter=c.converter,
            method=c.converter_method,
            source=str(self.run / "weights" / "transformer"),
            target=str(self.run / "converted"),
            confirm=True,
        )
        report, run_id = self._run_convert(request, "convert", "conversion")
        self.art.converted = str(self.run / "converted")
        layout = ", ".join(f.path for f in report.files)
        return f"{report.keys_converted} keys -> {layout} (run {run_id})"

    def extract(self) -> str:
        status = self._job("extract", self.req.nproc)
        self.art.extract_log = status.log
        features = self.run / "sora_features"
        index = features / "data.jsonl"
        lines = index.read_text(encoding="utf-8").splitlines() if index.is_file() else []
        files = list((features / "features").glob("*.pt"))
        if len(lines) != self.req.clips or len(files) != self.req.clips:
            raise StageFailed(
                f"expected {self.req.clips} features, found {len(lines)} in data.jsonl and {len(files)} .pt files"
            )
        self.art.features = str(features)
        return f"{len(files)}/{self.req.clips} clips -> {features} ({self.req.nproc} processes)"

    def _train(self) -> str:
        status = self._job("train", self.req.nproc)
        self.art.train_log = status.log
        self.losses = logged_losses(Path(status.log))
        if len(self.losses) < 2 * LOSS_WINDOW:
            raise StageFailed(f"only {len(self.losses)} loss lines in {status.log}")
        save = self.run / "checkpoints"
        tracker = save / "latest_checkpointed_iteration.txt"
        if not tracker.is_file():
            raise StageFailed(f"no checkpoint tracker {tracker}")
        last = tracker.read_text(encoding="utf-8").strip()
        ckpt = save / (last if last == "release" else f"iter_{int(last):07d}")
        if not ckpt.is_dir():
            raise StageFailed(f"the tracker names {ckpt.name}, which is missing")
        self.art.checkpoint = str(ckpt)
        curve, board = save / "loss_curve.png", save / "tensorboard"  # where runtime.train writes them
        if not curve.is_file():
            raise StageFailed(f"training wrote no loss curve ({curve})")
        self.art.loss_curve = str(curve)
        self.art.tensorboard = str(board) if any(board.glob("events.out.tfevents.*")) else None
        first, last_loss = smoothed(self.losses)
        step = f", step {status.step_time_ms:.0f} ms" if status.step_time_ms else ""
        self.train_ms = status.step_time_ms
        return f"{len(self.losses)} iterations, loss {first:.4f} -> {last_loss:.4f}{step}; checkpoint {ckpt.name}"

    def train(self) -> str:
        done = self._train()
        if not self.req.lora:
            return done
        assert self.art.train_log is not None  # _train() passed
        self.lora = self._full_beside(Path(self.art.train_log), self.train_ms)
        f = self.lora
        peaks = f" peak {f.peak_mb:.0f} vs {f.full_peak_mb:.0f} MiB" if f.peak_mb and f.full_peak_mb else ""
        return f"{done}; LoRA trains {f.trainable_share:.2f}% of the parameters;{peaks} ({f.memory})"

    def _full_beside(self, log: Path, step_ms: float | None) -> LoraFigures:
        """The LoRA run's figures, and a short full fine-tune of the same job (same data, the whole model)
        measured the same way: what the adapter saves."""
        text = log.read_text(encoding="utf-8", errors="replace")
        share = TRAINABLE_LINE.search(text)
        if share is None:
            raise StageFailed(f"the LoRA training log names no trainable parameters ({log})")
        iters = min(self.req.iters, FULL_ITERS)
        full = self._render("job-full", "t2v", iters, "checkpoints-full")
        status = self._job("train", self.req.nproc, job=Path(full.job_dir).name)
        full_text = Path(status.log).read_text(encoding="utf-8", errors="replace")
        peak, full_peak = PEAK_LINE.search(text), PEAK_LINE.search(full_text)
        return LoraFigures(
            trainable_params=int(share["trainable"].replace(",", "")),
            total_params=int(share["total"].replace(",", "")),
            trainable_share=float(share["share"]),
            peak_mb=float(peak["mb"]) if peak else None,
            full_peak_mb=float(full_peak["mb"]) if full_peak else None,
            step_ms=step_ms,
            full_step_ms=status.step_time_ms,
            full_iters=iters,
            memory=peak["what"] if peak else "unknown",
        )

    def sample(self) -> str:
        status = self._job("sample", None)  # inference.sh is one process
        self.art.sample_log = status.log
        saved = re.findall(
            r"saved sample to (\S+\.mp4)", Path(status.log).read_text(encoding="utf-8", errors="replace")
        )
        videos = [Path(p) for p in saved if Path(p).is_file() and Path(p).stat().st_size > 0]
        if not videos:
            raise StageFailed(f"the sample stage wrote no mp4 (log: {status.log})")
        self.art.sample = str(videos[0])
        return f"{len(videos)} mp4 sample(s): {videos[0]}"

    def diagnose(self) -> str:
        assert self.art.train_log is not None  # train() passed
        report = diagnose_errors(DiagnoseRequest(paths=[self.art.train_log]))
        if report.root_cause is not None and report.root_cause.effect == "fatal":
            raise StageFailed(f"fatal root cause: {report.root_cause.title}", report.root_cause.title)
        p = report.progress
        seen = f"{len(report.findings)} finding(s)" if report.findings else "no findings"
        return (
            f"category {report.category}, {seen}; loss trend {p.loss_trend}, "
            f"{p.checkpoints_saved} checkpoint(s) saved, {p.nan_iterations} nan iteration(s)"
        )

    # -- helpers

    def _synth(self, args: list[str]) -> None:
        """`python -m runtime.synth ...`; the libraries' own progress bars land in synth.log instead of the
        stage display."""
        self._run_module("runtime.synth", args, self.run / SYNTH_LOG, f"runtime.synth {args[0]}")

    def _run_module(self, module: str, args: list[str], log: Path, label: str) -> None:
        """`python -m <module> ARGS` in a child process (mm-agent itself never imports torch), output appended
        to `log`; a failure is the stage's, with the log's last lines."""
        with log.open("a", encoding="utf-8") as fh:
            done = subprocess.run(
                [sys.executable, "-m", module, *args], stdout=fh, stderr=subprocess.STDOUT, check=False
            )
        if done.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
            raise StageFailed(f"{label} exited {done.returncode} (log {log}): " + " | ".join(tail))

    def _routed(self) -> RouteCandidate:
        """The router's first candidate for the demo's request (a question or no candidate fails the stage)."""
        result = route_model(RouteRequest(request=self.req.request, task="lora" if self.req.lora else None))
        if result.question or not result.candidates:
            raise StageFailed(f"the router could not pick a model: {result.question or 'no candidates'}")
        return result.candidates[0]

    def _run_convert(self, request: ConvertRequest, stage: StageName, what: str) -> tuple[ConvertReport, str]:
        """Start a conversion as the MCP tool does, follow it on `stage`'s row, and return its report and run id;
        Ctrl-C stops the worker (it runs in its own session: Ctrl-C alone misses it)."""
        with held_interrupt() as interrupted:
            started = convert_weights(request)
        assert started.run_id is not None  # confirm=True starts a run
        if interrupted:
            stop_job(started.run_id, confirm=True)
            raise KeyboardInterrupt

        def update(status: RunStatus) -> None:
            p = status.progress
            self.progress(stage, p.message[:60], p.done, p.total or None)

        try:
            final = wait_run(started.run_id, update)
        except KeyboardInterrupt:
            stop_job(started.run_id, confirm=True)
            raise
        report = final_report(final, started.plan)
        if report.status not in ("converted", "unchanged"):
            raise StageFailed(f"{what} {report.status}: {report.message}")
        return report, started.run_id

    def _candidate(self) -> RouteCandidate:
        assert self.candidate is not None  # route() ran first
        return self.candidate

    def _job(
        self, name: Literal["extract", "train", "sample", "evaluate"], nproc: int | None, job: str = "job"
    ) -> JobStatus:
        """Start one stage of a rendered job with the job manager and follow it to the end."""
        with held_interrupt() as interrupted:
            launch = start_stage(
                StageRequest(job_dir=str(self.run / job), stage=name, confirm=True, nproc_per_node=nproc)
            )
        run_id = launch.run_id
        assert run_id is not None  # confirm=True starts a run
        if interrupted:
            stop_job(run_id, confirm=True)
            raise KeyboardInterrupt
        try:
            status = wait_job(run_id, STAGE_TIMEOUT_S, lambda st: self._job_progress(name, st), POLL_S)
        except KeyboardInterrupt:
            stop_job(run_id, confirm=True)
            raise
        if status.state == "running":
            stop_job(run_id, confirm=True)
            raise StageFailed(f"{name} did not finish in {STAGE_TIMEOUT_S:.0f} s; stopped (log {status.log})")
        if status.state != "succeeded":
            rc = status.root_cause
            cause = rc.title + (f"; fix: {rc.fixes[0].text}" if rc.fixes else "") if rc else None
            why = f": {cause}" if cause else f": {status.message}" if status.message else ""
            raise StageFailed(f"{name} {status.state}{why} (log {status.log})", cause)
        return status

    def _job_progress(self, name: StageName, status: JobStatus) -> None:
        if name == "extract" and status.extract_total:
            self.progress(name, "clips", status.extract_done, status.extract_total)
        elif name == "train" and status.total:
            loss = f"loss {status.last_loss:.4f}" if status.last_loss is not None else ""
            self.progress(name, loss, status.iteration, status.total)
        else:
            self.progress(name, status.state)

    # -- the whole run

    def run_stages(self, names: tuple[StageName, ...]) -> StageName | None:
        """Run the stages in order (each is the method of its name); the first that fails stops the run and
        is returned."""
        for name in names:
            try:
                self.stage(name, getattr(self, name))
            except (MMAgentError, StageFailed):
                return name
        return None

    def run_all(self) -> DemoReport:
        start = time.monotonic()
        failed = self.run_stages(STAGES)
        first, last = smoothed(self.losses)
        fell = first is not None and last is not None and last < first
        ok = failed is None and fell
        if failed is not None:
            message = f"the {failed} stage failed: {self.stages[-1].detail}"
        elif not fell:
            message = f"every stage passed but the loss did not fall ({first} -> {last})"
        else:
            window = loss_window(len(self.losses))
            message = (
                f"pipeline passed end to end; loss {first:.4f} -> {last:.4f} (mean of first/last {window})"
            )
        return self.report(start, ok, message)

    def report(self, start: float, ok: bool, message: str, **extra: Any) -> DemoReport:
        """The run's report (`extra`: the fields only a VLM run has), written atomically to the run folder."""
        first, last = smoothed(self.losses)
        report = DemoReport(
            ok=ok,
            run_dir=str(self.run),
            loss_first=first,
            loss_last=last,
            loss_window=loss_window(len(self.losses)),
            losses=self.losses,
            seconds=time.monotonic() - start,
            stages=self.stages,
            artifacts=self.art,
            root_cause=self.root_cause,
            lora=self.lora,
            message=message,
            **extra,
        )
        write_json_atomic(self.run / REPORT, report)
        return report


def run_demo(req: DemoRequest, on_event: OnEvent | None = None) -> DemoReport:
    """Run the demo in a new run folder under `req.dir`; `on_event` sees every stage start, tick and end."""
    require_runtime()
    run_dir = prepare_run_dir(Path(req.dir).expanduser().resolve())
    return DemoRun(req, run_dir, on_event).run_all()

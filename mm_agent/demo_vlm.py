"""`run_vlm_demo`: the Qwen2.5-VL fine-tuning pipeline end to end on synthetic data (`mm-agent demo --vlm`).

The VLM counterpart of `mm_agent.demo`, through the same functions the MCP tools call and the same job
manager: images of one coloured shape with questions about its colour and shape (LLaVA form), prepared
by `prepare_dataset` into MindSpeed-MM's MLLM JSON; tiny Qwen2.5-VL weights built from a config with
transformers' own class; route -> render (bundled runtime) -> validate -> convert `hf_to_mm` -> the
untrained model's held-out accuracy -> train (torchrun) -> evaluate.sh on the trained checkpoint ->
convert `mm_to_hf` (a LoRA adapter merged into its base first) -> the export loaded by transformers and
asked the held-out questions with `generate` -> diagnose. The run passes only when every stage did, the
smoothed loss fell and the held-out exact-match accuracy rose; the checkpoint read in MindSpeed-MM's
layout (evaluate.sh) and the exported Hugging Face folder must answer alike.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, get_args

from mm_agent.convert import ConvertReport, ConvertRequest
from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.demo import (
    PEAK_LINE,
    TRAINABLE_LINE,
    DemoReport,
    DemoRequest,
    DemoRun,
    LoraFigures,
    OnEvent,
    StageFailed,
    StageName,
    prepare_run_dir,
    require_runtime,
    smoothed,
)
from mm_agent.errors import MMAgentError

VLM_REQUEST = "fine-tune Qwen2.5-VL 3B on my images"
VLM_MODEL = "qwen2.5vl"
VLM_CONVERTER = "Qwen2_5_VLConverter"
# What `mm-agent demo --vlm` uses where the request leaves a field unset (the Wan defaults are DemoRequest's).
HELDOUT_IMAGES = 24  # two questions each: colour and shape
# what the VLM stages import (no diffusers, decord or PyAV: no video here)
VLM_RUNTIME_MODULES = ("torch", "transformers", "tokenizers", "peft", "PIL", "matplotlib")
GLOBAL_BATCH = 16  # samples per optimizer step, split over the processes
# Measured (runtime/synth_vlm.py's comment; `mm-agent demo --vlm`): 1,000 steps of 16 over 512 images (112 px,
# 16 image tokens) take held-out exact match from 0 to 0.65-0.75 in about a minute of training on 2 CPU cores;
# at 60-300 steps the model answers the commonest answer whatever the image.
VLM_DEFAULTS: dict[str, Any] = {"clips": 512, "iters": 1000, "lr": 2e-3, "request": VLM_REQUEST}
VLM_STAGES: tuple[StageName, ...] = (
    "dataset",
    "weights",
    "route",
    "render",
    "validate",
    "convert",
    "baseline",
    "train",
    "evaluate",
    "export",
    "answer",
    "diagnose",
)
assert set(VLM_STAGES) <= set(get_args(StageName))


def prior_accuracy(train: Path, heldout: Path) -> float:
    """Held-out exact match of a model that ignores the image: each question answered with the answer the
    training set gives it most often (the bar a model must clear to have learnt anything from the pixels)."""
    from collections import Counter

    def pairs(path: Path) -> list[tuple[str, str]]:
        rows = json.loads(path.read_text(encoding="utf-8"))
        turns = [r["conversations"] for r in rows]
        return [(t[0]["value"].replace("<image>", "").strip(), t[1]["value"].strip().lower()) for t in turns]

    counts: dict[str, Counter[str]] = {}
    for question, answer in pairs(train):
        counts.setdefault(question, Counter())[answer] += 1
    held = pairs(heldout)
    hits = sum(1 for q, a in held if q in counts and counts[q].most_common(1)[0][0] == a)
    return hits / len(held) if held else 0.0


def vlm_request(req: DemoRequest) -> DemoRequest:
    """The request with the VLM defaults in every field the caller did not set."""
    unset = {k: v for k, v in VLM_DEFAULTS.items() if k not in req.model_fields_set}
    return req.model_copy(update=unset)


class VLMDemoRun(DemoRun):
    """One `demo --vlm` run; the stage plumbing, rendering knobs and job following are the Wan demo's."""

    def __init__(self, req: DemoRequest, run_dir: Path, on_event: OnEvent | None) -> None:
        super().__init__(req, run_dir, on_event)
        self.before: dict[str, Any] | None = None
        self.after: dict[str, Any] | None = None
        self.job_eval: dict[str, Any] | None = None
        self.prior: float | None = None

    # -- stages

    def dataset(self) -> str:
        out = self.run / "dataset"
        self._synth(
            [
                "vlm-dataset", str(out), "--count", str(self.req.clips), "--heldout", str(HELDOUT_IMAGES),
                "--seed", str(self.req.seed),
            ]
        )  # fmt: skip
        prepared = prepare_dataset(
            DatasetRequest(
                dir=str(out),
                model=VLM_MODEL,
                task="lora" if self.req.lora else "sft",
                runtime="bundled",
                index=str(out / "train.json"),
                confirm=True,
            )
        )
        records = len(json.loads((out / "train.json").read_text(encoding="utf-8")))
        if prepared.accepted != records:
            bad = "; ".join(f"{r.path}: {r.reason}" for r in prepared.rejected[:3])
            raise MMAgentError(
                f"prepare_dataset accepted {prepared.accepted} of {records} synthetic records ({bad})",
                fix="report this: the synthetic records should all pass",
            )
        self.art.dataset = prepared.written
        heldout = len(json.loads((out / "heldout.json").read_text(encoding="utf-8")))
        return (
            f"{self.req.clips} training images ({records} questions) + {heldout} held-out questions, "
            f"MLLM JSON by prepare_dataset"
        )

    def weights(self) -> str:
        out = self.run / "weights"
        self._synth(["vlm-weights", str(out), "--seed", str(self.req.seed)])
        self.art.weights = str(out)
        cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
        text, vision = cfg.get("text_config") or cfg, cfg["vision_config"]
        return (
            f"tiny Qwen2.5-VL (transformers' class): LLM {text['num_hidden_layers']} layers x "
            f"{text['hidden_size']}, ViT {vision['depth']} blocks x {vision['hidden_size']}"
        )

    def route(self) -> str:
        top = self._routed()
        if top.model_id != VLM_MODEL or top.converter != VLM_CONVERTER:
            raise StageFailed(
                f"routed to {top.model_id} {top.task}; the VLM demo rehearses Qwen2.5-VL (e.g. "
                f"{VLM_REQUEST!r})"
            )
        self.candidate = top
        return f"{top.model_id} {top.task} ({top.backend}, {top.size}); convert {top.converter}.{top.converter_method}"

    def _job_fields(self) -> dict[str, Any]:
        """The held-out questions evaluate.sh scores; GLOBAL_BATCH samples a step over the processes."""
        data = self.run / "dataset"
        return {"eval_dataset": str(data / "heldout.json"), "mbs": max(1, GLOBAL_BATCH // self.req.nproc)}

    def render(self) -> str:
        c = self._candidate()
        result = self._render("job", c.task, self.req.iters, "checkpoints")
        self.art.job = result.job_dir
        what = "a LoRA adapter" if self.req.lora else "the LLM (ViT and projector frozen, as model.json says)"
        return f"{len(result.files)} files in {result.job_dir} (runtime bundled, {self.req.nproc} processes, trains {what})"

    def convert(self) -> str:
        report = self._convert("hf_to_mm", self.run / "weights", self.run / "converted", None)
        self.art.converted = str(self.run / "converted")
        return f"{report.keys_converted} keys -> {', '.join(f.path for f in report.files)}"

    def baseline(self) -> str:
        self.before = self._answer(self.run / "weights", "before.json")
        self.prior = prior_accuracy(
            self.run / "dataset" / "train.json", self.run / "dataset" / "heldout.json"
        )
        return (
            f"untrained model: {self._accuracy(self.before)} on held-out questions; answering each question with "
            f"its commonest training answer scores {100 * self.prior:.0f}%"
        )

    def train(self) -> str:
        done = self._train()
        if self.req.lora:
            self.lora = self._lora_figures(Path(str(self.art.train_log)))
            done += f"; LoRA trains {self.lora.trainable_share:.2f}% of the parameters"
        return done

    def evaluate(self) -> str:
        status = self._job("evaluate", None)
        self.job_eval = self._read(self.run / "job" / "evaluation" / "accuracy.json")
        return f"evaluate.sh (MindSpeed-MM checkpoint read in memory): {self._accuracy(self.job_eval)} (log {status.log})"

    def export(self) -> str:
        assert self.art.checkpoint is not None  # train() passed
        source = Path(self.art.checkpoint).parent  # the --save dir: its tracker names the last iteration
        merged = ""
        if self.req.lora:
            merged_dir = self.run / "merged"
            self._python(
                "runtime.vlm_merge",
                [
                    "--model", str(self.run / "weights"), "--base", str(self.run / "converted"),
                    "--lora", str(source), "--out", str(merged_dir),
                ],
            )  # fmt: skip
            source, merged = merged_dir, "adapter merged into its base, then "
        report = self._convert("mm_to_hf", source, self.run / "exported", self.run / "weights")
        self.art.exported = str(self.run / "exported")
        return f"{merged}{report.keys_converted} tensors -> {self.run / 'exported'} (Hugging Face layout)"

    def answer(self) -> str:
        self.after = self._answer(self.run / "exported", "after.json")
        self.art.evaluation = str(self.run / "evaluation" / "after.json")
        job = self.job_eval["accuracy"] if self.job_eval else None
        if self.job_eval is not None and job != self.after["accuracy"]:
            raise StageFailed(
                f"the export answers {self._accuracy(self.after)} but the trained checkpoint answered "
                f"{self._accuracy(self.job_eval)}: the conversion changed the model"
            )
        return f"exported model loaded by transformers: {self._accuracy(self.after)} (same as evaluate.sh)"

    # -- helpers

    def _convert(self, method: str, source: Path, target: Path, hf_dir: Path | None) -> ConvertReport:
        request = ConvertRequest(
            converter=VLM_CONVERTER,
            method=method,
            source=str(source),
            target=str(target),
            hf_dir=str(hf_dir) if hf_dir else None,
            confirm=True,
        )
        return self._run_convert(request, "convert" if method == "hf_to_mm" else "export", method)[0]

    def _answer(self, model: Path, name: str) -> dict[str, Any]:
        out = self.run / "evaluation" / name
        self._python(
            "runtime.vlm_infer",
            [
                "--model", str(model), "--data", str(self.run / "dataset" / "heldout.json"), "--out", str(out),
                *(["--device", self.req.device] if self.req.device != "auto" else []),
            ],
        )  # fmt: skip
        return self._read(out)

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StageFailed(f"no answers report {path}: {exc}") from exc
        if not isinstance(data, dict) or "accuracy" not in data:
            raise StageFailed(f"{path} holds no accuracy")
        return data

    @staticmethod
    def _accuracy(report: dict[str, Any]) -> str:
        return f"{report['correct']}/{report['total']} exact ({100 * report['accuracy']:.0f}%)"

    def _python(self, module: str, args: list[str]) -> None:
        self._run_module(module, args, self.run / f"{module.rsplit('.', 1)[-1]}.log", module)

    def _lora_figures(self, log: Path) -> LoraFigures:
        text = log.read_text(encoding="utf-8", errors="replace")
        share, peak = TRAINABLE_LINE.search(text), PEAK_LINE.search(text)
        if share is None:
            raise StageFailed(f"the LoRA training log names no trainable parameters ({log})")
        return LoraFigures(
            trainable_params=int(share["trainable"].replace(",", "")),
            total_params=int(share["total"].replace(",", "")),
            trainable_share=float(share["share"]),
            peak_mb=float(peak["mb"]) if peak else None,
            full_peak_mb=None,
            step_ms=None,
            full_step_ms=None,
            full_iters=0,
            memory=peak["what"] if peak else "unknown",
        )

    # -- the whole run

    def run_all(self) -> DemoReport:
        start = time.monotonic()
        failed = self.run_stages(VLM_STAGES)
        first, last = smoothed(self.losses)
        fell = first is not None and last is not None and last < first
        before = self.before["accuracy"] if self.before else None
        after = self.after["accuracy"] if self.after else None
        # learnt from the images: above both the untrained model and the commonest answer per question
        rose = before is not None and after is not None and after > max(before, self.prior or 0.0)
        ok = failed is None and fell and rose
        if failed is not None:
            message = f"the {failed} stage failed: {self.stages[-1].detail}"
        elif not fell:
            message = f"every stage passed but the loss did not fall ({first} -> {last})"
        elif not rose:
            message = (
                f"every stage passed but held-out accuracy ({before} -> {after}) did not beat answering the "
                f"commonest training answer ({self.prior}): the model did not learn from the images"
            )
        else:
            message = (
                f"VLM pipeline passed end to end; loss {first:.4f} -> {last:.4f}, held-out exact match "
                f"{100 * (before or 0):.0f}% -> {100 * (after or 0):.0f}% (commonest answer: "
                f"{100 * (self.prior or 0):.0f}%)"
            )
        return self.report(
            start,
            ok,
            message,
            accuracy_before=before,
            accuracy_after=after,
            accuracy_prior=self.prior,
            heldout=int(self.after["total"]) if self.after else None,
        )


def run_vlm_demo(req: DemoRequest, on_event: OnEvent | None = None) -> DemoReport:
    """`demo --vlm`: a new run folder under `req.dir`; `on_event` sees every stage start, tick and end."""
    require_runtime(VLM_RUNTIME_MODULES)
    req = vlm_request(req)
    run_dir = prepare_run_dir(Path(req.dir).expanduser().resolve())
    return VLMDemoRun(req, run_dir, on_event).run_all()

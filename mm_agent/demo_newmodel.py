"""`mm-agent demo --new-model`: MindSpeed-MM's new-model flow rehearsed on this machine.

Synthetic clips and a tiny Wan2.1 (its VAE and UMT5 are the new model's encoders) -> `scaffold_model` writes a
tiny DiT of the user's own with every file of the guide (docs/zh/pytorch/new_model_development.md) into an
overlay folder and registers the model in the run's workspace -> `route_model` finds it by name -> `render_job`
(bundled runtime) -> `validate_configs` -> training of the scaffolded DiT file itself (`runtime.user_train`,
FSDP2 over `--nproc` processes, online encoding) -> a sample mp4 from its checkpoint (`runtime.sample`) ->
`diagnose_errors` on the log. ok only if every stage passed and the smoothed loss fell.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mm_agent.demo import (
    DemoReport,
    DemoRequest,
    DemoRun,
    OnEvent,
    StageFailed,
    StageName,
    prepare_run_dir,
    require_runtime,
    smoothed,
)
from mm_agent.registry import user_models_dir
from mm_agent.scaffold import ScaffoldRequest, scaffold_model
from mm_agent.workspace import set_workspace

NEW_MODEL_NAME = "tiny_video"
# what the new model's request says; routes to the scaffolded model by its name
NEW_MODEL_REQUEST = f"train my own model {NEW_MODEL_NAME} on my videos"
# Measured with `mm-agent demo --new-model` (closing note of issue 28): the scaffolded DiT at the tiny Wan's
# width learns the synthetic clips at this rate within 60 steps.
NEW_MODEL_DEFAULTS: dict[str, Any] = {"iters": 60, "lr": 5e-3, "request": NEW_MODEL_REQUEST}
NEW_MODEL_STAGES: tuple[StageName, ...] = (
    "dataset",
    "weights",
    "scaffold",
    "route",
    "render",
    "validate",
    "train",
    "sample",
    "diagnose",
)


def new_model_request(req: DemoRequest) -> DemoRequest:
    """The request with the new-model defaults in every field the caller did not set."""
    unset = {k: v for k, v in NEW_MODEL_DEFAULTS.items() if k not in req.model_fields_set}
    return req.model_copy(update=unset)


class NewModelDemoRun(DemoRun):
    """One `demo --new-model` run; dataset, weights, render, validate, train, sample and diagnose are the Wan
    demo's stages, run on the scaffolded model."""

    def scaffold(self) -> str:
        cfg = json.loads((self.run / "weights" / "transformer" / "config.json").read_text(encoding="utf-8"))
        result = scaffold_model(
            ScaffoldRequest(
                name=NEW_MODEL_NAME,
                base="wan2.1",
                layers=int(cfg["num_layers"]),
                heads=int(cfg["num_attention_heads"]),
                head_dim=int(cfg["attention_head_dim"]),
                ffn_dim=int(cfg["ffn_dim"]),
                freq_dim=int(cfg["freq_dim"]),
                text_dim=int(cfg["text_dim"]),  # the tiny UMT5's width
                npus_per_node=self.req.nproc,
                out=str(self.run / "code"),
                confirm=True,
            )
        )
        if result.status != "written":
            raise StageFailed(f"scaffold_model answered {result.status}, not written")
        self.art.code = result.root
        arch = result.arch
        return (
            f"{result.cls} ({arch['num_layers']} blocks, {arch['num_heads']}x{arch['head_dim']}, FFN "
            f"{arch['ffn_dim']}): {len(result.files)} files in {result.root}; registry entry {result.registry_file}"
        )

    def route(self) -> str:
        top = self._routed()
        if top.model_id != NEW_MODEL_NAME:
            raise StageFailed(f"routed to {top.model_id}, not the scaffolded {NEW_MODEL_NAME}")
        self.candidate = top
        return (
            f"{top.model_id} {top.task} ({top.backend}, MindSpeed-MM {top.mm_version}) via {top.entry_script}"
        )

    def render(self) -> str:
        result = self._render("job", self._candidate().task, self.req.iters, "checkpoints")
        self.art.job = result.job_dir
        return f"{len(result.files)} files in {result.job_dir} (runtime bundled, {self.req.nproc} processes)"

    def run_all(self) -> DemoReport:
        start = time.monotonic()
        set_workspace(self.run)  # the scaffold's registry entry lives in the run folder
        try:
            failed = self.run_stages(NEW_MODEL_STAGES)
        finally:
            set_workspace(None)
        first, last = smoothed(self.losses)
        fell = first is not None and last is not None and last < first
        if failed is not None:
            message = f"the {failed} stage failed: {self.stages[-1].detail}"
        elif not fell:
            message = f"every stage passed but the loss did not fall ({first} -> {last})"
        else:
            message = (
                f"your scaffolded DiT trained end to end; loss {first:.4f} -> {last:.4f}; its files: "
                f"{self.art.code} (registry entry {user_models_dir(self.run) / (NEW_MODEL_NAME + '.yaml')})"
            )
        return self.report(start, failed is None and fell, message)


def run_new_model_demo(req: DemoRequest, on_event: OnEvent | None = None) -> DemoReport:
    """`demo --new-model`: a new run folder under `req.dir`; `on_event` sees every stage start, tick and end."""
    require_runtime()
    req = new_model_request(req)
    run_dir = prepare_run_dir(Path(req.dir).expanduser().resolve())
    return NewModelDemoRun(req, run_dir, on_event).run_all()
